"""The CUDA path of the binding, without a GPU: libdlshare loads
tests/fakecuda (a CUDA runtime test double over shared host memory) instead
of libcudart. A producer process publishes "device" memory from cudaMalloc
as a bare dltensor capsule; this process gets it with the DLPack stream
rules and reads it back with cudaMemcpy. Skipped without the test double
(DLSHARE_TEST_FAKECUDA, set by ctest)."""

import ctypes
import os
import unittest

import dlshare
from fakecuda_dlpack import DLManagedTensor, DLTENSOR, capi, cuda
import harness
from harness import DaemonTest

FAKECUDA = os.environ.get("DLSHARE_TEST_FAKECUDA", "")
CUDA_ENV = {"DLSHARE_CUDA_RUNTIME": FAKECUDA, "DLSHARE_CUDA_DRIVER": FAKECUDA,
            "FAKECUDA_DELAY_US": "20000"}


@unittest.skipUnless(FAKECUDA and os.path.exists(FAKECUDA),
                     "no CUDA test double (tests/fakecuda needs the CUDA "
                     "toolkit's headers)")
class FakeCudaTest(DaemonTest):
    @classmethod
    def setUpClass(cls):
        os.environ.update(CUDA_ENV)   # libdlshare loads CUDA lazily
        super().setUpClass()

    def producer(self, n, values):
        return self.child(f"""
import ctypes, dlshare
from fakecuda_dlpack import *
fc = cuda({FAKECUDA!r})
vals = (ctypes.c_float * {len(values)})(*{values!r})
p = ctypes.c_void_p()
assert fc.cudaMalloc(ctypes.byref(p), ctypes.sizeof(vals)) == 0
assert fc.cudaMemcpy(p, vals, ctypes.sizeof(vals), 1) == 0   # H2D
shape = (ctypes.c_int64 * 1)({len(values)})
mt = DLManagedTensor()
mt.dl_tensor = DLTensor(p, DLDevice(2, 0), 1, DLDataType(2, 32, 1), shape,
                        None, 0)
cap = capi.PyCapsule_New(ctypes.addressof(mt), DLTENSOR, None)
with dlshare.Client() as c:
    print(c.publish({n!r}, cap, stream=None))
    assert "used_dltensor" in repr(cap)
    input()        # legacy CUDA IPC: the exporter outlives the importers
    assert fc.cudaDeviceSynchronize() == 0
""", env=CUDA_ENV)

    def read(self, cap, count):
        mt = DLManagedTensor.from_address(
            capi.PyCapsule_GetPointer(cap, DLTENSOR))
        host = (ctypes.c_float * count)()
        fc = cuda(FAKECUDA)
        self.assertEqual(fc.cudaMemcpy(host, mt.dl_tensor.data,
                                       ctypes.sizeof(host), 2), 0)  # D2H
        return list(host)

    def test_device_tensor_across_processes(self):
        n = self.name()
        values = [1.5, -2.0, 3.25, 4.0]
        prod = self.producer(n, values)
        self.assertEqual(prod.readline(), "1")
        info = self.client.stat(n)
        self.assertEqual((info.kind, info.exported), ("cuda-ipc", True))
        t = self.client.get(n)                      # legacy default stream
        self.assertEqual(t.device, (dlshare.DLDeviceType.kDLCUDA, 0))
        self.assertEqual(t.__dlpack_device__()[0], 2)
        self.assertEqual(self.read(t.__dlpack__(), 4), values)
        self.assertEqual(self.read(t.__dlpack__(stream=1), 4), values)
        t.__dlpack__(stream=-1)
        self.assertIn("versioned", repr(t.__dlpack__(max_version=(1, 0))))
        # get() waited on legacy; another stream named here waits too.
        self.assertEqual(self.read(t.__dlpack__(stream=2), 4), values)
        with self.assertRaises(BufferError):
            t.__dlpack__(copy=True)
        with self.assertRaises(ValueError):
            t.__dlpack__(stream=0)
        base = self.leases()
        del t
        self.assertLeasesBecome(base - 1)
        prod.send("done")
        self.assertEqual(prod.wait(), 0)

    def test_per_thread_stream(self):
        n = self.name()
        prod = self.producer(n, [7.0, 8.0])
        self.assertEqual(prod.readline(), "1")
        t = self.client.get(n, stream=2)            # per-thread default
        t.__dlpack__(stream=2)
        t.__dlpack__()                              # legacy: made to wait
        with self.assertRaises(ValueError):
            t.__dlpack__(stream=0)
        del t
        prod.send("done")
        self.assertEqual(prod.wait(), 0)

    def test_store_on_device(self):
        """create(device="cuda:0"): daemon-owned GPU memory, written here
        through the fake's cudaMemcpy, read by another process after this
        writer sealed it."""
        n = self.name()
        values = [0.5, 1.0, -1.5, 2.25, 8.0]
        with self.assertRaises(ValueError):
            self.client.create(n, ("float32", (5,)), device="gpu")
        w = self.client.create(n, ("float32", (5,)), device="cuda:0")
        cap = w[0].__dlpack__(stream=-1)
        mt = DLManagedTensor.from_address(
            capi.PyCapsule_GetPointer(cap, DLTENSOR))
        self.assertEqual(mt.dl_tensor.device.device_type, 2)
        vals = (ctypes.c_float * 5)(*values)
        fc = cuda(FAKECUDA)
        self.assertEqual(fc.cudaMemcpy(mt.dl_tensor.data, vals,
                                       ctypes.sizeof(vals), 1), 0)  # H2D
        del mt, cap
        self.assertEqual(w.seal(), 1)
        self.assertEqual(self.client.stat(n).kind, "cuda-vmm")
        cons = self.child(f"""
import ctypes, dlshare
from fakecuda_dlpack import *
fc = cuda({FAKECUDA!r})
with dlshare.Client() as c:
    t = c.get({n!r})
    assert t.device == (dlshare.DLDeviceType.kDLCUDA, 0), t.device
    cap = t.__dlpack__()
    mt = DLManagedTensor.from_address(capi.PyCapsule_GetPointer(cap, DLTENSOR))
    host = (ctypes.c_float * 5)()
    assert fc.cudaMemcpy(host, mt.dl_tensor.data, ctypes.sizeof(host), 2) == 0
    print(list(host))
""", env=CUDA_ENV)
        self.assertEqual(cons.readline(), repr(values))
        self.assertEqual(cons.wait(), 0)

    def test_queue_on_device(self):
        """A queue name of GPU versions: full refuses a device create (the
        daemon checks before it allocates), another process takes the
        version and reads it, and its release makes room."""
        n = self.name()
        values = [1.0, 2.0, 3.0, 4.0, 5.0]
        w = self.client.create(n, ("float32", (5,)), device="cuda:0",
                               queue=1)
        cap = w[0].__dlpack__(stream=-1)
        mt = DLManagedTensor.from_address(
            capi.PyCapsule_GetPointer(cap, DLTENSOR))
        vals = (ctypes.c_float * 5)(*values)
        fc = cuda(FAKECUDA)
        self.assertEqual(fc.cudaMemcpy(mt.dl_tensor.data, vals,
                                       ctypes.sizeof(vals), 1), 0)  # H2D
        del mt, cap
        w.seal()
        with self.assertRaises(dlshare.LimitExceeded):
            self.client.create(n, ("float32", (5,)), device="cuda:0",
                               queue=1)
        cons = self.child(f"""
import ctypes, dlshare
from fakecuda_dlpack import *
fc = cuda({FAKECUDA!r})
with dlshare.Client() as c:
    t = c.take({n!r}, timeout=10)
    cap = t.__dlpack__()
    mt = DLManagedTensor.from_address(capi.PyCapsule_GetPointer(cap, DLTENSOR))
    host = (ctypes.c_float * 5)()
    assert fc.cudaMemcpy(host, mt.dl_tensor.data, ctypes.sizeof(host), 2) == 0
    print(list(host), flush=True)
    del mt, cap
    t.release()          # consumed; a close with it held would put it back
""", env=CUDA_ENV)
        self.assertEqual(cons.readline(), repr(values))
        self.assertEqual(cons.wait(), 0)
        # The taker released it: room for the next one.
        w2 = self.client.create(n, ("float32", (5,)), device="cuda:0",
                                queue=1, wait=harness.timeout(10))
        w2.abort()
        self.client.delete(n)


if __name__ == "__main__":
    unittest.main()
