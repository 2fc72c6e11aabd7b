#!/bin/sh
# test_seccomp.sh DLSHARED DLSHARECTL SERVICE
#
# Every system call the daemon makes while serving (traced with strace over
# a session of dlsharectl commands) must pass the SystemCallFilter= lines of
# SERVICE, as systemd-analyze syscall-filter expands their groups: a call
# outside them would kill the service in production and nowhere else.
# Exits 77 (skipped) without strace or systemd-analyze, where ptrace is not
# allowed, or for a sanitizer build (its runtime makes calls of its own).
set -eu

daemon=$1 ctl=$2 service=$3
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

[ "${DLSHARE_SANITIZE:-OFF}" = "OFF" ] || skip "sanitizer build"
command -v strace >/dev/null 2>&1 || skip "strace not found (Debian package: strace)"
command -v systemd-analyze >/dev/null 2>&1 || skip "systemd-analyze not found"
strace -qq -o /dev/null true 2>/dev/null || skip "ptrace is not allowed here"

tmp=$(mktemp -d /tmp/dlshare-seccomp-XXXXXX)
pid=
cleanup() {
	[ -z "$pid" ] || kill -KILL "$pid" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT

sock=$tmp/dlshared.sock
strace -f -qq -o "$tmp/trace" "$daemon" --config /dev/null --socket "$sock" \
	--log-level debug 2>"$tmp/log" &
pid=$!
i=0
until [ -S "$sock" ]; do
	i=$((i + 1))
	[ $i -lt 500 ] || { cat "$tmp/log"; fail "the daemon did not start"; }
	sleep 0.02
done
export DLSHARE_SOCKET=$sock
head -c 4000 /dev/urandom >"$tmp/in"
"$ctl" put t/x --dtype float32 --shape 10,100 "$tmp/in" >/dev/null
"$ctl" put t/x --dtype float32 --shape 10,100 --mode 0600 "$tmp/in" >/dev/null
"$ctl" cat t/x | cmp -s - "$tmp/in" || fail "cat"
"$ctl" cat t/x --newer-than 2 --wait 50 >/dev/null 2>&1 || true
"$ctl" ls >/dev/null
"$ctl" stat t/x >/dev/null
"$ctl" stats >/dev/null
"$ctl" rm t/x
"$ctl" cat t/missing >/dev/null 2>&1 || true
# strace passes SIGTERM on to the traced daemon only when sent to it.
dpid=$(cat "/proc/$pid/task/$pid/children" 2>/dev/null | awk '{print $1}')
[ -n "$dpid" ] || dpid=$pid
kill -TERM "$dpid"
wait "$pid" || true
pid=

grep -oE '^[0-9]+ +[a-z_0-9]+\(' "$tmp/trace" | sed 's/.* //; s/(//' |
	sort -u >"$tmp/used"
[ -s "$tmp/used" ] || fail "no system calls traced"

# Expand "@group" names recursively, as systemd-analyze lists them.
systemd-analyze syscall-filter --no-pager >"$tmp/groups" 2>/dev/null
expand() {
	for item in "$@"; do
		case $item in
		@*) expand $(awk -v g="$item" '
			/^@/ { cur = $1; next }
			cur == g && NF && $1 !~ /^#/ { print $1 }' "$tmp/groups") ;;
		*) echo "$item" ;;
		esac
	done
}
# "SystemCallFilter=@a @b" allows; "SystemCallFilter=~@c @d" then denies.
allow=$(sed -n '/^SystemCallFilter=~/d; s/^SystemCallFilter=//p' "$service")
deny=$(sed -n 's/^SystemCallFilter=~//p' "$service")
[ -n "$allow" ] || fail "no SystemCallFilter= allow list in $service"
# shellcheck disable=SC2086
expand $allow | sort -u >"$tmp/allow"
# shellcheck disable=SC2086
expand $deny | sort -u >"$tmp/deny"
# What the kernel runs before the daemon's main() (exec) is not filtered.
bad=$(grep -vxF -f "$tmp/allow" "$tmp/used" | grep -vx 'execve' | tr '\n' ' ' || true)
denied=$(grep -xF -f "$tmp/deny" "$tmp/used" | grep -vx 'execve' | tr '\n' ' ' || true)
echo "system calls: $(tr '\n' ' ' <"$tmp/used")"
[ -z "$bad" ] || fail "not in the allowed groups: $bad"
[ -z "$denied" ] || fail "in a denied group: $denied"
echo "ok: all $(wc -l <"$tmp/used") allowed by dlshared.service"
