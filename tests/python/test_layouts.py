"""Which layouts each consumer we name takes from dlshare, as python/README.md
tabulates them: a producer publishes views of dlshare.empty() memory
without a copy (negative strides, zero strides, gaps, a transposition, an
offset into the buffer), and NumPy, torch and JAX read each in another
process, where a crash cannot take the test down. Runs under each
interpreter (the venv: NumPy >= 2.1, JAX; Debian's: NumPy 1.24, torch
1.13) with the consumers it has."""

import ctypes
import sys
import textwrap
import unittest

import dlshare
import harness
from harness import DaemonTest

try:
    import numpy as np
except ImportError:
    np = None

# name -> (how to make it from full, the 6x8 float32 arange, and whether
# dlshare shares it as it is: a negative stride is copied compact).
LAYOUTS = {
    "neg1": ("full[2][::-1]", False),
    "neg2": ("full[::-1, ::2]", False),
    "zero": ("np.broadcast_to(full[1], (4, 8))", True),
    "gap": ("full[:, ::3]", True),
    "T": ("full.T", True),
    "off": ("full[3:, 2:5]", True),
}

# What each consumer does with each layout as dlshare hands it out: "ok"
# (the right values, zero-copy), or the exception it raises. Never a crash,
# never wrong values.
CONSUMERS = {
    "numpy": ("import numpy", "np.from_dlpack(t)",
              {k: "ok" for k in LAYOUTS}),
    "torch": ("import torch", "torch.from_dlpack(t).numpy()",
              {k: "ok" for k in LAYOUTS}),
    # JAX takes compact tensors and transpositions only; a negative stride
    # never reaches it (copied compact at publish).
    "jax": ("import jax", "jax.dlpack.from_dlpack(t)",
            {"neg1": "ok", "neg2": "ok", "zero": "JaxRuntimeError",
             "gap": "JaxRuntimeError", "T": "ok",
             "off": "JaxRuntimeError"}),
}

READER = """
    import sys
    import numpy as np
    import dlshare
    {imp}
    full = np.arange(48, dtype=np.float32).reshape(6, 8)
    want = {want}
    c = dlshare.Client()
    t = c.get({name!r})
    try:
        got = np.asarray({read})
    except Exception as e:
        print(type(e).__name__)
    else:
        print("ok" if got.shape == want.shape and (got == want).all()
              else "WRONG " + repr(got.tolist()))
"""


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int),
                ("device_id", ctypes.c_int), ("ndim", ctypes.c_int32),
                ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


def dltensor_of(capsule):
    """The DLTensor at the head of a "dltensor" capsule's DLManagedTensor."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return _DLTensor.from_address(get(capsule, b"dltensor"))


@unittest.skipIf(np is None, "NumPy is not installed for this interpreter")
class LayoutTest(DaemonTest):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # Exports live as long as their producer's connection.
        c = cls.producer = dlshare.Client(cls.daemon.socket)
        h = dlshare.empty((6, 8), "float32")
        full = np.asarray(h)
        full[:] = np.arange(48, dtype=np.float32).reshape(6, 8)
        cls.views = {}
        for k, (expr, _) in LAYOUTS.items():
            v = eval(expr, {"np": np, "full": full})
            cls.views[k] = v.copy()
            c.publish(f"layout/{k}", v)
        del full, h, v

    @classmethod
    def tearDownClass(cls):
        cls.producer.close()
        super().tearDownClass()

    def test_shared_or_copied(self):
        for k, (_, shared) in LAYOUTS.items():
            with self.subTest(layout=k):
                self.assertEqual(self.client.stat(f"layout/{k}").exported,
                                 shared)
                t = self.client.get(f"layout/{k}")
                strides = t.strides or ()
                self.assertFalse(any(s < 0 for s in strides), strides)
                if not shared:
                    self.assertIsNone(t.strides)

    def test_data_points_at_the_first_element(self):
        # byte_offset is always 0 (torch 1.13 ignores it): data is the
        # address of the first element.
        for k in LAYOUTS:
            with self.subTest(layout=k):
                t = self.client.get(f"layout/{k}")
                cap = t.__dlpack__()
                d = dltensor_of(cap)
                self.assertEqual(d.byte_offset, 0)
                self.assertEqual(d.data, t._info[5])
                del d, cap

    def check_consumer(self, consumer):
        imp, read, want = CONSUMERS[consumer]
        if not harness.python_has(sys.executable, imp.split()[-1]):
            self.skipTest(f"{imp.split()[-1]} is not installed for "
                          f"{sys.executable}")
        for k, (expr, _) in LAYOUTS.items():
            with self.subTest(consumer=consumer, layout=k):
                code = READER.format(imp=imp, want=expr, name=f"layout/{k}",
                                     read=read)
                r = self.run_py(code, check=False, seconds=60)
                self.assertEqual(r.returncode, 0,
                                 f"{consumer} died on {k}:\n{r.stderr}")
                self.assertEqual(r.stdout.strip(), want[k], r.stderr)

    def test_numpy(self):
        self.check_consumer("numpy")

    def test_torch(self):
        self.check_consumer("torch")

    def test_jax(self):
        self.check_consumer("jax")

    def test_jax_through_numpy(self):
        # What JAX refuses, it takes as a (compact) NumPy copy.
        if not harness.python_has(sys.executable, "jax"):
            self.skipTest(f"jax is not installed for {sys.executable}")
        r = self.run_py(textwrap.dedent("""
            import numpy as np, jax.numpy as jnp, dlshare
            c = dlshare.Client()
            for k in %r:
                a = jnp.asarray(np.from_dlpack(c.get("layout/" + k)))
                print(k, a.shape)
        """ % (list(LAYOUTS),)), seconds=60)
        self.assertEqual(
            [line.split()[0] for line in r.stdout.split("\n") if line],
            list(LAYOUTS))


if __name__ == "__main__":
    unittest.main()
