"""The recipes of the READMEs run as written: README.md's "PyTorch in five
minutes" (publish/get with copy=True, weight sync) and python/README.md's
opening examples and its data-loader recipe, each block extracted from the
Markdown at test time, so that a change to the text is a change to what
runs.

Each runs in a fresh virtualenv of this interpreter (`python -m venv
--without-pip --system-site-packages`: nothing of the user's site, of
pyenv's or of the test venv's packages; the interpreter's own site, where
Debian's python3-torch is, stands in for `pip install torch`, which needs
PyPI), with the binding from the build tree on PYTHONPATH (only it) and a
daemon at DLSHARE_SOCKET, the default socket's override, as the READMEs
say. Only what a README leaves to its reader is defined around a block
(`make_batch`, `train_step`, `model`, `images`); a block is never edited.
Blocks that need torch skip where this interpreter has none.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

import harness
from harness import DaemonTest

ROOT = os.path.join(harness.HERE, "..", "..")


def blocks(path, heading):
    """The ```python blocks of the section of path under heading (up to the
    next heading of the same level), dedented (a block inside a list item
    is indented)."""
    with open(os.path.join(ROOT, path)) as f:
        text = "\n" + f.read()
    level = heading.split(" ")[0]
    start = text.index("\n" + heading + "\n")
    end = re.search(r"\n" + level + r" ", text[start + 1:])
    section = text[start:start + 1 + end.start()] if end else text[start:]
    found = re.findall(r"^( *)```python\n(.*?)^\1```$", section,
                       re.S | re.M)
    return [textwrap.dedent("".join(l[len(ind):] if l.startswith(ind) else l
                                    for l in body.splitlines(True)))
            for ind, body in found]


class ReadmeTest(DaemonTest):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="dlshare-readme-")
        venv = os.path.join(cls.tmp, "venv")
        r = subprocess.run([sys.executable, "-m", "venv", "--without-pip",
                            "--system-site-packages", venv],
                           capture_output=True, text=True)
        if r.returncode != 0:
            shutil.rmtree(cls.tmp)
            raise unittest.SkipTest(f"{sys.executable} -m venv failed: "
                                    f"{r.stderr.strip()[-200:]}")
        cls.python = os.path.join(venv, "bin", "python")
        super().setUpClass()

    has = {}

    def need(self, *modules):
        for m in modules:
            if m not in self.has:
                type(self).has[m] = harness.python_has(self.python, m)
            if not self.has[m]:
                self.skipTest(f"the fresh venv of {sys.executable} has no "
                              f"{m} (Debian: python3-torch, python3-numpy)")

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_recipe(self, code, seconds=60):
        env = {"PYTHONPATH": harness.PYTHONPATH, "PYTHONNOUSERSITE": "1"}
        r = self.run_py(code, python=self.python, seconds=seconds, env=env,
                        check=False)
        if r.returncode != 0:
            self.fail(f"the recipe failed ({r.returncode}):\n--- code\n{code}"
                      f"--- stdout\n{r.stdout}--- stderr\n{r.stderr}")
        return r.stdout

    def test_venv_is_fresh(self):
        out = self.run_recipe("""
import os, sys, dlshare
print(sys.prefix)
print(os.path.dirname(os.path.realpath(dlshare.__file__)))
""")
        prefix, pkg = out.splitlines()
        self.assertTrue(prefix.startswith(self.tmp), prefix)
        self.assertEqual(pkg, os.path.realpath(
            os.path.join(harness.PYTHONPATH, "dlshare")))

    def test_sections_found(self):
        self.assertEqual(len(blocks("README.md", "## PyTorch in five minutes")),
                         2)
        self.assertEqual(len(blocks("python/README.md",
                                    "## Queues: the data-loader recipe")), 1)
        self.assertGreaterEqual(len(blocks("python/README.md",
                                           "# dlshare for Python")), 2)

    def test_five_minutes_publish_get(self):
        self.need("torch")
        code = blocks("README.md", "## PyTorch in five minutes")[0]
        out = self.run_recipe(code + """
assert not torch.equal(x, y)
assert torch.equal(x - 0.5, y)
print("ok", tuple(x.shape))
""")
        self.assertEqual(out.strip(), "ok (1024, 1024)")

    def test_five_minutes_weight_sync(self):
        self.need("torch")
        # The block is a trainer's publish and a follower's endless loop;
        # a thread of ours publishes a second version and ends the process
        # once the loop copied it into the model.
        code = blocks("README.md", "## PyTorch in five minutes")[1]
        prelude = """
import os, threading, time
import dlshare, torch

client = dlshare.Client()
model = torch.nn.Linear(8, 4)

def _trainer():
    trained = torch.nn.Linear(8, 4)
    with torch.no_grad():
        trained.weight.fill_(1.5)
        trained.bias.fill_(-2.0)
    with dlshare.Client() as c:
        while True:
            try:
                if c.stat("weights/policy").latest >= 1:
                    break
            except dlshare.NotFound:
                pass
            time.sleep(0.01)
        c.publish("weights/policy", trained.state_dict())
    for _ in range(3000):
        if bool((model.weight == 1.5).all()) and bool((model.bias == -2.0).all()):
            print("updated", flush=True)
            os._exit(0)
        time.sleep(0.01)
    os._exit(3)

threading.Thread(target=_trainer, daemon=True).start()
"""
        out = self.run_recipe(prelude + code)
        self.assertEqual(out.strip(), "updated")

    def test_python_readme_opening(self):
        self.need("torch", "numpy")
        first, second = blocks("python/README.md", "# dlshare for Python")[:2]
        self.client.publish("model/w", harness.sample(__import__("numpy"),
                                                      "float32", (3, 5)))
        out = self.run_recipe(first + """
assert tuple(w.shape) == (3, 5), w.shape
print("ok")
""")
        self.assertEqual(out.strip(), "ok")
        out = self.run_recipe("""
import numpy
images = numpy.zeros((2, 3, 4, 4), numpy.float32)
labels = numpy.arange(2)
""" + second + """
with dlshare.Client() as c, c.get_bundle("batch/7") as b:
    assert b.keys() == ["images", "labels"] or list(b.keys()) == ["images", "labels"], b.keys()
print("ok")
""")
        self.assertEqual(out.strip(), "ok")

    def test_dataloader_recipe(self):
        self.need("torch")
        # What the recipe leaves to its reader: making batch i (its index
        # in its data, to check it came whole) and a training step (that
        # checks each batch bit for bit and counts it).
        prelude = """
import torch

def make_batch(i):
    x = torch.arange(48, dtype=torch.float32).reshape(4, 12) + 1000.0 * i
    y = torch.tensor([i, -i, 7], dtype=torch.int64)
    return x, y

seen = {}

def train_step(x, y):
    i = int(y[0])
    want_x, want_y = make_batch(i)
    assert torch.equal(x, want_x) and torch.equal(y, want_y), i
    seen[i] = seen.get(i, 0) + 1
"""
        code = blocks("python/README.md",
                      "## Queues: the data-loader recipe")[0]
        out = self.run_recipe(prelude + code + """
assert sorted(seen) == list(range(1000)), len(seen)
assert set(seen.values()) == {1}
print("ok", len(seen))
""", seconds=120)
        self.assertEqual(out.strip(), "ok 1000")


if __name__ == "__main__":
    unittest.main()
