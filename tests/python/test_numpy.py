"""NumPy as producer and consumer, across processes. Runs under NumPy >= 2.1
(the venv: from_dlpack asks for max_version=(1, 0), the versioned path) and
Debian's NumPy 1.24 (the unversioned path); skipped without NumPy."""

import gc
import signal
import unittest
import weakref

import dlshare
import harness
from harness import DaemonTest, sample

try:
    import numpy as np
except ImportError:
    np = None

NP = tuple(int(x) for x in np.__version__.split(".")[:2]) if np else None

DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
          "uint64", "float16", "float32", "float64", "complex64",
          "complex128"]
if NP and NP >= (1, 25):
    DTYPES.append("bool")   # NumPy < 1.25 cannot export bool over DLPack

SHAPES = [(), (0,), (7,), (2, 3, 4), (3, 0, 2), (1,) * 32, (1000, 1000)]


@unittest.skipIf(np is None, "NumPy is not installed for this interpreter")
class NumpyTest(DaemonTest):
    def test_bool_matrix(self):
        # The consumer matrix of python/README.md: dlshare hands out bool as
        # kDLBool (code 6). NumPy 1.24 refuses it; the recipe for such a
        # consumer is to publish uint8 and view it as bool, without a copy.
        n = self.name()
        a = dlshare.empty((5,), "bool")
        m = memoryview(a).cast("B")
        m[1] = m[4] = 1
        self.client.publish(n, a)
        t = self.client.get(n)
        self.assertEqual(t.dtype, "bool")
        want = [False, True, False, False, True]
        if NP >= (2, 1):
            self.assertEqual(np.from_dlpack(t).tolist(), want)
        elif NP < (1, 25):
            with self.assertRaisesRegex(RuntimeError, "Unsupported dtype"):
                np.from_dlpack(t)
        del t
        self.client.publish(n + "8", np.array(want).view(np.uint8))
        got = np.from_dlpack(self.client.get(n + "8")).view(np.bool_)
        self.assertEqual(got.tolist(), want)

    def test_version_path(self):
        # Which side of the protocol this interpreter's NumPy exercises.
        n = self.name()
        self.client.publish(n, np.arange(3.0))
        t = self.client.get(n)
        calls = []

        class Spy:
            def __dlpack_device__(self):
                return t.__dlpack_device__()

            def __dlpack__(self, **kw):
                cap = t.__dlpack__(**kw)
                calls.append((kw.get("max_version"), repr(cap).split('"')[1]))
                return cap

        a = np.from_dlpack(Spy())
        if NP >= (2, 1):
            self.assertEqual(calls[-1], ((1, 0), "dltensor_versioned"))
        else:
            self.assertEqual(calls[-1], (None, "dltensor"))
        # Both: read-only (the versioned flag, or NumPy 1.x's own rule).
        self.assertFalse(a.flags.writeable)
        self.assertEqual(a.tolist(), [0.0, 1.0, 2.0])

    def test_dtypes_across_processes(self):
        n = self.name()
        self.run_py(f"""
            import numpy as np, dlshare
            from harness import sample
            with dlshare.Client() as c:
                c.publish({n!r}, {{d: sample(np, d, (3, 5)) for d in {DTYPES!r}}})
        """)
        b = self.client.get(n)
        self.assertEqual(b.keys(), DTYPES)
        for d in DTYPES:
            a = np.from_dlpack(b[d])
            self.assertEqual(a.dtype, np.dtype(d), d)
            np.testing.assert_array_equal(a, sample(np, d, (3, 5)), d)
            self.assertEqual(b[d].dtype, d)

    def test_shapes(self):
        for i, shape in enumerate(SHAPES):
            n = self.name(str(i))
            x = sample(np, "float32", shape)
            self.client.publish(n, x)
            t = self.client.get(n)
            self.assertEqual(t.shape, shape)
            a = np.from_dlpack(t)
            self.assertEqual(a.shape, shape)
            np.testing.assert_array_equal(a, x)

    def test_strided_copied(self):
        # Ordinary memory is copied compact; the view's values arrive.
        n = self.name()
        base = sample(np, "int32", (6, 8))
        views = {"cols": base[:, ::3], "rev": base[::-1, ::2],
                 "t": base.T, "bcast": np.broadcast_to(base[0], (4, 8))}
        self.client.publish(n, views)
        b = self.client.get(n)
        for k, v in views.items():
            np.testing.assert_array_equal(np.from_dlpack(b[k]), v, k)

    def test_strided_zero_copy(self):
        # A view of shareable memory keeps its strides: no copy anywhere.
        n = self.name()
        h = dlshare.empty((6, 8), "float64")
        full = np.asarray(h)
        full[:] = sample(np, "float64", (6, 8))
        self.client.publish(n, {"a": full[::2, 1::3], "b": full[:, 7]})
        self.assertTrue(self.client.stat(n).exported)
        b = self.client.get(n)
        self.assertEqual(b["a"].strides, (16, 3))
        self.assertEqual(b["b"].strides, (8,))
        np.testing.assert_array_equal(np.from_dlpack(b["a"]), full[::2, 1::3])
        np.testing.assert_array_equal(np.from_dlpack(b["b"]), full[:, 7])

    def test_zero_copy_consumer(self):
        # from_dlpack maps the daemon's pages in place.
        n = self.name()
        self.client.publish(n, np.ones((256, 256), np.float32))
        t = self.client.get(n)
        a = np.from_dlpack(t)
        c = np.from_dlpack(t)
        self.assertEqual(a.ctypes.data, c.ctypes.data)
        self.assertEqual(a.ctypes.data, t._info[5])

    def test_read_only(self):
        n = self.name()
        self.client.publish(n, np.arange(4.0))
        a = np.from_dlpack(self.client.get(n))
        self.assertFalse(a.flags.writeable)
        with self.assertRaises(ValueError):
            a[0] = 9.0
        with self.assertRaises(ValueError):
            a.setflags(write=True)
        self.assertEqual(np.from_dlpack(self.client.get(n)).tolist(),
                         [0.0, 1.0, 2.0, 3.0])

    @unittest.skipIf(NP and NP < (2, 1), "NumPy < 2.1 has no from_dlpack(copy=)")
    def test_copy_is_writable(self):
        n = self.name()
        self.client.publish(n, np.arange(4.0))
        a = np.from_dlpack(self.client.get(n), copy=True)
        self.assertTrue(a.flags.writeable)
        a[0] = 9.0
        self.assertEqual(np.from_dlpack(self.client.get(n))[0], 0.0)

    def test_bundle_and_versions(self):
        n = self.name()
        for v in range(1, 4):
            got = self.client.publish(n, np.full(3, v), np.zeros(v),
                                      keys=["fill", "zeros"])
            self.assertEqual(got, v)
        b = self.client.get(n)
        self.assertEqual(b.version, 3)
        np.testing.assert_array_equal(np.from_dlpack(b["fill"]), [3, 3, 3])
        self.assertEqual(np.from_dlpack(b[1]).shape, (3,))

    def test_wait_for_producer_process(self):
        n = self.name()
        child = self.child(f"""
            import numpy as np, dlshare, time
            with dlshare.Client() as c:
                print("ready")
                input()
                time.sleep(0.2)
                c.publish({n!r}, np.arange(5))
        """)
        self.assertEqual(child.readline(), "ready")
        child.send("go")
        t = self.client.get(n, timeout=harness.timeout(10))
        np.testing.assert_array_equal(np.from_dlpack(t), np.arange(5))
        self.assertEqual(child.wait(), 0)
        with self.assertRaises(dlshare.Timeout):
            self.client.get(n, newer_than=1, timeout=0.2)

    def test_lease_released_when_array_collected(self):
        n = self.name()
        self.client.publish(n, np.arange(10))
        base = self.leases()
        t = self.client.get(n)
        a = np.from_dlpack(t)
        b = a[2:5]                      # a view keeps the lease too
        del t
        gc.collect()
        self.assertEqual(self.leases(), base + 1)
        del a
        gc.collect()
        self.assertEqual(self.leases(), base + 1)
        self.assertEqual(b.tolist(), [2, 3, 4])
        del b
        gc.collect()
        self.assertLeasesBecome(base)

    def test_lease_released_when_consumer_killed(self):
        n = self.name()
        self.client.publish(n, np.arange(10))
        base = self.leases()
        child = self.child(f"""
            import numpy as np, dlshare, time
            c = dlshare.Client()
            a = np.from_dlpack(c.get({n!r}))
            print(int(a.sum()))
            time.sleep(600)
        """)
        self.assertEqual(child.readline(), "45")
        self.assertEqual(self.leases(), base + 1)
        child.kill(signal.SIGKILL)
        self.assertLeasesBecome(base)
        # The name is intact for everyone else.
        np.testing.assert_array_equal(np.from_dlpack(self.client.get(n)),
                                      np.arange(10))

    def test_export_retired_runs_numpy_deleter(self):
        # A NumPy view of shareable memory is published without a copy; the
        # library keeps NumPy's DLPack tensor until the daemon retires the
        # version, then calls NumPy's deleter on its own thread.
        n = self.name()
        h = dlshare.empty((100,), "int64")
        view = np.asarray(h)[10:20]
        view[:] = np.arange(10)
        alive = weakref.ref(view)
        self.client.publish(n, view)
        self.assertTrue(self.client.stat(n).exported)
        del view
        gc.collect()
        self.assertIsNotNone(alive())   # the library holds it
        got = self.run_py(f"""
            import numpy as np, dlshare
            with dlshare.Client() as c:
                print(np.from_dlpack(c.get({n!r})).tolist())
        """).stdout.strip()
        self.assertEqual(got, str(list(range(10))))
        self.client.publish(n, np.zeros(1))    # retires version 1
        self.assertTrue(harness.wait_until(lambda: alive() is None))

    def test_client_freed_by_its_own_deleter(self):
        # The last reference to a Client can go inside a producer's deleter
        # that the library runs on that client's own thread; closing it
        # there would join the thread from itself. The binding closes it
        # on a thread of its own instead.
        class Tagged(np.ndarray):
            pass

        n = self.name()
        conns = self.client.stats().connections
        c2 = dlshare.Client(self.daemon.socket)
        v = np.asarray(dlshare.empty((8,), "float32")).view(Tagged)
        v.client = c2                  # v holds c2; c2's export holds v
        c2.publish(n, v)
        self.assertTrue(self.client.stat(n).exported)
        del v, c2
        gc.collect()
        self.assertEqual(self.client.stats().connections, conns + 1)
        self.client.publish(n, np.zeros(1))    # retires c2's version
        self.assertTrue(harness.wait_until(
            lambda: self.client.stats().connections == conns))

    def test_store_mode_with_numpy(self):
        n = self.name()
        x = sample(np, "float32", (64, 32))
        with self.client.create(n, ("x", np.float32, x.shape),
                                ("y", np.dtype("int16"), (3,))) as w:
            np.asarray(w["x"])[:] = x
            w["y"].copy_from(np.array([1, -2, 3], np.int16)[::-1])
        b = self.client.get(n)
        np.testing.assert_array_equal(np.from_dlpack(b["x"]), x)
        np.testing.assert_array_equal(np.from_dlpack(b["y"]), [3, -2, 1])

    def test_writer_views_must_go_before_seal(self):
        n = self.name()
        w = self.client.create(n, ("float32", (4,)))
        a = np.asarray(w[0])
        a[:] = 1
        with self.assertRaises(BufferError):
            w.seal()
        del a
        self.assertEqual(w.seal(), 1)

    def test_republish_received(self):
        # Arrays from from_dlpack are read-only; NumPy < 2 cannot export
        # those over DLPack, so publish takes them by the buffer protocol.
        n = self.name()
        self.client.publish(n, np.arange(12).reshape(3, 4))
        a = np.from_dlpack(self.client.get(n))
        self.client.publish(self.name("again"), a[:, 1:3], a.T)
        b = self.client.get(self.name("again"))
        np.testing.assert_array_equal(np.from_dlpack(b[0]), a[:, 1:3])
        np.testing.assert_array_equal(np.from_dlpack(b[1]), a.T)

    def test_publish_numpy_capsule(self):
        n = self.name()
        x = np.arange(6, dtype=np.int16)
        cap = x.__dlpack__()
        self.client.publish(n, cap)
        self.assertIn("used_dltensor", repr(cap))
        del cap, x
        gc.collect()
        np.testing.assert_array_equal(np.from_dlpack(self.client.get(n)),
                                      np.arange(6, dtype=np.int16))

    def test_dtype_without_dlpack_code(self):
        # NumPy refuses these over DLPack (BufferError) and, some of them,
        # over the buffer protocol (ValueError), naming no dtype: publish
        # says which dtype, as a dlshare error, and sends nothing.
        n = self.name()
        arrays = {
            "datetime64[s]": np.array(["2020-01-01"], "datetime64[s]"),
            "timedelta64[ms]": np.array([5], "timedelta64[ms]"),
            "object": np.array([1, "a"], dtype=object),
            "[('a', '<i4'), ('b', '<f4')]":
                np.zeros(3, dtype=[("a", "<i4"), ("b", "<f4")]),
            "<U2": np.array(["ab"]),
        }
        if np.dtype(np.longdouble).itemsize > 8:
            arrays["float128"] = np.zeros(2, np.longdouble)
        try:
            import ml_dtypes
        except ImportError:
            pass
        else:
            arrays["bfloat16"] = np.zeros(4, ml_dtypes.bfloat16)
        before = self.client.stats().requests
        for name, a in arrays.items():
            with self.subTest(dtype=name):
                with self.assertRaises(dlshare.InvalidArgument) as cm:
                    self.client.publish(n, a)
                msg = str(cm.exception)
                self.assertIn(f"numpy.ndarray of dtype {name}:", msg)
                self.assertIsInstance(cm.exception, ValueError)
                with self.assertRaises(dlshare.InvalidArgument):
                    self.client.publish(n, {"ok": np.zeros(2), "bad": a})
        self.assertEqual(self.client.stats().requests, before + 1)
        with self.assertRaises(dlshare.NotFound):
            self.client.stat(n)


if __name__ == "__main__":
    unittest.main()
