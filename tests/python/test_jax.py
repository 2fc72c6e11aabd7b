"""JAX's CPU build (from PyPI, in the venv) as consumer and producer;
skipped when JAX is not installed."""

import gc
import signal
import unittest

import dlshare
from harness import DaemonTest

try:
    import jax
    import jax.numpy as jnp
    import numpy as np
except ImportError:
    jax = None


@unittest.skipIf(jax is None, "JAX is not installed for this interpreter "
                 "(scripts/dev installs jax[cpu] into .venv when PyPI has it)")
class JaxTest(DaemonTest):
    def test_consume_zero_copy(self):
        n = self.name()
        self.run_py(f"""
            import numpy as np, dlshare
            with dlshare.Client() as c:
                c.publish({n!r}, np.arange(12, dtype=np.float32).reshape(3, 4))
        """)
        t = self.client.get(n)
        x = jnp.from_dlpack(t)
        self.assertEqual(x.dtype, jnp.float32)
        np.testing.assert_array_equal(np.asarray(x),
                                      np.arange(12.0).reshape(3, 4))
        self.assertEqual(x.unsafe_buffer_pointer(), t._info[5])

    def test_dtypes_and_bundle(self):
        n = self.name()
        self.run_py(f"""
            import jax.numpy as jnp, dlshare
            with dlshare.Client() as c:
                c.publish({n!r}, {{"bf": jnp.arange(4, dtype=jnp.bfloat16),
                                  "i": jnp.arange(5, dtype=jnp.int32),
                                  "b": jnp.array([True, False]),
                                  "s": jnp.float32(2.5),
                                  "z": jnp.zeros((0, 3))}})
        """)
        b = self.client.get(n)
        self.assertEqual([b[k].dtype for k in b.keys()],
                         ["bfloat16", "int32", "bool", "float32", "float32"])
        self.assertEqual(jnp.from_dlpack(b["bf"]).dtype, jnp.bfloat16)
        self.assertEqual(jnp.from_dlpack(b["bf"]).tolist(), [0, 1, 2, 3])
        self.assertEqual(jnp.from_dlpack(b["i"]).tolist(), [0, 1, 2, 3, 4])
        self.assertEqual(jnp.from_dlpack(b["b"]).tolist(), [True, False])
        self.assertEqual(float(jnp.from_dlpack(b["s"])), 2.5)
        self.assertEqual(jnp.from_dlpack(b["z"]).shape, (0, 3))

    def test_strided(self):
        # JAX takes compact tensors (and transpositions) only; a strided
        # one is refused by JAX, and a copy through NumPy works.
        n = self.name()
        h = dlshare.empty((4, 6), "float32")
        full = np.asarray(h)
        full[:] = np.arange(24).reshape(4, 6)
        self.client.publish(n, {"t": full.T, "cols": full[:, ::2]})
        b = self.client.get(n)
        np.testing.assert_array_equal(np.asarray(jnp.from_dlpack(b["t"])),
                                      full.T)
        with self.assertRaises(Exception):
            jnp.from_dlpack(b["cols"])
        x = jnp.asarray(np.from_dlpack(b["cols"]))
        np.testing.assert_array_equal(np.asarray(x), full[:, ::2])

    def test_lease_released(self):
        n = self.name()
        # float32: JAX converts float64 (x64 is off by default), a copy.
        self.client.publish(n, np.arange(8, dtype=np.float32))
        base = self.leases()
        x = jnp.from_dlpack(self.client.get(n))
        gc.collect()
        self.assertEqual(self.leases(), base + 1)
        self.assertEqual(float(x.sum()), 28.0)
        del x
        gc.collect()
        self.assertLeasesBecome(base)

    def test_lease_released_when_consumer_killed(self):
        n = self.name()
        self.client.publish(n, np.arange(8, dtype=np.float32))
        base = self.leases()
        child = self.child(f"""
            import jax.numpy as jnp, dlshare, time
            c = dlshare.Client()
            x = jnp.from_dlpack(c.get({n!r}))
            print(float(x.sum()))
            time.sleep(600)
        """)
        self.assertEqual(child.readline(seconds=60), "28.0")
        self.assertEqual(self.leases(), base + 1)
        child.kill(signal.SIGKILL)
        self.assertLeasesBecome(base)


if __name__ == "__main__":
    unittest.main()
