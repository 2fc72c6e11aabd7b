"""Across interpreters: a producer under one Python and a consumer under the
other (the venv's, with NumPy >= 2.1, and Debian's /usr/bin/python3, with
NumPy 1.24 and torch 1.13), so each side of the protocol meets the other's
consumer. Skipped when there is no second interpreter with NumPy."""

import signal
import unittest

import harness
from harness import DaemonTest

try:
    import numpy as np
except ImportError:
    np = None

OTHER = harness.other_python()


def other_has(module):
    return OTHER is not None and harness.python_has(OTHER, module)


@unittest.skipIf(np is None, "NumPy is not installed for this interpreter")
@unittest.skipUnless(other_has("numpy"),
                     f"no second interpreter with NumPy (tried "
                     f"{harness.VENV_PYTHON!r}, {harness.SYSTEM_PYTHON!r})")
class CrossInterpreterTest(DaemonTest):
    def test_other_produces_numpy_here_consumes(self):
        n = self.name()
        self.run_py(f"""
            import numpy as np, dlshare
            from harness import sample
            with dlshare.Client() as c:
                c.publish({n!r}, {{"f": sample(np, "float32", (5, 7)),
                                  "i": sample(np, "int64", (3,)),
                                  "c": sample(np, "complex64", (2, 2))}})
        """, python=OTHER)
        b = self.client.get(n)
        for k, d, s in (("f", "float32", (5, 7)), ("i", "int64", (3,)),
                        ("c", "complex64", (2, 2))):
            a = np.from_dlpack(b[k])
            np.testing.assert_array_equal(a, harness.sample(np, d, s))
            self.assertFalse(a.flags.writeable)

    def test_here_produces_other_consumes(self):
        n = self.name()
        x = harness.sample(np, "float32", (4, 6))
        self.client.publish(n, x[:, ::2])
        r = self.run_py(f"""
            import numpy as np, dlshare
            with dlshare.Client() as c:
                a = np.from_dlpack(c.get({n!r}))
                print(a.dtype, a.shape, float(a.sum()))
        """, python=OTHER)
        self.assertEqual(r.stdout.split(),
                         ["float32", "(4,", "3)", str(float(x[:, ::2].sum()))])

    @unittest.skipUnless(other_has("torch"), "torch is not installed for the "
                         "other interpreter")
    def test_torch_there_numpy_here(self):
        # torch 1.13 (unversioned DLPack) produces; NumPy here consumes, and
        # the other way round, zero-copy where the memory allows.
        n = self.name()
        self.run_py(f"""
            import torch, dlshare
            with dlshare.Client() as c:
                c.publish({n!r}, torch.arange(10, dtype=torch.int32) * 3)
        """, python=OTHER)
        a = np.from_dlpack(self.client.get(n))
        np.testing.assert_array_equal(a, np.arange(10, dtype=np.int32) * 3)
        m = self.name("back")
        self.client.publish(m, a[::-1])
        r = self.run_py(f"""
            import torch, dlshare
            with dlshare.Client() as c:
                print(torch.from_dlpack(c.get({m!r})).tolist())
        """, python=OTHER)
        self.assertEqual(r.stdout.strip(), str(list(range(27, -1, -3))))

    def test_consumer_in_other_killed(self):
        n = self.name()
        self.client.publish(n, np.arange(10))
        base = self.leases()
        child = self.child(f"""
            import numpy as np, dlshare, time
            c = dlshare.Client()
            a = np.from_dlpack(c.get({n!r}))
            print(int(a.sum()))
            time.sleep(600)
        """, python=OTHER)
        self.assertEqual(child.readline(), "45")
        self.assertEqual(self.leases(), base + 1)
        child.kill(signal.SIGKILL)
        self.assertLeasesBecome(base)


if __name__ == "__main__":
    unittest.main()
