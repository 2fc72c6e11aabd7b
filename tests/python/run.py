"""Runs unittest modules of tests/python under a given interpreter, for
ctest:  run.py PYTHON MODULE...

Exits 77, which ctest counts as skipped (SKIP_RETURN_CODE), with a "SKIP:"
line saying why, when the tests cannot run here (no such interpreter, or a
sanitizer build), or when they ran and every one of them skipped (a module
whose consumer is not installed). Otherwise the exit status is unittest's:
0 when nothing failed, also when some tests skipped (their "skipped" lines
are in the log).

The modules run under PYTHON as `run.py --inner MODULE...`, which is
`python -m unittest -v MODULE...` plus that count.
"""
import os
import sys
import unittest

SKIPPED = 77


class _Result(unittest.TextTestResult):
    """Counts the tests that passed, which unittest does not."""

    passed = 0

    def addSuccess(self, test):
        super().addSuccess(test)
        self.passed += 1


def inner(modules):
    runner = unittest.TextTestRunner(verbosity=2, resultclass=_Result)
    prog = unittest.main(module=None, argv=["run.py", *modules],
                         testRunner=runner, exit=False)
    r = prog.result
    if not r.wasSuccessful():
        return 1
    if r.passed == 0 and (r.skipped or r.testsRun == 0):
        print(f"SKIP: Python tests: every test of {' '.join(modules)} "
              "skipped here (see the reasons above)")
        return SKIPPED
    return 0


def main():
    if sys.argv[1:2] == ["--inner"]:
        return inner(sys.argv[2:])
    python, modules = sys.argv[1], sys.argv[2:]
    here = os.path.dirname(os.path.abspath(__file__))
    why = os.environ.get("DLSHARE_TEST_PYTHON_SKIP", "")
    if why:
        print(f"SKIP: Python tests: {why}")
        return SKIPPED
    if not os.access(python, os.X_OK):
        print(f"SKIP: Python tests: no interpreter {python} (scripts/dev "
              "creates .venv, and installs Debian's python3 packages)")
        return SKIPPED
    env = dict(os.environ)
    path = [os.environ.get("DLSHARE_PYTHONPATH", ""), here]
    if env.get("PYTHONPATH"):
        path.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    sys.stdout.flush()
    os.execve(python, [python, os.path.abspath(__file__), "--inner",
                       *modules], env)


if __name__ == "__main__":
    sys.exit(main())
