#!/bin/sh
# test_wheel.sh SOURCE_DIR DLSHARED DLSHARECTL PYTHON
#
# pip install from the checkout, as a Python user does (pyproject.toml):
# a fresh venv of PYTHON, `pip install SOURCE_DIR` (scikit-build-core from
# PyPI drives the project's CMake), then the venv's python imports dlshare
# from the venv, with the libdlshare bundled in the wheel (not the build
# tree's, not a system one), and round-trips a tensor through a dlshared of
# the build tree. Skips (77) when PyPI cannot be reached, or PYTHON has no
# venv module.
set -eu

src=$1 dlshared=$2 ctl=$3 python=$4
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

[ -n "${DLSHARE_TEST_WHEEL_SKIP:-}" ] && skip "$DLSHARE_TEST_WHEEL_SKIP"
"$python" -c 'import venv, ensurepip' 2>/dev/null ||
	skip "$python has no venv/ensurepip (Debian: python3-venv)"

tmp=$(mktemp -d /tmp/dlshare-wheel-XXXXXX)
daemon=
cleanup() {
	if [ -n "$daemon" ]; then
		kill -KILL "$daemon" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT
# Nothing of the build tree or the user's site may leak in.
unset PYTHONPATH PYTHONHOME LD_LIBRARY_PATH LD_PRELOAD || true
export PYTHONNOUSERSITE=1 PYTHONDONTWRITEBYTECODE=1
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

echo "== a fresh venv"
"$python" -m venv "$tmp/venv" >"$tmp/venv.log" 2>&1 ||
	{ cat "$tmp/venv.log"; fail "$python -m venv"; }
py=$tmp/venv/bin/python
echo "ok"

echo "== PyPI"
# The build backend comes from PyPI: without it there is nothing to test.
"$py" -m pip download --no-deps --dest "$tmp/probe" --timeout 20 --retries 1 \
	'scikit-build-core>=0.10' >"$tmp/probe.log" 2>&1 ||
	skip "PyPI cannot be reached for the build backend (scikit-build-core): $(tail -n 1 "$tmp/probe.log")"
echo "ok"

echo "== pip install $src"
"$py" -m pip install "$src" >"$tmp/pip.log" 2>&1 ||
	{ tail -n 60 "$tmp/pip.log"; fail "pip install"; }
echo "ok"

echo "== import and round-trip through dlshared"
sock=$tmp/dlshared.sock
"$dlshared" --config /dev/null --socket "$sock" 2>"$tmp/daemon.log" &
daemon=$!
# Serving once it answers: the socket file comes before listen().
i=0
until "$ctl" --socket "$sock" stats >/dev/null 2>&1; do
	i=$((i + 1))
	[ $i -lt 500 ] || { cat "$tmp/daemon.log"; fail "the daemon did not start"; }
	kill -0 "$daemon" 2>/dev/null || { cat "$tmp/daemon.log"; fail "the daemon died"; }
	sleep 0.02
done
cd "$tmp"
DLSHARE_SOCKET=$sock VENV=$tmp/venv "$py" - <<'PY' || fail "the venv's dlshare"
import array, os, sys
import dlshare

venv = os.path.realpath(os.environ["VENV"])
pkg = os.path.dirname(os.path.realpath(dlshare.__file__))
assert pkg.startswith(venv + os.sep), "dlshare imported from " + pkg
assert os.path.exists(os.path.join(pkg, "libdlshare.so.0")), os.listdir(pkg)
libs = {l.split()[-1] for l in open("/proc/self/maps") if "libdlshare.so" in l}
assert libs == {os.path.join(pkg, "libdlshare.so.0")}, libs
with dlshare.Client() as c:
    a = dlshare.empty((5,), "int64")
    want = [3, -1, 1 << 40, 0, 7]
    memoryview(a).cast("B").cast("q")[:] = array.array("q", want)
    c.publish("wheel/check", a, copy=True)
    t = c.get("wheel/check")
    b = dlshare.empty((5,), "int64")
    b.copy_from(t)
    got = memoryview(b).cast("B").cast("q").tolist()
    assert got == want, got
print("dlshare", dlshare.__version__, "from", pkg, "python",
      ".".join(map(str, sys.version_info[:3])))
PY
kill -TERM "$daemon"
st=0
wait "$daemon" || st=$?
daemon=
[ $st -eq 0 ] || { cat "$tmp/daemon.log"; fail "the daemon exited with $st"; }
echo "ok"
