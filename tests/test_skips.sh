#!/bin/sh
# test_skips.sh RUN_PY PYTHON TEST_SECURITY [TEST_CUDA_GPU]
#
# A skip reads as a skip: what ctest's SKIP_RETURN_CODE (77) relies on.
# tests/python/run.py exits 77 when every test of its modules skipped, 0
# when only some did, 1 when one failed; test_security's ACL group exits 77
# without root; test_cuda_gpu exits 77 without a visible device.
set -eu

run_py=$1 python=$2 security=$3 cuda_gpu=${4:-}
tmp=$(mktemp -d /tmp/dlshare-skips-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# expect STATUS CMD...: runs CMD, fails unless it exits STATUS.
expect() {
	want=$1; shift
	st=0
	"$@" >"$tmp/out" 2>&1 || st=$?
	[ "$st" -eq "$want" ] || { cat "$tmp/out"; fail "$* exited $st, want $want"; }
}

echo "== run.py"
cat >"$tmp/skips_all.py" <<'PY'
import unittest

@unittest.skip("nothing to run here")
class A(unittest.TestCase):
    def test_a(self):
        pass

class B(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        raise unittest.SkipTest("no consumer")

    def test_b(self):
        pass
PY
cat >"$tmp/skips_some.py" <<'PY'
import unittest

class A(unittest.TestCase):
    def test_runs(self):
        pass

    @unittest.skip("not here")
    def test_skips(self):
        pass
PY
cat >"$tmp/fails.py" <<'PY'
import unittest

class A(unittest.TestCase):
    def test_fails(self):
        self.fail("on purpose")

    @unittest.skip("not here")
    def test_skips(self):
        pass
PY
export PYTHONPATH="$tmp"
unset DLSHARE_TEST_PYTHON_SKIP || true
expect 77 "$python" "$run_py" "$python" skips_all
grep -q "^SKIP: " "$tmp/out" || { cat "$tmp/out"; fail "no SKIP line"; }
expect 0 "$python" "$run_py" "$python" skips_some
grep -q "skipped 'not here'" "$tmp/out" || { cat "$tmp/out"; fail "the skip is not shown"; }
expect 1 "$python" "$run_py" "$python" fails
expect 77 "$python" "$run_py" "$tmp/no-such-python" skips_some
echo "ok"

echo "== cmocka groups"
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null 2>&1; then
	# Without root the ACL group cannot run: all of it skips.
	expect 77 setpriv --reuid 65534 --regid 65534 --clear-groups \
		"$security" acl
	grep -q "SKIP: needs root" "$tmp/out" || { cat "$tmp/out"; fail "no reason given"; }
else
	echo "(not root: the ACL group's own ctest shows the skip)"
fi
if [ -n "$cuda_gpu" ]; then
	CUDA_VISIBLE_DEVICES= expect 77 "$cuda_gpu"
	grep -q "SKIP: no CUDA device" "$tmp/out" || { cat "$tmp/out"; fail "no reason given"; }
fi
echo "ok"
