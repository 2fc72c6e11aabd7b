"""Test harness for the Python binding: a real dlshared in a temporary
directory, and helpers to run Python code in other processes (and other
interpreters) against it.

Configured by environment variables that ctest sets (tests/python/
CMakeLists.txt): DLSHARED (the daemon), DLSHARE_PYTHONPATH (build/python),
DLSHARE_TEST_SYSTEM_PYTHON and DLSHARE_TEST_VENV_PYTHON (the interpreters),
DLSHARE_TEST_TIMEOUT_SCALE (scales every timeout, as in the C tests).
"""

import ctypes
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

import dlshare

DLSHARED = os.environ.get("DLSHARED", "")
PYTHONPATH = os.environ.get("DLSHARE_PYTHONPATH", "")
SYSTEM_PYTHON = os.environ.get("DLSHARE_TEST_SYSTEM_PYTHON", "/usr/bin/python3")
VENV_PYTHON = os.environ.get("DLSHARE_TEST_VENV_PYTHON", "")
HERE = os.path.dirname(os.path.abspath(__file__))
SCALE = float(os.environ.get("DLSHARE_TEST_TIMEOUT_SCALE", "1") or 1)


def timeout(seconds):
    return seconds * SCALE


def _die_with_parent():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _spawn(argv, **kw):
    """Popen whose child dies with this process (STYLE.md: PR_SET_PDEATHSIG).
    util-linux's setpriv sets it without running Python between fork and
    exec (a preexec_fn may deadlock in a process with threads, e.g. JAX's)."""
    setpriv = shutil.which("setpriv")
    if setpriv:
        argv = [setpriv, "--pdeathsig", "KILL", "--", *argv]
    else:
        kw["preexec_fn"] = _die_with_parent
    return subprocess.Popen(argv, **kw)


def wait_until(pred, seconds=5.0, step=0.01):
    """Polls pred() until it is true; returns its last value."""
    deadline = time.monotonic() + timeout(seconds)
    while True:
        v = pred()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(step)


class Daemon:
    """dlshared on a socket in a fresh temporary directory."""

    def __init__(self, *args):
        if not DLSHARED or not os.access(DLSHARED, os.X_OK):
            raise unittest.SkipTest(f"no dlshared to run (DLSHARED={DLSHARED!r})")
        self.dir = tempfile.mkdtemp(prefix="dlshare-py-")
        self.socket = os.path.join(self.dir, "d.sock")
        self.logpath = os.path.join(self.dir, "dlshared.log")
        with open(self.logpath, "w") as log:
            self.proc = _spawn(
                [DLSHARED, "--socket", self.socket, "--log-level", "debug",
                 *args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        if not wait_until(self._ready, 10):
            self.stop()
            raise RuntimeError("dlshared did not start:\n" + self.log())

    def _ready(self):
        if self.proc.poll() is not None:
            raise RuntimeError("dlshared exited:\n" + self.log())
        try:
            dlshare.Client(self.socket).close()
            return True
        except dlshare.ConnectionFailed:
            return False

    def log(self):
        try:
            with open(self.logpath) as f:
                return f.read()
        except OSError:
            return ""

    def stop(self):
        """Stops the daemon; returns its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout(10))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        rc = self.proc.returncode
        log = self.log()
        shutil.rmtree(self.dir, ignore_errors=True)
        if rc != 0:
            sys.stderr.write(f"dlshared exited with {rc}:\n{log}\n")
        return rc


@functools.lru_cache(maxsize=None)
def python_has(python, module):
    """Whether `python` exists and imports `module`."""
    if not python or not os.access(python, os.X_OK):
        return False
    r = subprocess.run([python, "-c", f"import {module}"],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    return r.returncode == 0


@functools.lru_cache(maxsize=None)
def numpy_version(python):
    r = subprocess.run([python, "-c", "import numpy; print(numpy.__version__)"],
                       capture_output=True, text=True)
    if r.returncode:
        return None
    return tuple(int(x) for x in re.findall(r"\d+", r.stdout)[:2])


def other_python():
    """The interpreter of the other kind: Debian's when this is the venv's,
    the venv's when this is Debian's (or None)."""
    for p in (VENV_PYTHON, SYSTEM_PYTHON):
        if p and os.access(p, os.X_OK) and sys.prefix != _prefix_of(p):
            return p
    return None


@functools.lru_cache(maxsize=None)
def _prefix_of(python):
    r = subprocess.run([python, "-c", "import sys; print(sys.prefix)"],
                       capture_output=True, text=True)
    return r.stdout.strip()


def child_env(daemon, extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PYTHONPATH, HERE])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["DLSHARE_SOCKET"] = daemon.socket
    env.update(extra or {})
    return env


def run_py(daemon, code, python=None, seconds=30, check=True, env=None):
    """Runs code in a new interpreter (default: this one); returns the
    CompletedProcess (text stdout/stderr)."""
    p = _spawn([python or sys.executable, "-c", textwrap.dedent(code)],
               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
               stderr=subprocess.PIPE, text=True, env=child_env(daemon, env))
    try:
        out, err = p.communicate(timeout=timeout(seconds))
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"child timed out:\n--- stdout\n{out}"
                             f"--- stderr\n{err}") from None
    r = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    if check and r.returncode != 0:
        raise AssertionError(f"child failed ({r.returncode}):\n"
                             f"--- stdout\n{r.stdout}--- stderr\n{r.stderr}")
    return r


class Child:
    """A long-lived child interpreter that speaks in lines on stdout."""

    def __init__(self, daemon, code, python=None, env=None):
        self.proc = _spawn(
            [python or sys.executable, "-u", "-c", textwrap.dedent(code)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=child_env(daemon, env))

    def readline(self, seconds=30):
        import selectors
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout(seconds)):
            self.kill()
            raise AssertionError("child said nothing in time:\n" + self.stderr())
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError("child ended early:\n" + self.stderr())
        return line.strip()

    def send(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def wait(self, seconds=30):
        try:
            return self.proc.wait(timeout(seconds))
        finally:
            self.close()

    def kill(self, sig=signal.SIGKILL):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        self.proc.wait()
        self.close()

    def stderr(self):
        if self.proc.poll() is None:
            return ""
        try:
            return self.proc.stderr.read()
        except (OSError, ValueError):
            return ""

    def close(self):
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except (OSError, ValueError):
                pass


class DaemonTest(unittest.TestCase):
    """One daemon per class; one client per test (self.client)."""

    daemon_args = ()

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon(*cls.daemon_args)

    @classmethod
    def tearDownClass(cls):
        rc = cls.daemon.stop()
        if rc != 0:
            raise AssertionError(f"dlshared exited with status {rc}")

    def setUp(self):
        self.client = dlshare.Client(self.daemon.socket)

    def tearDown(self):
        self.client.close()

    def name(self, suffix="x"):
        """A name unique to this test."""
        return f"{type(self).__name__}/{self._testMethodName}/{suffix}"

    def leases(self):
        return self.client.stats().leases

    def assertLeasesBecome(self, n, seconds=5):
        # Releases travel from the deleter through the library's thread to
        # the daemon: wait for them to arrive.
        got = wait_until(lambda: self.leases() == n, seconds)
        self.assertTrue(got, f"leases: want {n}, have {self.leases()}")

    def run_py(self, code, python=None, **kw):
        return run_py(self.daemon, code, python, **kw)

    def child(self, code, python=None, **kw):
        return Child(self.daemon, code, python, **kw)


def fd_count():
    return len(os.listdir("/proc/self/fd"))


def sample(np, dtype, shape):
    """Deterministic test data of any dtype NumPy has."""
    n = 1
    for d in shape:
        n *= d
    x = np.arange(n, dtype=np.int64) - n // 3
    dt = np.dtype(dtype)
    if dt.kind == "b":
        a = x % 3 == 0
    elif dt.kind == "c":
        a = (x + 1j * (x % 7)).astype(dt)
    elif dt.kind == "u":
        a = (x % 200).astype(dt)
    elif dt.kind == "i":
        a = (x % 100).astype(dt)
    else:
        a = (x / 4).astype(dt)
    return a.reshape(shape)
