"""examples/producer.py and examples/consumer.py run as documented: a worker
publishes batches, a trainer takes the newest one (with torch where this
interpreter has it, else NumPy)."""

import os
import sys
import unittest

import harness
from harness import DaemonTest

EXAMPLES = os.path.join(harness.HERE, "..", "..", "examples")


@unittest.skipUnless(harness.python_has(sys.executable, "numpy"),
                     "the examples need NumPy")
class ExamplesTest(DaemonTest):
    def run_example(self, name, *args):
        path = os.path.join(EXAMPLES, name)
        with open(path) as f:
            code = f"import sys; sys.argv = {[path, *args]!r}\n" + f.read()
        return self.run_py(code, seconds=60).stdout

    def test_worker_then_trainer(self):
        out = self.run_example("producer.py", "7", "2")
        self.assertEqual(out.splitlines(), ["worker 7: batch/7 version 1",
                                            "worker 7: batch/7 version 2"])
        out = self.run_example("consumer.py", "7", "1")
        self.assertRegex(out, r"^version 2: images \(32, 3, 64, 64\) mean "
                              r"[-+]0\.\d{3}, labels \[\d, \d, \d, \d, \d, \d\]")
        self.assertLeasesBecome(0)


if __name__ == "__main__":
    unittest.main()
