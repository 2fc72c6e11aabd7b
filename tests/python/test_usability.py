"""What a Python user trips on (issue 19): writable copies (get(copy=True),
Tensor.copy()), NumPy's __array__ for consumers without DLPack, Ctrl-C
during a waiting get, and sources with any layout (torch passes explicit
strides even when compact) published bit-exact."""

import signal
import sys
import time
import unittest

import dlshare
import harness
from harness import DaemonTest

try:
    import numpy as np
except ImportError:
    np = None
try:
    import torch
except ImportError:
    torch = None


@unittest.skipIf(np is None, "NumPy is not installed for this interpreter")
class CopyTest(DaemonTest):
    def test_get_copy_is_writable_and_independent(self):
        n = self.name()
        src = np.arange(12, dtype=np.float32).reshape(3, 4)
        self.client.publish(n, src)
        a = self.client.get(n, copy=True)
        self.assertIsInstance(a, dlshare.Array)
        self.assertEqual((a.dtype, a.shape), ("float32", (3, 4)))
        x = np.asarray(a)
        self.assertTrue(x.flags.writeable)
        x -= 0.5
        y = np.asarray(a)
        y *= 2                                  # the same private memory
        self.assertTrue(np.array_equal(np.from_dlpack(a), y))
        self.assertTrue(np.array_equal(np.asarray(a), (src - 0.5) * 2))
        # The daemon's version is untouched, and the copy holds no lease.
        self.assertTrue(np.array_equal(np.asarray(self.client.get(n)), src))
        self.assertLeasesBecome(0)
        # Republishing a copy works (it is ordinary memory: copied again).
        v = self.client.publish(n, a)
        self.assertTrue(np.array_equal(
            np.asarray(self.client.get(n, version=v)), (src - 0.5) * 2))

    def test_tensor_copy_and_bundle_copies(self):
        n = self.name()
        w = np.arange(6, dtype=np.int16).reshape(2, 3)
        b = np.linspace(0, 1, 5)
        self.client.publish(n, {"w": w, "b": b})
        got = self.client.get(n, copy=True)
        self.assertEqual(sorted(got), ["b", "w"])
        self.assertTrue(np.array_equal(np.asarray(got["w"]), w))
        self.assertTrue(np.array_equal(np.asarray(got["b"]), b))
        with self.client.get(n) as bundle:
            c = bundle["w"].copy()
        np.asarray(c)[0, 0] = 99                # after the release: ours
        self.assertEqual(int(np.asarray(c)[0, 0]), 99)
        # Without keys, a list in order.
        self.client.publish(n, w, b)
        got = self.client.get(n, copy=True)
        self.assertIsInstance(got, list)
        self.assertTrue(np.array_equal(np.asarray(got[1]), b))
        self.assertLeasesBecome(0)

    def test_copy_of_large_tensor(self):
        # Above 2 MiB the copy lives in its own (huge-page) mapping.
        n = self.name()
        src = np.arange(3 << 20, dtype=np.int32)
        self.client.publish(n, src)
        a = self.client.get(n, copy=True)
        x = np.asarray(a)
        self.assertTrue(np.array_equal(x, src))
        x[:] = 7
        self.assertTrue(np.array_equal(np.asarray(self.client.get(n)), src))
        del x, a

    @unittest.skipIf(torch is None, "torch is not installed here")
    def test_torch_in_place_op_on_a_copy(self):
        # torch 1.13 cannot see DLPack's read-only flag: an in-place op on
        # a received tensor crashes the process. On a copy it is fine.
        n = self.name()
        self.client.publish(n, torch.ones(4, 5))
        x = torch.from_dlpack(self.client.get(n, copy=True))
        x.sub_(0.5)
        self.assertTrue(torch.equal(x, torch.full((4, 5), 0.5)))
        self.assertTrue(torch.equal(torch.from_dlpack(self.client.get(n)),
                                    torch.ones(4, 5)))


@unittest.skipIf(np is None, "NumPy is not installed for this interpreter")
class ArrayProtocolTest(DaemonTest):
    def test_asarray_is_read_only_and_zero_copy(self):
        n = self.name()
        src = np.arange(20, dtype=np.float64).reshape(4, 5)
        self.client.publish(n, src)
        t = self.client.get(n)
        a = np.asarray(t)
        self.assertIsInstance(a, np.ndarray)
        self.assertNotEqual(a.dtype, np.dtype(object))
        self.assertEqual((a.dtype, a.shape), (src.dtype, src.shape))
        self.assertTrue(np.array_equal(a, src))
        self.assertFalse(a.flags.writeable)
        self.assertEqual(a.ctypes.data, t._info[5])          # no copy
        with self.assertRaises(ValueError):
            a[0, 0] = 1
        # The array holds a lease of its own: it outlives the Tensor.
        t.release()
        del t
        self.assertTrue(np.array_equal(a, src))
        self.assertEqual(self.leases(), 1)
        del a
        self.assertLeasesBecome(0)

    def test_array_copy_and_dtype(self):
        n = self.name()
        src = np.arange(6, dtype=np.int32)
        self.client.publish(n, src)
        t = self.client.get(n)
        c = np.array(t)                          # copy=True: writable
        self.assertTrue(c.flags.writeable)
        c[0] = 5
        self.assertTrue(np.array_equal(np.asarray(t), src))
        f = np.asarray(t, dtype=np.float32)
        self.assertEqual(f.dtype, np.float32)
        self.assertTrue(np.array_equal(f, src.astype(np.float32)))
        if np.lib.NumpyVersion(np.__version__) >= "2.0.0":
            with self.assertRaises(ValueError):
                np.asarray(t, dtype=np.float32, copy=False)

    def test_bundle_tensors(self):
        n = self.name()
        self.client.publish(n, {"a": np.ones(3, np.uint8),
                                "b": np.zeros((2, 2), np.float16)})
        with self.client.get(n) as b:
            self.assertTrue(np.array_equal(np.asarray(b["a"]),
                                           np.ones(3, np.uint8)))
            self.assertEqual(np.asarray(b["b"]).dtype, np.float16)


class InterruptTest(DaemonTest):
    """Ctrl-C during a waiting get: KeyboardInterrupt, promptly. A hang
    check, not a timing test: the bound is generous."""

    def interrupt(self, timeout_expr):
        n = self.name()
        child = self.child(f"""
            import dlshare, sys
            c = dlshare.Client()
            print("waiting", flush=True)
            try:
                c.get({n!r}, timeout={timeout_expr})
            except KeyboardInterrupt:
                print("interrupted", flush=True)
                sys.exit(3)
            print("returned", flush=True)
        """)
        self.assertEqual(child.readline(), "waiting")
        # Let it park in the daemon (a signal before that would be seen
        # too, so this only makes the test mean what it says).
        harness.wait_until(lambda: self.client.stats().parked > 0, 5)
        t0 = time.monotonic()
        child.proc.send_signal(signal.SIGINT)
        self.assertEqual(child.readline(seconds=5), "interrupted")
        self.assertEqual(child.wait(seconds=5), 3)
        self.assertLess(time.monotonic() - t0, harness.timeout(5))

    def test_ctrl_c_while_waiting_forever(self):
        self.interrupt("dlshare.WAIT_FOREVER")

    def test_ctrl_c_while_waiting_with_timeout(self):
        self.interrupt("600")

    def test_uncaught_ctrl_c_ends_the_process(self):
        n = self.name()
        child = self.child(f"""
            import dlshare
            c = dlshare.Client()
            print("waiting", flush=True)
            c.get({n!r}, timeout=dlshare.WAIT_FOREVER)
        """)
        self.assertEqual(child.readline(), "waiting")
        harness.wait_until(lambda: self.client.stats().parked > 0, 5)
        child.proc.send_signal(signal.SIGINT)
        try:
            rc = child.proc.wait(harness.timeout(5))
        except Exception:
            child.kill()
            raise
        err = child.stderr()
        child.close()
        self.assertNotEqual(rc, 0)
        self.assertIn("KeyboardInterrupt", err)


def _layouts_numpy():
    base = np.arange(4 * 6 * 8, dtype=np.float32).reshape(4, 6, 8)
    big = np.arange(2000 * 2048, dtype=np.float32).reshape(2000, 2048)
    return {
        "compact": base,
        "rows": base[:, 1:5, :],                 # row-contiguous view
        "every_other_row": base[::2],
        "inner_stride": base[:, :, ::2],         # element by element
        "transposed": base.transpose(2, 0, 1),
        "negative": base[::-1, :, ::-1],
        "broadcast": np.broadcast_to(np.arange(8, dtype=np.float32), (5, 8)),
        "scalar": np.float64(3.5) * np.ones(()),
        "empty": base[:, :0],
        "bool": (base % 3 == 0)[:, ::2],
        "int8": base.astype(np.int8)[1:3, ::-1],
        # Long runs in more batches than one pwritev takes (1024 runs).
        "long_runs": big[:, :1500],
        # Short runs over more than one gather buffer.
        "short_runs": big[:600, :600].T,
    }


@unittest.skipIf(np is None, "NumPy is not installed for this interpreter")
class LayoutPublishTest(DaemonTest):
    """Every layout copies bit-exact into the daemon's buffer, whichever
    path the copy takes (one write, row runs, gathers)."""

    def test_numpy_layouts(self):
        for what, x in _layouts_numpy().items():
            with self.subTest(what):
                n = self.name(what)
                self.client.publish(n, x, copy=True)
                got = np.asarray(self.client.get(n))
                self.assertEqual(got.shape, x.shape)
                self.assertTrue(np.array_equal(got, x))
                self.assertTrue(got.flags.c_contiguous)
                del got
        self.assertLeasesBecome(0)

    @unittest.skipIf(torch is None, "torch is not installed here")
    def test_torch_layouts(self):
        base = torch.arange(4 * 6 * 8, dtype=torch.float32).reshape(4, 6, 8)
        big = torch.arange(2000 * 2048, dtype=torch.int32).reshape(2000, 2048)
        cases = {
            "compact": base,                      # explicit compact strides
            "rows": base[:, 1:5, :],
            "every_other_row": base[::2],
            "inner_stride": base[:, :, ::2],
            "transposed": base.permute(2, 0, 1),
            "expanded": torch.arange(8.0).expand(5, 8),
            "scalar": torch.tensor(2.5),
            "empty": base[:, :0],
            "half": base.half()[:, ::3],
            "bfloat16": base.bfloat16().transpose(0, 1),
            "long_runs": big[:, :1500],
            "short_runs": big[:600, :600].t(),
        }
        for what, x in cases.items():
            with self.subTest(what):
                n = self.name(what)
                self.client.publish(n, x)
                got = torch.from_dlpack(self.client.get(n))
                self.assertEqual(got.shape, x.shape)
                self.assertEqual(got.dtype, x.dtype)
                self.assertTrue(torch.equal(got, x))
                self.assertTrue(got.is_contiguous())
                del got
        self.assertLeasesBecome(0)

    @unittest.skipIf(torch is None, "torch is not installed here")
    def test_torch_and_numpy_view_give_the_same_version(self):
        # The same memory, seen with torch's strides and NumPy's: the same
        # bytes arrive.
        x = torch.arange(300 * 500, dtype=torch.float64).reshape(300, 500)
        v = x[10:200, 3:400]
        a, b = self.name("torch"), self.name("numpy")
        self.client.publish(a, v)
        self.client.publish(b, v.numpy())
        self.assertTrue(np.array_equal(np.asarray(self.client.get(a)),
                                       np.asarray(self.client.get(b))))


def _free_huge_pages():
    try:
        with open("/sys/kernel/mm/hugepages/hugepages-2048kB/"
                  "free_hugepages") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 0


@unittest.skipIf(np is None, "NumPy is not installed for this interpreter")
@unittest.skipUnless(_free_huge_pages() >= 4, "no free 2 MiB huge pages "
                     "(vm.nr_hugepages): the daemon's huge-page buffers, "
                     "which take no write(), cannot be made here")
class HugePagePublishTest(DaemonTest):
    """A store buffer of huge pages (hugetlbfs) takes no pwrite: the copy
    maps it instead, and the data arrives the same."""

    daemon_args = ("--huge-page-min", "2M")

    def test_copy_into_huge_page_buffer(self):
        n = self.name()
        x = np.arange(1024 * 1536, dtype=np.float32).reshape(1024, 1536)
        for what, v in (("compact", x), ("rows", x[:, 7:1500]),
                        ("transposed", x.T)):
            with self.subTest(what):
                self.client.publish(n, v, copy=True)
                got = np.asarray(self.client.get(n))
                self.assertTrue(np.array_equal(got, v))
                del got


if __name__ == "__main__":
    unittest.main()
