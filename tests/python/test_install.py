"""`cmake --install` (into a DESTDIR) installs a package that imports and
works under both interpreters, finding the installed libdlshare, not the
build tree's. Configured by DLSHARE_CMAKE, DLSHARE_BUILD_DIR,
DLSHARE_INSTALL_PREFIX and DLSHARE_PYTHON_INSTALL_DIR (set by ctest)."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import harness
from harness import DaemonTest

CMAKE = os.environ.get("DLSHARE_CMAKE", "")
BUILD = os.environ.get("DLSHARE_BUILD_DIR", "")
PREFIX = os.environ.get("DLSHARE_INSTALL_PREFIX", "/usr/local")
PYDIR = os.environ.get("DLSHARE_PYTHON_INSTALL_DIR", "")

CHECK = """
import os, sys, dlshare
root = os.environ["ROOT"]
assert dlshare.__file__.startswith(root), dlshare.__file__
libs = {l.split()[-1] for l in open("/proc/self/maps") if "libdlshare.so" in l}
assert libs and all(p.startswith(root) for p in libs), libs
with dlshare.Client() as c:
    a = dlshare.empty((3,), "int32")
    memoryview(a)[:] = __import__("array").array("i", [4, 5, 6])
    c.publish(os.environ["NAME"], a, copy=True)
    t = c.get(os.environ["NAME"])
    b = dlshare.empty((3,), "int32")
    b.copy_from(t)
    print(sys.version_info[:2], memoryview(b).tolist())
"""


@unittest.skipUnless(CMAKE and BUILD and PYDIR, "not configured by ctest")
class InstallTest(DaemonTest):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.root = tempfile.mkdtemp(prefix="dlshare-install-")
        env = dict(os.environ, DESTDIR=cls.root)
        r = subprocess.run([CMAKE, "--install", BUILD], env=env,
                           capture_output=True, text=True)
        if r.returncode:
            shutil.rmtree(cls.root, ignore_errors=True)
            super().tearDownClass()
            raise AssertionError("cmake --install failed:\n" + r.stdout +
                                 r.stderr)
        pydir = PYDIR if os.path.isabs(PYDIR) else os.path.join(PREFIX, PYDIR)
        cls.site = cls.root + pydir

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.root, ignore_errors=True)
        super().tearDownClass()

    def check(self, python):
        env = dict(os.environ, PYTHONPATH=self.site, ROOT=self.root,
                   NAME=self.name(os.path.basename(python)),
                   DLSHARE_SOCKET=self.daemon.socket,
                   PYTHONDONTWRITEBYTECODE="1")
        r = subprocess.run([python, "-c", CHECK], env=env, cwd=self.root,
                           capture_output=True, text=True,
                           timeout=harness.timeout(30))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("[4, 5, 6]", r.stdout)

    def test_files(self):
        names = sorted(os.listdir(os.path.join(self.site, "dlshare")))
        self.assertIn("__init__.py", names)
        self.assertTrue(any(n.startswith("_dlshare.") and n.endswith(".so")
                            for n in names), names)

    def test_import_under_each_interpreter(self):
        seen = set()
        for python in (sys.executable, harness.VENV_PYTHON,
                       harness.SYSTEM_PYTHON):
            if not python or not os.access(python, os.X_OK):
                continue
            prefix = harness._prefix_of(python)
            if prefix in seen:
                continue
            seen.add(prefix)
            with self.subTest(python=python):
                self.check(python)
        self.assertTrue(seen)


if __name__ == "__main__":
    unittest.main()
