"""Runs unittest modules of tests/python under a given interpreter, for
ctest:  run.py PYTHON MODULE...

Exits 77, which ctest counts as skipped, with a "SKIP:" line saying why,
when the tests cannot run here (no such interpreter, or a sanitizer build);
otherwise becomes `PYTHON -m unittest -v MODULE...`.
"""
import os
import sys


def main():
    python, modules = sys.argv[1], sys.argv[2:]
    here = os.path.dirname(os.path.abspath(__file__))
    why = os.environ.get("DLSHARE_TEST_PYTHON_SKIP", "")
    if why:
        print(f"SKIP: Python tests: {why}")
        return 77
    if not os.access(python, os.X_OK):
        print(f"SKIP: Python tests: no interpreter {python} (scripts/dev "
              "creates .venv, and installs Debian's python3 packages)")
        return 77
    env = dict(os.environ)
    path = [os.environ.get("DLSHARE_PYTHONPATH", ""), here]
    if env.get("PYTHONPATH"):
        path.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    sys.stdout.flush()
    os.execve(python, [python, "-m", "unittest", "-v", *modules], env)


if __name__ == "__main__":
    sys.exit(main())
