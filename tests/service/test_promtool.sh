#!/bin/sh
# test_promtool.sh DLSHARED DLSHARECTL README
#
# Prometheus's own checks on what dlshare gives its operators:
# - `promtool check metrics` on the real output of `dlsharectl metrics`
#   from a daemon with names, a lease-free refusal and a limit hit;
# - `promtool check rules` on the alert rules of the README's "Monitoring"
#   section, and `promtool test rules`: the quota alert fires for a uid
#   at 95% of a quota, and not for one at 50%.
# Exits 77 (skipped) when promtool is missing (Debian package: prometheus);
# the metrics are then still checked by tests/python/test_metrics.py's
# parser.
set -eu
dlshared=$1 ctl=$2 readme=$3

if ! command -v promtool >/dev/null 2>&1; then
	echo "SKIPPED: promtool not found (Debian package: prometheus);" \
	     "python_venv's test_metrics parses the output instead"
	exit 77
fi
tmp=$(mktemp -d /tmp/dlshare-promtool-XXXXXX)
pid=
cleanup() {
	[ -z "$pid" ] || kill "$pid" 2>/dev/null || true
	[ -z "$pid" ] || wait "$pid" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
sock=$tmp/d.sock

echo "== promtool check metrics"
pdeath=
command -v setpriv >/dev/null 2>&1 && pdeath="setpriv --pdeathsig KILL --"
$pdeath "$dlshared" --socket "$sock" --uid-names 2 >"$tmp/log" 2>&1 &
pid=$!
i=0
until [ -S "$sock" ]; do
	i=$((i + 1))
	[ $i -lt 500 ] || { cat "$tmp/log"; fail "dlshared did not start"; }
	sleep 0.02
done
for n in a b c; do
	head -c 16 /dev/zero | "$ctl" --socket "$sock" put "m/$n" --dtype float32 \
		--shape 4 >/dev/null 2>&1 || true
done
"$ctl" --socket "$sock" cat m/missing >/dev/null 2>&1 || true
"$ctl" --socket "$sock" metrics >"$tmp/metrics.prom" || fail "dlsharectl metrics"
grep -q '^dlshare_limit_hits_total{limit="uid-names"} 1$' "$tmp/metrics.prom" ||
	{ cat "$tmp/metrics.prom"; fail "the limit hit is not in the output"; }
promtool check metrics <"$tmp/metrics.prom" >"$tmp/check" 2>&1 ||
	{ cat "$tmp/check"; fail "promtool check metrics"; }
# promtool prints lint problems and still exits 0 for some of them.
if [ -s "$tmp/check" ]; then
	cat "$tmp/check"
	fail "promtool check metrics has remarks"
fi
echo "ok ($(grep -c '^# TYPE' "$tmp/metrics.prom") families)"

echo "== promtool check rules (README, Monitoring)"
# The first yaml block after the "## Monitoring" heading.
awk '/^## Monitoring/ { m = 1 } m && /^```yaml$/ { y = 1; next }
     y && /^```$/ { exit } y { print }' "$readme" >"$tmp/rules.yml"
[ -s "$tmp/rules.yml" ] || fail "no yaml block in the README's Monitoring section"
promtool check rules "$tmp/rules.yml" || fail "promtool check rules"

echo "== promtool test rules"
cat >"$tmp/test.yml" <<'YAML'
rule_files: [rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'dlshare_uid_quota_usage_ratio{instance="n1",uid="1000",quota="uid-host-bytes"}'
        values: '0.95x10'
      - series: 'dlshare_uid_quota_usage_ratio{instance="n1",uid="1001",quota="uid-host-bytes"}'
        values: '0.5x10'
      - series: 'dlshare_up{instance="n1"}'
        values: '1x10'
    alert_rule_test:
      - eval_time: 6m
        alertname: DlshareQuotaNearlyExhausted
        exp_alerts:
          - exp_labels: {severity: warning, instance: n1, uid: "1000", quota: uid-host-bytes}
            exp_annotations:
              summary: "uid 1000 uses 95% of its uid-host-bytes quota on n1"
      - eval_time: 6m
        alertname: DlshareDown
        exp_alerts: []
YAML
(cd "$tmp" && promtool test rules test.yml) || fail "promtool test rules"
echo "ok"
