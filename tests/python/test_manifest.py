"""A whole state dict in one version (protocol 1.4): 10^5 tensors with
40-80-byte keys, far past a packet, published by one process and read
bit-exact by another, by publish (a copy into one daemon buffer) and by
create + seal; stat and list describe it; a missing key is a KeyError that
names it. The tensors' descriptions travel in a sealed manifest memfd."""

import os
import unittest

import harness
from harness import DaemonTest

try:
    import numpy as np
except ImportError:
    np = None

# Key i and its tensor's shape and values, the same in every process.
GEN = """
import numpy as np
N = 100_000
def key(i):
    return (f"model.layers.{i // 1024}.mlp.experts.{i % 1024}."
            + ("down_proj.weight_scale_inv", "gate_proj.weight",
               "up_proj.weight")[i % 3])
def shape(i):
    return ((i % 3) + 1,) if i % 2 else (2, (i % 4) + 1)
BASE = (np.arange(8 * N + 8, dtype=np.int64) * 2654435761 % 1000003
        ).astype(np.float32)
def values(i):
    s = shape(i)
    return BASE[8 * i:8 * i + s[0] * (s[1] if len(s) > 1 else 1)].reshape(s)
"""
exec(GEN)

CHECK = GEN + """
import dlshare
name, n = NAME, N
with dlshare.Client() as c:
    b = c.get(name)
    assert len(b) == n, len(b)
    for i in range(0, n, 7):              # every 7th by key, all its bytes
        a = np.from_dlpack(b[key(i)])
        assert a.shape == shape(i), (i, a.shape)
        assert np.array_equal(a, values(i)), i
    try:
        b["model.layers.0.no_such_tensor"]
    except KeyError as e:
        # NotFound too, naming the key, the name and the version.
        assert isinstance(e, dlshare.NotFound), type(e)
        assert e.args[0] == "model.layers.0.no_such_tensor", e.args
        assert "model.layers.0.no_such_tensor" in str(e), str(e)
        assert name in str(e) and "version 1" in str(e), str(e)
    else:
        raise AssertionError("no KeyError")
    print("ok", len(b))
"""


@unittest.skipIf(np is None, "NumPy is not installed for this interpreter")
class StateDictTest(DaemonTest):
    def check_elsewhere(self, name):
        r = self.run_py(CHECK.replace("NAME, N", f"{name!r}, {N}"),
                        seconds=120)
        self.assertEqual(r.stdout.split(), ["ok", str(N)])

    def test_publish_state_dict(self):
        n = self.name()
        sd = {key(i): values(i) for i in range(N)}
        self.client.publish(n, sd)
        self.check_elsewhere(n)
        info = self.client.stat(n)
        self.assertEqual(info.tensors, N)
        names = {i.name: i for i in self.client.list(n)}
        self.assertEqual(names[n].tensors, N)
        self.assertGreaterEqual(names[n].bytes,
                                sum(v.nbytes for v in sd.values()))
        del sd
        self.lookup_builds_nothing_per_tensor(n)

    def lookup_builds_nothing_per_tensor(self, n):
        """A get of 10^5 tensors and a lookup by key build no Python object
        per tensor (the library indexes the keys): the Python heap grows by
        a few blocks, not 10^5. Warm gets (the manifest kept, 1.5) too."""
        import gc
        import sys
        for _ in range(3):
            gc.collect()
            before = sys.getallocatedblocks()
            b = self.client.get(n)
            a = np.from_dlpack(b[key(N - 1)])
            self.assertTrue(np.array_equal(a, values(N - 1)))
            self.assertIn(key(N // 2), b)
            grown = sys.getallocatedblocks() - before
            self.assertLess(grown, 2000, f"{grown} blocks for one get")
            del a
            b.release()
            del b

    def test_create_seal_state_dict(self):
        n = self.name()
        w = self.client.create(n, *[(key(i), "float32", shape(i))
                                    for i in range(N)])
        for i in range(N):
            w[key(i)].copy_from(values(i))   # by key: O(1) each
        w.seal()
        self.check_elsewhere(n)


FAKECUDA = os.environ.get("DLSHARE_TEST_FAKECUDA", "")
CUDA_ENV = {"DLSHARE_CUDA_RUNTIME": FAKECUDA, "DLSHARE_CUDA_DRIVER": FAKECUDA}


@unittest.skipUnless(FAKECUDA and os.path.exists(FAKECUDA),
                     "no CUDA test double (tests/fakecuda needs the CUDA "
                     "toolkit's headers)")
class DeviceStateDictTest(DaemonTest):
    """A manifest memfd beside daemon-made GPU memory (tests/fakecuda)."""

    @classmethod
    def setUpClass(cls):
        os.environ.update(CUDA_ENV)   # libdlshare loads CUDA lazily
        super().setUpClass()

    def test_create_on_device(self):
        n, count = self.name(), 3000
        w = self.client.create(n, *[(f"model.layers.{i}.mlp.up_proj.weight",
                                     "float32", (2,)) for i in range(count)],
                               device="cuda:0")
        self.assertEqual(w.seal(), 1)
        info = self.client.stat(n)
        self.assertEqual((info.tensors, info.kind), (count, "cuda-vmm"))
        r = self.run_py(f"""
            import dlshare
            with dlshare.Client() as c:
                b = c.get({n!r})
                t = b["model.layers.2999.mlp.up_proj.weight"]
                print(len(b), t.device[0] == dlshare.DLDeviceType.kDLCUDA,
                      t.shape)
        """, env=CUDA_ENV)
        self.assertEqual(r.stdout.split(), [str(count), "True", "(2,)"])


if __name__ == "__main__":
    unittest.main()
