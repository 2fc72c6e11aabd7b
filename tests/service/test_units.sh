#!/bin/sh
# test_units.sh UNIT_DIR SOURCE_DIR THRESHOLD [RELAY_THRESHOLD]
#
# The systemd files, checked without systemd as PID 1:
# - systemd-analyze verify on dlshared.socket and dlshared.service (UNIT_DIR
#   holds copies whose ExecStart= names the daemon just built), and on the
#   example dlshare-metrics.timer and .service;
# - systemd-analyze security --offline=yes: the exposure score, which must
#   stay at or below THRESHOLD (tenths: 5 is "0.5"), and the settings the
#   daemon depends on (never PrivateUsers=yes, never PrivateDevices=yes);
# - the sysusers.d and tmpfiles.d files, applied to a scratch root;
# - where the build found UCX (UNIT_DIR holds dlshare-relay.service): the
#   relay's unit, verified and scored the same way against RELAY_THRESHOLD,
#   and the settings it depends on (network allowed, otherwise hardened).
# Exits 77 (skipped) when systemd-analyze is missing.
set -eu

units=$1 src=$(cd "$2" && pwd) threshold=$3 relay_threshold=${4:-}
service=$units/dlshared.service
socket=$units/dlshared.socket

if ! command -v systemd-analyze >/dev/null 2>&1; then
	echo "SKIPPED: systemd-analyze not found (Debian package: systemd);" \
	     "the unit files were not checked"
	exit 77
fi

tmp=$(mktemp -d /tmp/dlshare-units-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

echo "== systemd-analyze verify"
# --man=no: the man pages named in Documentation= are not installed here
# (test_install.sh finds them in an installed tree).
if ! systemd-analyze verify --man=no "$socket" "$service" >"$tmp/verify" 2>&1; then
	cat "$tmp/verify"
	fail "systemd-analyze verify"
fi
if grep -q "dlshared\." "$tmp/verify"; then
	cat "$tmp/verify"
	fail "systemd-analyze verify warned about the units"
fi
echo "ok"

echo "== systemd-analyze verify: the metrics timer and service"
if ! systemd-analyze verify --man=no "$units/dlshare-metrics.timer" \
		"$units/dlshare-metrics.service" >"$tmp/verify" 2>&1; then
	cat "$tmp/verify"
	fail "systemd-analyze verify dlshare-metrics"
fi
if grep -q "dlshare-metrics\." "$tmp/verify"; then
	cat "$tmp/verify"
	fail "systemd-analyze verify warned about the metrics units"
fi
grep -q "^OnUnitActiveSec=15s" "$units/dlshare-metrics.timer" ||
	fail "dlshare-metrics.timer does not run every 15 s"
grep -q "^ExecStart=.*/dlsharectl metrics --output /var/lib/node_exporter/textfile_collector/dlshare.prom\$" \
	"$units/dlshare-metrics.service" ||
	fail "dlshare-metrics.service does not write the textfile collector's file"
echo "ok"

echo "== systemd-analyze security"
systemd-analyze security --offline=yes --no-pager "$service" >"$tmp/security" 2>&1 || true
score=$(sed -n 's/.*Overall exposure level for dlshared.service: \([0-9.]*\).*/\1/p' "$tmp/security")
[ -n "$score" ] || { cat "$tmp/security"; fail "no exposure score"; }
echo "exposure $score (threshold $(echo "$threshold" | sed 's/\(.\)$/.\1/;s/^\./0./'))"
if ! systemd-analyze security --offline=yes --no-pager --threshold="$threshold" \
		"$service" >/dev/null 2>&1; then
	grep "✗" "$tmp/security" || true
	fail "exposure $score is above the recorded threshold: harden the unit," \
	     "or record the new score in tests/service/CMakeLists.txt with a reason"
fi

echo "== settings the daemon depends on"
for bad in "PrivateUsers=yes" "PrivateUsers=true" "PrivateDevices=yes" \
	   "PrivateDevices=true" "DynamicUser=yes"; do
	if grep -qi "^$bad" "$service"; then
		fail "$bad must not be set (see the comment in dlshared.service.in)"
	fi
done
for need in "Type=notify" "WatchdogSec=" "NoNewPrivileges=yes" "CapabilityBoundingSet=\$" \
	    "ProtectSystem=strict" "ProtectHome=yes" "PrivateTmp=yes" \
	    "RestrictAddressFamilies=AF_UNIX" "DevicePolicy=closed" \
	    "DeviceAllow=char-nvidia-frontend rw" "DeviceAllow=char-nvidia-uvm rw" \
	    "User=dlshare" "Group=dlshare"; do
	grep -q "^$need" "$service" || fail "dlshared.service lacks $need"
done
for need in "ListenSequentialPacket=/run/dlshare/dlshared.sock" "SocketMode=0660" \
	    "SocketGroup=dlshare"; do
	grep -q "^$need" "$socket" || fail "dlshared.socket lacks $need"
done
echo "ok"

echo "== sysusers.d"
mkdir -p "$tmp/root/etc"
systemd-sysusers --root="$tmp/root" --dry-run "$src/systemd/dlshare.sysusers" \
	>"$tmp/sysusers" 2>&1 || { cat "$tmp/sysusers"; fail "systemd-sysusers"; }
grep -q "Creating group 'dlshare'" "$tmp/sysusers" &&
	grep -q "Creating user 'dlshare'" "$tmp/sysusers" ||
	{ cat "$tmp/sysusers"; fail "sysusers.d does not make user and group dlshare"; }
echo "ok"

echo "== tmpfiles.d"
echo "dlshare:x:4242:" >"$tmp/root/etc/group"
systemd-tmpfiles --root="$tmp/root" --create "$src/systemd/dlshare.tmpfiles" \
	>"$tmp/tmpfiles" 2>&1 || { cat "$tmp/tmpfiles"; fail "systemd-tmpfiles"; }
[ "$(stat -c '%a %g' "$tmp/root/run/dlshare")" = "755 4242" ] ||
	fail "tmpfiles.d: /run/dlshare is $(stat -c '%a %g' "$tmp/root/run/dlshare")"
echo "ok"

relay=$units/dlshare-relay.service
if [ ! -f "$relay" ]; then
	echo "== dlshare-relay.service: not built here (no UCX), not checked"
	exit 0
fi
echo "== dlshare-relay.service: systemd-analyze verify"
# verify wants ExecStart='s program to exist: the relay of this build, or,
# where it is not built yet, /bin/true in its place (the unit is the same).
exe=$(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$relay")
mkdir -p "$tmp/relay"
if [ -x "$exe" ]; then
	cp "$relay" "$tmp/relay/"
else
	echo "($exe not built: verifying with /bin/true in ExecStart=)"
	sed 's|^ExecStart=[^ ]*|ExecStart=/bin/true|' "$relay" >"$tmp/relay/dlshare-relay.service"
fi
rservice=$tmp/relay/dlshare-relay.service
if ! systemd-analyze verify --man=no "$rservice" >"$tmp/rverify" 2>&1; then
	cat "$tmp/rverify"
	fail "systemd-analyze verify dlshare-relay.service"
fi
if grep -q "dlshare-relay\." "$tmp/rverify"; then
	cat "$tmp/rverify"
	fail "systemd-analyze verify warned about dlshare-relay.service"
fi
echo "ok"
echo "== dlshare-relay.service: systemd-analyze security"
systemd-analyze security --offline=yes --no-pager "$rservice" >"$tmp/rsecurity" 2>&1 || true
score=$(sed -n 's/.*Overall exposure level for dlshare-relay.service: \([0-9.]*\).*/\1/p' "$tmp/rsecurity")
[ -n "$score" ] || { cat "$tmp/rsecurity"; fail "no exposure score for the relay"; }
echo "exposure $score (threshold $(echo "$relay_threshold" | sed 's/\(.\)$/.\1/;s/^\./0./'))"
if [ -n "$relay_threshold" ] &&
   ! systemd-analyze security --offline=yes --no-pager --threshold="$relay_threshold" \
		"$rservice" >/dev/null 2>&1; then
	grep "✗" "$tmp/rsecurity" || true
	fail "relay exposure $score is above the recorded threshold: harden the" \
	     "unit, or record the new score in tests/service/CMakeLists.txt with a reason"
fi
echo "== dlshare-relay.service: what it depends on"
for bad in "PrivateNetwork=yes" "IPAddressDeny=any" "DynamicUser=yes" \
	   "PrivateUsers=yes" "MemoryDenyWriteExecute=yes"; do
	if grep -qi "^$bad" "$relay"; then
		fail "$bad must not be set (see the comment in dlshare-relay.service.in)"
	fi
done
for need in "NoNewPrivileges=yes" "CapabilityBoundingSet=\$" "ProtectSystem=strict" \
	    "ProtectHome=yes" "PrivateTmp=yes" "DevicePolicy=closed" \
	    "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX AF_NETLINK" \
	    "User=dlshare" "Group=dlshare" "LimitMEMLOCK=infinity" \
	    "LoadCredential=relay.key:/etc/dlshare/relay.key"; do
	grep -q "^$need" "$relay" || fail "dlshare-relay.service lacks $need"
done
grep -q -- "--config /etc/dlshare/relay.conf" "$relay" ||
	fail "dlshare-relay.service does not read /etc/dlshare/relay.conf"
echo "ok"
