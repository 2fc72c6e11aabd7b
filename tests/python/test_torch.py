"""PyTorch (Debian's python3-torch 1.13: DLPack 0.x, the unversioned path) as
producer and consumer, across processes; skipped without torch."""

import gc
import signal
import unittest

import dlshare
import harness
from harness import DaemonTest

try:
    import torch
except ImportError:
    torch = None

DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "uint8",
          "int16", "int32", "int64", "complex64", "complex128"]


def sample(dtype, shape):
    n = 1
    for d in shape:
        n *= d
    x = torch.arange(n, dtype=torch.int64) - n // 3
    dt = getattr(torch, dtype)
    if dt.is_complex:
        return (x + 1j * (x % 7)).to(dt).reshape(shape)
    if dt == torch.uint8:
        x = x % 200
    return (x % 100).to(dt).reshape(shape) if not dt.is_floating_point \
        else (x / 4).to(dt).reshape(shape)


@unittest.skipIf(torch is None, "torch is not installed for this interpreter "
                 "(Debian: apt install python3-torch)")
class TorchTest(DaemonTest):
    def test_bool_matrix(self):
        # torch 1.13 refuses kDLBool (code 6), which dlshare hands out for
        # bool; the recipe of python/README.md: publish uint8, view it as
        # bool on the consumer's side (no copy).
        n = self.name()
        want = torch.tensor([False, True, True, False])
        a = dlshare.empty((4,), "bool")   # torch 1.13 cannot export bool
        m = memoryview(a).cast("B")
        m[1] = m[2] = 1
        self.client.publish(n, a)
        t = self.client.get(n)
        self.assertEqual(t.dtype, "bool")
        if torch.__version__.startswith("1."):
            with self.assertRaisesRegex(RuntimeError, "Unsupported code 6"):
                torch.utils.dlpack.from_dlpack(t)
        else:
            self.assertTrue(torch.equal(torch.utils.dlpack.from_dlpack(t),
                                        want))
        del t
        self.client.publish(n + "8", want.view(torch.uint8))
        got = torch.utils.dlpack.from_dlpack(self.client.get(n + "8"))
        self.assertTrue(torch.equal(got.view(torch.bool), want))

    def test_from_dlpack_zero_copy(self):
        # The README's line: torch.from_dlpack(client.get("x")), reading what
        # another process published, without a copy.
        n = self.name()
        self.run_py(f"""
            import torch, dlshare
            with dlshare.Client() as c:
                c.publish({n!r}, torch.arange(12, dtype=torch.float32).reshape(3, 4))
        """)
        t = self.client.get(n)
        x = torch.from_dlpack(t)
        self.assertEqual(x.dtype, torch.float32)
        self.assertTrue(torch.equal(x, torch.arange(12.0).reshape(3, 4)))
        self.assertEqual(x.data_ptr(), t._info[5])          # zero copy
        self.assertEqual(torch.from_dlpack(t).data_ptr(), x.data_ptr())
        self.assertEqual(x.device.type, "cpu")

    def test_dtypes_across_processes(self):
        n = self.name()
        code = f"""
            import torch, dlshare, sys
            sys.path.insert(0, {harness.HERE!r})
            from test_torch import sample
            with dlshare.Client() as c:
                c.publish({n!r}, {{d: sample(d, (4, 3)) for d in {DTYPES!r}}})
        """
        self.run_py(code)
        b = self.client.get(n)
        for d in DTYPES:
            x = torch.from_dlpack(b[d])
            self.assertEqual(x.dtype, getattr(torch, d), d)
            self.assertTrue(torch.equal(x, sample(d, (4, 3))), d)
            self.assertEqual(b[d].dtype, d)

    def test_shapes_and_strides(self):
        n = self.name()
        base = torch.arange(48, dtype=torch.int32).reshape(6, 8)
        ts = {"scalar": torch.tensor(3.5), "empty": torch.zeros(0, 5),
              "t": base.t(), "slice": base[1::2, ::3],
              "big": torch.ones(512, 1024)}
        self.client.publish(n, ts)
        b = self.client.get(n)
        for k, v in ts.items():
            x = torch.from_dlpack(b[k])
            self.assertEqual(tuple(x.shape), tuple(v.shape), k)
            self.assertTrue(torch.equal(x, v), k)

    def test_zero_copy_strided_export(self):
        # A torch view of dlshare.empty() memory is published as is.
        n = self.name()
        h = dlshare.empty((6, 8), "float32")
        full = torch.from_dlpack(h)
        full.copy_(torch.arange(48.0).reshape(6, 8))
        view = full[::2, 1:]
        self.client.publish(n, view)
        self.assertTrue(self.client.stat(n).exported)
        t = self.client.get(n)
        self.assertEqual(t.strides, (16, 1))
        self.assertTrue(torch.equal(torch.from_dlpack(t), view))
        # Retiring the version runs torch's deleter on the library's thread
        # (it holds a C++ tensor, so no Python object shows when).
        del view, t, full
        gc.collect()
        self.client.publish(n, torch.zeros(1))
        self.assertTrue(harness.wait_until(
            lambda: self.client.stat(n).versions == 1))
        self.assertEqual(self.client.get(n).version, 2)

    def test_store_mode_with_torch(self):
        n = self.name()
        src = torch.randn(16, 16)
        with self.client.create(n, ("w", torch.float32, (16, 16)),
                                ("b", torch.bfloat16, (4,))) as w:
            torch.from_dlpack(w["w"]).copy_(src)
            w["b"].copy_from(torch.ones(4, dtype=torch.bfloat16))
        b = self.client.get(n)
        self.assertTrue(torch.equal(torch.from_dlpack(b["w"]), src))
        self.assertTrue(torch.equal(torch.from_dlpack(b["b"]),
                                    torch.ones(4, dtype=torch.bfloat16)))

    def test_write_through_tensor_crashes_not_corrupts(self):
        # torch 1.13 cannot see DLPack's read-only flag: its tensor is
        # writable, but the pages are mapped read-only, so a write kills the
        # writer (SIGSEGV) and every reader still sees the published data.
        n = self.name()
        self.client.publish(n, torch.arange(4.0))
        r = self.run_py(f"""
            import torch, dlshare
            c = dlshare.Client()
            x = torch.from_dlpack(c.get({n!r}))
            print("writing", flush=True)
            x[0] = 99.0
            print("wrote")
        """, check=False,
            # Under ASan (preloaded), let the SIGSEGV through as it is.
            env={"ASAN_OPTIONS": "handle_segv=0:detect_leaks=0"})
        self.assertEqual(r.returncode, -signal.SIGSEGV, r.stderr)
        self.assertEqual(r.stdout.strip(), "writing")
        self.assertTrue(torch.equal(torch.from_dlpack(self.client.get(n)),
                                    torch.arange(4.0)))

    def test_copy_is_writable(self):
        # __dlpack__(copy=True) gives torch a private, writable copy.
        n = self.name()
        self.client.publish(n, torch.arange(4.0))
        t = self.client.get(n)
        x = torch.utils.dlpack.from_dlpack(t.__dlpack__(copy=True))
        x[0] = 99.0
        self.assertEqual(torch.from_dlpack(self.client.get(n))[0].item(), 0.0)

    def test_lease_released_when_tensor_collected(self):
        n = self.name()
        self.client.publish(n, torch.arange(10))
        base = self.leases()
        x = torch.from_dlpack(self.client.get(n))
        self.assertEqual(self.leases(), base + 1)
        y = x[3:]
        del x
        gc.collect()
        self.assertEqual(self.leases(), base + 1)
        del y
        gc.collect()
        self.assertLeasesBecome(base)

    def test_lease_released_when_consumer_killed(self):
        n = self.name()
        self.client.publish(n, torch.arange(10))
        base = self.leases()
        child = self.child(f"""
            import torch, dlshare, time
            c = dlshare.Client()
            x = torch.from_dlpack(c.get({n!r}))
            print(int(x.sum()))
            time.sleep(600)
        """)
        self.assertEqual(child.readline(), "45")
        self.assertEqual(self.leases(), base + 1)
        child.kill(signal.SIGKILL)
        self.assertLeasesBecome(base)


if __name__ == "__main__":
    unittest.main()
