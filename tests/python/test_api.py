"""The binding's own API, with no third-party consumer: connections, errors,
store and export mode, capsules, bundles, versions, waits, listing, leases,
threads, and interpreter shutdown. Data is read back through dlshare.Array
(buffer protocol) and Array.copy_from (DLPack), so this runs under any
interpreter."""

import array
import errno
import gc
import os
import signal
import sys
import threading
import time
import traceback
import unittest

import dlshare
import harness
from harness import DaemonTest, timeout


def read_back(t):
    """The elements of a Tensor, as a flat list, without NumPy."""
    a = dlshare.empty(t.shape, t.dtype)
    a.copy_from(t)
    return memoryview(a).cast("B").cast(memoryview(a).format).tolist()


def host(values, dtype="float32", shape=None):
    """A dlshare.Array holding values."""
    a = dlshare.empty(shape or (len(values),), dtype)
    m = memoryview(a).cast("B").cast(memoryview(a).format)
    for i, v in enumerate(values):
        m[i] = v
    return a


class ModuleTest(unittest.TestCase):
    def test_version_and_socket_path(self):
        self.assertRegex(dlshare.__version__, r"^\d+\.\d+\.\d+$")
        old = os.environ.get("DLSHARE_SOCKET")
        os.environ["DLSHARE_SOCKET"] = "/some/where.sock"
        try:
            self.assertEqual(dlshare.socket_path(), "/some/where.sock")
        finally:
            if old is None:
                del os.environ["DLSHARE_SOCKET"]
            else:
                os.environ["DLSHARE_SOCKET"] = old

    def test_no_daemon(self):
        with self.assertRaises(dlshare.ConnectionFailed) as cm:
            dlshare.Client("/nonexistent/dlshare.sock")
        e = cm.exception
        self.assertIsInstance(e, dlshare.Error)
        self.assertIsInstance(e, ConnectionError)
        self.assertEqual(e.code, -8)
        # The path and the system's reason, as the C library says them.
        self.assertEqual(str(e), "connect /nonexistent/dlshare.sock: "
                         + os.strerror(errno.ENOENT))
        self.assertEqual(type(e).__module__, "dlshare")

    def test_connect_timeout(self):
        # A listener that never accepts: connect() succeeds into its
        # queue, and the Hello is never answered.
        import socket as so
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "mute.sock")
            ls = so.socket(so.AF_UNIX, so.SOCK_SEQPACKET)
            ls.bind(path)
            ls.listen(4)
            try:
                t0 = time.monotonic()
                with self.assertRaises(dlshare.Timeout) as cm:
                    dlshare.Client(path, timeout=0.2)
                self.assertLess(time.monotonic() - t0, 30)  # no hang
                self.assertIn(f"connect {path}: the daemon did not answer "
                              "Hello within 200 ms", str(cm.exception))
                # One that accepts and says nothing.
                a, _ = ls.accept()
                a.close()
                with self.assertRaises(dlshare.Timeout):
                    dlshare.Client(path, timeout=0.05)
            finally:
                ls.close()

    def test_path_too_long(self):
        path = "/tmp/" + "x" * 200
        with self.assertRaises(dlshare.Error) as cm:
            dlshare.Client(path)
        self.assertIn("longer than the 107 bytes a Unix socket path may have",
                      str(cm.exception))

    def test_error_hierarchy(self):
        self.assertTrue(issubclass(dlshare.NotFound, LookupError))
        self.assertTrue(issubclass(dlshare.Timeout, TimeoutError))
        self.assertTrue(issubclass(dlshare.PermissionDenied, PermissionError))
        self.assertTrue(issubclass(dlshare.InvalidArgument, ValueError))
        e = dlshare.Timeout("waited")
        self.assertEqual(str(e), "waited")
        self.assertEqual(e.strerror, "timed out waiting for a version")

    def test_empty_array(self):
        a = dlshare.empty((2, 3), "int32")
        self.assertEqual(a.shape, (2, 3))
        self.assertEqual(a.dtype, "int32")
        self.assertEqual(a.nbytes, 24)
        self.assertEqual(a.itemsize, 4)
        m = memoryview(a)
        self.assertEqual((m.format, m.shape, m.readonly), ("i", (2, 3), False))
        self.assertEqual(m.tobytes(), bytes(24))  # zero-filled
        self.assertEqual(a.__dlpack_device__(), (dlshare.DLDeviceType.kDLCPU, 0))
        with self.assertRaises(TypeError):
            dlshare.Array()
        with self.assertRaises(ValueError):
            dlshare.empty((2,), "float7")
        with self.assertRaises(ValueError):
            dlshare.empty((-1,), "float32")

    def test_dtype_names(self):
        for d in ("bool", "int8", "uint64", "float16", "bfloat16",
                  "complex128"):
            self.assertEqual(dlshare.empty((1,), d).dtype, d)
        self.assertEqual(dlshare.empty(1, float).dtype, "float64")
        self.assertEqual(dlshare.empty(1, bool).dtype, "bool")

    def test_array_dlpack_rules(self):
        a = dlshare.empty((4,), "float32")
        cap = a.__dlpack__()
        self.assertIn("dltensor", repr(cap))
        v = a.__dlpack__(max_version=(1, 0))
        self.assertIn("dltensor_versioned", repr(v))
        self.assertIn('"dltensor"', repr(a.__dlpack__(max_version=(0, 8))))
        with self.assertRaises(BufferError):
            a.__dlpack__(stream=1)           # host memory: stream is None
        with self.assertRaises(BufferError):
            a.__dlpack__(dl_device=(2, 0))   # not on a CUDA device
        a.__dlpack__(dl_device=(1, 0))
        a.__dlpack__(copy=True, max_version=(1, 0))
        del cap, v
        gc.collect()                         # unconsumed capsules free


class FakeBundle:
    """Stands in for a bundle on a CUDA device (no GPU here): enough for the
    Python side of __dlpack__'s stream and device rules."""

    def __init__(self, dev_type):
        self.dev_type = dev_type
        self.exports = []
        self.waits = []

    def info(self, i):
        return ("float32", (4,), None, self.dev_type, 0, 0, 4)

    def version(self):
        return 1

    def export(self, i, versioned, copy):
        self.exports.append((versioned, copy))
        return "capsule"

    def wait(self, stream):
        self.waits.append(stream)


class StreamRulesTest(unittest.TestCase):
    def tensor(self, stream=None, dev=2):
        self.b = FakeBundle(dev)
        return dlshare.Tensor(self.b, 0, "n", "", stream, False)

    def test_cuda_default_stream(self):
        t = self.tensor()                      # get(stream=None): legacy
        self.assertEqual(t.__dlpack_device__(),
                         (dlshare.DLDeviceType.kDLCUDA, 0))
        t.__dlpack__()                         # None: legacy default
        t.__dlpack__(stream=1)                 # 1: legacy default
        t.__dlpack__(stream=-1)                # -1: no synchronisation
        self.assertEqual(self.b.waits, [])     # get()'s stream: no wait
        t.__dlpack__(stream=2)                 # per-thread: made to wait
        self.assertEqual(self.b.waits, [2])
        with self.assertRaises(ValueError):
            t.__dlpack__(stream=0)             # ambiguous
        with self.assertRaises(BufferError):
            t.__dlpack__(copy=True)            # no device copies
        with self.assertRaises(BufferError):
            t.__dlpack__(dl_device=(1, 0))

    def test_cuda_explicit_stream(self):
        t = self.tensor(stream=0x7f00deadbeef)
        t.__dlpack__(stream=0x7f00deadbeef, max_version=(1, 0))
        self.assertEqual(self.b.waits, [])
        t.__dlpack__(stream=1)                 # another stream: it waits
        self.assertEqual(self.b.waits, [1])
        self.assertEqual(self.b.exports, [(True, False), (False, False)])
        t = self.tensor(stream=2)
        t.__dlpack__(stream=2)

    def test_host_stream_must_be_none(self):
        t = self.tensor(dev=1)
        t.__dlpack__()
        for s in (1, 2, -1):
            with self.assertRaises(BufferError):
                t.__dlpack__(stream=s)

    def test_stream_arguments(self):
        self.assertEqual(dlshare._stream_value(None), 0)
        self.assertEqual(dlshare._stream_value(-1), (1 << 64) - 1)
        self.assertEqual(dlshare._stream_value(2), 2)

        class TorchStream:
            cuda_stream = 0

        self.assertEqual(dlshare._stream_value(TorchStream()), 1)
        with self.assertRaises(ValueError):
            dlshare._stream_value(0)


class ClientTest(DaemonTest):
    def test_context_manager_and_close(self):
        with dlshare.Client(self.daemon.socket) as c:
            self.assertFalse(c.closed)
            self.assertEqual(c.socket, self.daemon.socket)
        self.assertTrue(c.closed)
        with self.assertRaises(dlshare.NotFound):
            self.client.get(self.name())   # leaves a message in this thread
        with self.assertRaises(dlshare.Closed) as cm:
            c.stats()
        self.assertEqual(str(cm.exception), "the client was closed")
        c.close()  # twice is fine

    def test_default_socket(self):
        r = self.run_py("""
            import dlshare
            with dlshare.Client() as c:
                print(c.socket, c.stats().connections >= 1)
        """)
        self.assertEqual(r.stdout.split(), [self.daemon.socket, "True"])

    def test_invalid_names(self):
        for bad in ("", "/a", "a/", "a//b", "a/./b", "../a", "sp ace",
                    "x" * 256):
            with self.assertRaises(dlshare.InvalidArgument, msg=bad):
                self.client.get(bad)
        with self.assertRaises(TypeError):
            self.client.get(b"bytes")

    def test_strings_with_nul(self):
        # A NUL would cut the string short in C: never "ok" for "ok\0x".
        n = self.name()
        for bad in ("ok\0../../x", n + "\0x"):
            with self.assertRaises(ValueError, msg=repr(bad)):
                self.client.publish(bad, host([1.0]))
            with self.assertRaises(ValueError, msg=repr(bad)):
                self.client.create(bad, ("float32", (2,)))
            with self.assertRaises(ValueError, msg=repr(bad)):
                self.client.get(bad)
        with self.assertRaises(ValueError):
            self.client.publish(n, host([1.0]), host([2.0]),
                                keys=["a\0b", "a\0c"])
        with self.assertRaises(ValueError):
            self.client.create(n, ("k\0x", "float32", (2,)))
        for name in ("ok", n):
            with self.assertRaises(dlshare.NotFound, msg=name):
                self.client.get(name)

    def test_same_key_twice(self):
        n = self.name()
        with self.assertRaises(dlshare.InvalidArgument) as cm:
            self.client.publish(n, host([1.0]), host([2.0]),
                                keys=["a", "a"])
        self.assertIn('"a"', str(cm.exception))
        with self.assertRaises(dlshare.InvalidArgument) as cm:
            self.client.create(n, ("k", "float32", 2), ("k", "int32", 1))
        self.assertIn('"k"', str(cm.exception))
        with self.assertRaises(dlshare.NotFound):
            self.client.get(n)
        # Unnamed tensors may be many.
        self.client.publish(n, host([1.0]), host([2.0]))
        self.assertEqual(len(self.client.get(n)), 2)

    def test_publish_get_roundtrip(self):
        n = self.name()
        v = self.client.publish(n, host([1.5, 2.5, -3.0]))
        self.assertEqual(v, 1)
        t = self.client.get(n)
        self.assertIsInstance(t, dlshare.Tensor)
        self.assertEqual((t.name, t.version, t.dtype, t.shape, t.strides),
                         (n, 1, "float32", (3,), None))
        self.assertEqual(t.nbytes, 12)
        self.assertEqual(read_back(t), [1.5, 2.5, -3.0])
        self.assertIn("float32[3]", repr(t))

    def test_out_of_fds(self):
        """A get in a process with no file descriptor to spare raises
        TooManyOpenFiles (an OSError) and loses nothing: the same get
        works once an fd is free."""
        n = self.name()
        self.client.publish(n, host([1.5, -2.0]))
        self.run_py(f"""
            import os, resource, dlshare
            with dlshare.Client() as c:
                a = dlshare.empty((2,), "float32")
                soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
                lowest = os.dup(0)
                os.close(lowest)
                resource.setrlimit(resource.RLIMIT_NOFILE, (lowest, hard))
                try:
                    c.get({n!r})
                except dlshare.TooManyOpenFiles as e:
                    assert isinstance(e, OSError)
                    assert "RLIMIT_NOFILE" in str(e), str(e)
                else:
                    raise AssertionError("no TooManyOpenFiles")
                finally:
                    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
                a.copy_from(c.get({n!r}))
                assert memoryview(a).cast("B").cast("f").tolist() == [1.5, -2.0]
        """)

    def test_cross_process(self):
        n = self.name()
        self.run_py(f"""
            import dlshare
            with dlshare.Client() as c:
                a = dlshare.empty((4,), "int64")
                memoryview(a)[:] = __import__("array").array("q", [7, 8, 9, 10])
                assert c.publish({n!r}, a, copy=True) == 1
        """)
        self.assertEqual(read_back(self.client.get(n)), [7, 8, 9, 10])

    def test_store_mode_create_seal(self):
        n = self.name()
        with self.client.create(n, ("w", "float64", (2, 2)),
                                ("b", "int8", (3,))) as w:
            self.assertEqual(len(w), 2)
            self.assertEqual(w.version, 1)
            memoryview(w["w"]).cast("B").cast("d")[:] = array.array(
                "d", [1, 2, 3, 4])
            memoryview(w[1])[:] = array.array("b", [-1, 0, 1])
            with self.assertRaises(KeyError):
                w["nope"]
        self.assertTrue(w.done)
        b = self.client.get(n)
        self.assertIsInstance(b, dlshare.Bundle)
        self.assertEqual(b.keys(), ["w", "b"])
        self.assertEqual(read_back(b["w"]), [1, 2, 3, 4])
        self.assertEqual(read_back(b[1]), [-1, 0, 1])

    def test_store_mode_specs(self):
        n = self.name()
        w = self.client.create(n, dlshare.TensorSpec("k", "uint16", (5,)))
        self.assertEqual(w.keys, ("k",))
        w.abort()
        w.abort()  # no-op
        with self.assertRaises(dlshare.NotFound):
            self.client.get(n)
        w = self.client.create(n, {"a": ("int32", 2), "b": ("float32", ())})
        self.assertEqual(self.client.seal(w), 1)
        b = self.client.get(n)
        self.assertEqual([t.shape for t in b], [(2,), ()])
        with self.assertRaises(dlshare.InvalidState):
            w.seal()

    def test_writer_views_block_seal(self):
        n = self.name()
        w = self.client.create(n, ("float32", (4,)))
        a = w[0]
        m = memoryview(a)
        with self.assertRaises(BufferError):
            w.seal()
        m.release()
        cap = a.__dlpack__()
        with self.assertRaises(BufferError):
            w.seal()
        del cap
        self.assertEqual(w.seal(), 1)
        with self.assertRaises(BufferError):
            memoryview(a)  # the writable mapping is gone
        with self.assertRaises(BufferError):
            a.__dlpack__()
        self.assertIn("gone", repr(a))

    def test_writer_dropped_unsealed(self):
        n = self.name()
        w = self.client.create(n, ("float32", (4,)))
        del w
        gc.collect()
        with self.assertRaises(dlshare.NotFound):
            self.client.get(n)

    def test_export_zero_copy_and_retire(self):
        n = self.name()
        a = host([1, 2, 3, 4], "int32")
        self.client.publish(n, a)
        info = self.client.stat(n)
        self.assertTrue(info.exported)
        self.assertEqual(info.kind, "host")
        # The consumer maps the producer's pages: a write shows through.
        t = self.client.get(n)
        memoryview(a)[0] = 42
        self.assertEqual(read_back(t)[0], 42)
        # Memory that is not shareable would need a copy.
        with self.assertRaises(dlshare.CopyForbidden):
            self.client.publish(self.name("y"),
                                host([1.0]).__dlpack__(copy=True), copy=False)
        # copy=True copies shareable memory too: a store version.
        self.client.publish(self.name("z"), a, copy=True)
        self.assertFalse(self.client.stat(self.name("z")).exported)
        del t

    def test_publish_capsule(self):
        n = self.name()
        src = dlshare.empty((3,), "int16")
        cap = src.__dlpack__()
        self.client.publish(n, cap)
        self.assertIn("used_dltensor", repr(cap))
        with self.assertRaises(BufferError):
            self.client.publish(n, cap)       # consumed once only
        vcap = src.__dlpack__(max_version=(1, 0))
        self.client.publish(n, vcap)
        self.assertIn("used_dltensor_versioned", repr(vcap))
        # A failed publish gives the capsule back unconsumed.
        cap2 = src.__dlpack__()
        with self.assertRaises(dlshare.InvalidArgument):
            self.client.publish(n, cap2, keys=["k" * 300])
        self.assertNotIn("used", repr(cap2))
        with self.assertRaises(TypeError):
            self.client.publish(n, object())
        with self.assertRaises(ValueError):
            self.client.publish(n)

    def test_publish_buffer_protocol(self):
        # Objects without DLPack are published through the buffer protocol.
        n = self.name()
        self.client.publish(n, {
            "arr": array.array("d", [1.0, 2.0]),
            "raw": b"\x01\x02\x03",
            "mv": memoryview(array.array("i", range(10)))[::3],
        })
        b = self.client.get(n)
        self.assertEqual((b["arr"].dtype, read_back(b["arr"])),
                         ("float64", [1.0, 2.0]))
        self.assertEqual((b["raw"].dtype, read_back(b["raw"])),
                         ("uint8", [1, 2, 3]))
        self.assertEqual((b["mv"].dtype, read_back(b["mv"])),
                         ("int32", [0, 3, 6, 9]))

    def test_bundle(self):
        n = self.name()
        self.client.publish(n, {"x": host([1.0, 2.0]),
                                "y": host([3], "int64"),
                                "z": host([], "uint8")})
        b = self.client.get(n)
        self.assertEqual(len(b), 3)
        self.assertEqual(b.keys(), ["x", "y", "z"])
        self.assertIn("y", b)
        self.assertEqual(b["y"].key, "y")
        self.assertIs(b[-1], b["z"])
        self.assertEqual([t.key for t in b[0:2]], ["x", "y"])
        self.assertEqual(read_back(b["x"]), [1.0, 2.0])
        self.assertEqual(b["z"].shape, (0,))
        self.assertIsNone(b.get("none"))
        with self.assertRaises(KeyError):
            b["none"]
        with self.assertRaises(IndexError):
            b[3]
        self.client.publish(self.name("one"), host([1.0]))
        one = self.client.get_bundle(self.name("one"))
        self.assertIsInstance(one, dlshare.Bundle)
        self.assertEqual(len(one), 1)
        with self.assertRaises(ValueError):
            self.client.publish(n, host([1.0]), keys=["a", "b"])

    def test_publish_takes_a_stream_object(self):
        # publish(stream=torch.cuda.Stream(...)) hands the producer's
        # __dlpack__ the stream's handle, an int, as DLPack wants.
        seen = []

        class Stream:
            cuda_stream = 0x1234

        class OnDevice:
            def __dlpack_device__(self):
                return (2, 0)          # kDLCUDA

            def __dlpack__(self, stream=None, max_version=None):
                seen.append(stream)
                raise BufferError("stop here")

        for stream, want in ((Stream(), 0x1234), (None, 1), (7, 7)):
            with self.assertRaises(BufferError):
                self.client.publish(self.name(), OnDevice(), stream=stream)
            self.assertEqual(seen[-1], want)
            self.assertIs(type(seen[-1]), int)

    def test_state_dict_by_key(self):
        # A state dict's keys are 60 bytes; a lookup by key is the
        # library's (O(1)), and no Tensor is made until asked for.
        n = self.name()
        keys = [f"model.layers.{i:04d}.mlp.down_proj.weight.scale.block."
                f"{i:06d}"[:60] for i in range(1000)]
        arrays = {k: host([float(i)]) for i, k in enumerate(keys)}
        # Each in its own allocation: too many to share without a copy.
        with self.assertRaises(dlshare.LimitExceeded) as e:
            self.client.publish(n, arrays)
        self.assertIn("separate allocations", str(e.exception))
        self.client.publish(n, arrays, copy=True)
        b = self.client.get(n)
        self.assertEqual(len(b), 1000)
        self.assertEqual(b._tensors, {})
        self.assertEqual(read_back(b[keys[734]]), [734.0])
        self.assertEqual(len(b._tensors), 1)
        self.assertIn(keys[999], b)
        self.assertNotIn(keys[0] + "x", b)
        self.assertNotIn("ok\0" + keys[0], b)
        self.assertNotIn(17, b)
        self.assertIsNone(b.get("missing"))
        self.assertEqual(b.keys(), keys)
        b.release()
        # The keys outlive the lease, as they did before.
        self.assertEqual(b.keys(), keys)
        self.assertIn(keys[5], b)

    def test_versions(self):
        n = self.name()
        for i in range(1, 4):
            self.assertEqual(self.client.publish(n, host([float(i)])), i)
        self.assertEqual(self.client.get(n).version, 3)
        self.assertEqual(read_back(self.client.get(n, version=3)), [3.0])
        # Versions 1 and 2 went once superseded and unleased.
        with self.assertRaises(dlshare.NotFound):
            self.client.get(n, version=2)
        t3 = self.client.get(n)
        self.client.publish(n, host([4.0]))
        self.assertEqual(self.client.get(n, version=3).version, 3)  # leased
        self.assertEqual(self.client.get(n, newer_than=3).version, 4)
        with self.assertRaises(dlshare.NotFound):
            self.client.get(n, newer_than=4)
        with self.assertRaises(ValueError):
            self.client.get(n, version=1, newer_than=1)
        del t3

    def test_wait_for_version_from_another_process(self):
        n = self.name()
        self.client.publish(n, host([1.0]))
        # The child stays until the parent got its version: an exported
        # version goes with its exporter, and on a loaded machine the
        # parent's get may come only after the publish.
        child = self.child(f"""
            import dlshare, time
            with dlshare.Client() as c:
                print("ready")
                input()
                time.sleep(0.2)
                c.publish({n!r}, dlshare.empty((1,), "float32"))
                input()
        """)
        self.assertEqual(child.readline(), "ready")
        child.send("go")
        t0 = time.monotonic()
        t = self.client.get(n, newer_than=1, timeout=timeout(10))
        self.assertEqual(t.version, 2)
        self.assertLess(time.monotonic() - t0, timeout(10))
        child.send("done")
        self.assertEqual(child.wait(), 0)

    def test_wait_times_out(self):
        n = self.name()
        t0 = time.monotonic()
        with self.assertRaises(dlshare.Timeout) as cm:
            self.client.get(n, timeout=0.3)
        took = time.monotonic() - t0
        self.assertGreaterEqual(took, 0.29)
        self.assertLess(took, timeout(5))
        self.assertIsInstance(cm.exception, TimeoutError)
        # A wait longer than one slice (1 s) still ends on time.
        t0 = time.monotonic()
        with self.assertRaises(dlshare.Timeout):
            self.client.get(n, timeout=1.5)
        self.assertGreaterEqual(time.monotonic() - t0, 1.49)
        self.assertEqual(self.client.stats().parked, 0)
        with self.assertRaises(ValueError):
            self.client.get(n, timeout=-1)

    def test_wait_in_thread_and_close(self):
        # A get waiting without limit in one thread does not block another
        # thread's calls; closing the client ends it with Closed.
        c = dlshare.Client(self.daemon.socket)
        got = []

        def waiter():
            try:
                c.get(self.name(), timeout=dlshare.WAIT_FOREVER)
            except dlshare.Error as e:
                got.append(e)

        th = threading.Thread(target=waiter)
        th.start()
        self.assertTrue(harness.wait_until(
            lambda: self.client.stats().parked == 1))
        self.assertGreater(c.stats().connections, 0)  # not blocked
        c.close()
        th.join(timeout(5))
        self.assertFalse(th.is_alive())
        self.assertIsInstance(got[0], dlshare.Closed)

    def test_threads_share_a_client(self):
        n = self.name()
        errors = []

        def work(i):
            try:
                for j in range(20):
                    self.client.publish(f"{n}{i}", host([float(j)]))
                    self.assertEqual(read_back(self.client.get(f"{n}{i}")),
                                     [float(j)])
            except Exception as e:  # noqa: BLE001 -- reported below
                errors.append(e)

        ths = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        self.assertEqual(errors, [])

    def test_list_stat_stats_delete(self):
        p = self.name("")
        self.client.publish(p + "a", host([1.0, 2.0]), mode=0o600)
        self.client.publish(p + "b", {"k": host([1], "int8")})
        names = self.client.list(p)
        self.assertEqual([i.name for i in names], [p + "a", p + "b"])
        a = names[0]
        self.assertEqual((a.latest, a.tensors, a.mode, a.kind),
                         (1, 1, 0o600, "host"))
        self.assertEqual(a.owner_uid, os.getuid())
        info = self.client.stat(p + "b")
        self.assertEqual([(m.key, m.dtype, m.shape) for m in info.manifest],
                         [("k", "int8", (1,))])
        s = self.client.stats()
        self.assertGreaterEqual(s.names, 2)
        self.assertGreater(s.uptime_ms, 0)
        self.client.delete(p + "a")
        with self.assertRaises(dlshare.NotFound):
            self.client.stat(p + "a")
        with self.assertRaises(dlshare.NotFound):
            self.client.delete(p + "a")
        with self.assertRaises(dlshare.InvalidArgument):
            self.client.publish(p + "c", host([1.0]), mode=0o777)

    def test_lease_follows_tensor_and_capsules(self):
        n = self.name()
        self.client.publish(n, host([1.0]))
        base = self.leases()
        t = self.client.get(n)
        self.assertEqual(self.leases(), base + 1)
        cap = t.__dlpack__()
        t.release()
        self.assertTrue(t.released)
        with self.assertRaises(BufferError):
            t.__dlpack__()
        self.assertEqual(self.leases(), base + 1)  # the capsule holds it
        del cap
        self.assertLeasesBecome(base)
        with self.client.get(n):
            self.assertEqual(self.leases(), base + 1)
        self.assertLeasesBecome(base)

    def test_unchanged_name_costs_no_round_trip(self):
        # Protocol 1.7: a reader that gets, reads and drops the newest
        # version of a few names is answered by the library while they do
        # not change, and sees a change at its next get.
        a, b = self.name("a"), self.name("b")
        self.client.publish(a, host([1.0, 2.0]))
        self.client.publish(b, host([5.0]))
        with dlshare.Client(self.daemon.socket) as r:
            read_back(r.get(a))
            read_back(r.get(b))
            before = self.client.stats().requests
            for _ in range(500):
                t = r.get(a)
                self.assertEqual((t.version, read_back(t)), (1, [1.0, 2.0]))
                del t
                with r.get(b) as t:
                    self.assertEqual(read_back(t), [5.0])
            # Fewer than half of the 1000 gets asked (a pause of 20 ms,
            # a loaded machine, lets the kept leases go; none is 1000).
            self.assertLess(self.client.stats().requests - before, 500)
            self.client.publish(a, host([3.0]))
            t = r.get(a)
            self.assertEqual((t.version, read_back(t)), (2, [3.0]))
            del t
            # Nothing kept outlives the reader's next other request.
            r.stats()
            self.assertEqual(self.client.stat(a).leases, 0)
            self.assertEqual(self.client.stat(b).leases, 0)

    def test_read_only_versioned_capsule(self):
        n = self.name()
        self.client.publish(n, host([1.0]))
        t = self.client.get(n)
        # The flag itself is checked by the NumPy tests; here: both kinds.
        self.assertIn('"dltensor_versioned"',
                      repr(t.__dlpack__(max_version=(1, 0))))
        self.assertIn('"dltensor"', repr(t.__dlpack__()))
        with self.assertRaises(BufferError):
            t.__dlpack__(stream=-1)
        with self.assertRaises(BufferError):
            t.__dlpack__(dl_device=(2, 0))

    def test_no_fd_leak(self):
        n = self.name()
        self.client.publish(n, host([1.0] * 100))
        before = harness.fd_count()
        for _ in range(20):
            with dlshare.Client(self.daemon.socket) as c:
                t = c.get(n)
                read_back(t)
                del t
            gc.collect()
        self.assertLessEqual(harness.fd_count(), before)

    def test_exit_with_everything_alive(self):
        # Deleters that run during interpreter shutdown must neither crash
        # nor hang: leave clients, tensors, capsules, zero-copy exports and a
        # thread parked in a get alive at exit.
        n = self.name()
        self.client.publish(n, host([1.0]))
        r = self.run_py(f"""
            import threading, dlshare
            c = dlshare.Client()
            t = c.get({n!r})
            cap = t.__dlpack__()
            a = dlshare.empty((1000,), "float64")
            c.publish({n!r} + "/mine", a)
            c.publish({n!r} + "/mine", a.__dlpack__(max_version=(1, 0)))
            th = threading.Thread(target=lambda: c.get("never/" + {n!r},
                                  timeout=dlshare.WAIT_FOREVER), daemon=True)
            th.start()
            print("exiting")
        """, seconds=20)
        self.assertEqual(r.stdout.strip(), "exiting")
        self.assertEqual(r.stderr, "")
        self.assertLeasesBecome(0)


def fork_run(fn):
    """Forks; the child runs fn() and leaves with os._exit: 0, or 1 after
    printing what went wrong. Returns the child's pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            harness._die_with_parent()
            fn()
            code = 0
        except BaseException:  # noqa: BLE001 -- the child must not unwind
            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


def fork_wait(pid, seconds=5):
    """The child's exit status, or None after killing it when it hung."""
    deadline = time.monotonic() + timeout(seconds)
    while True:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(st)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.01)


class ErrorTextTest(DaemonTest):
    """The exceptions carry the library's (and the daemon's) words."""

    def test_get_errors_name_the_versions(self):
        n = self.name()
        for i in range(3):
            self.client.publish(n, host([i]))
        with self.assertRaises(dlshare.NotFound) as cm:
            self.client.get(n, version=1)
        self.assertEqual(str(cm.exception), f"get {n}: no version 1: version"
                         " 1 was replaced or deleted; the newest is 3")
        with self.assertRaises(dlshare.Timeout) as cm:
            self.client.get(n, newer_than=3, timeout=0.05)
        self.assertEqual(str(cm.exception), f"get {n}: timed out waiting for"
                         " a version newer than 3 (the newest is 3)")
        with self.assertRaises(dlshare.NotFound) as cm:
            self.client.get(n + "-none")
        self.assertEqual(str(cm.exception), f"get {n}-none: no such name")

    def test_connect_with_timeout(self):
        with dlshare.Client(self.daemon.socket, timeout=10) as c:
            self.assertGreaterEqual(c.stats().connections, 2)
        with dlshare.Client(self.daemon.socket, timeout=-1) as c:
            c.stats()


class ForkTest(DaemonTest):
    """A forked child (os.fork, a data-loader worker) never harms its
    parent's connection, and gets ForkedClient for every call on a Client
    it inherited."""

    def test_child_exits_normally(self):
        # The child's interpreter exits normally: its finalizers close the
        # inherited Client (and drop an inherited Tensor), and the parent
        # goes on using its connection.
        n = self.name()
        self.client.publish(n, host([1.0]))
        r = self.run_py(f"""
            import os, sys, dlshare
            c = dlshare.Client()
            t = c.get({n!r})
            pid = os.fork()
            if pid == 0:
                sys.exit(0)   # finalizers: c and t go here
            _, st = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(st) == 0, st
            c.publish({n!r}, dlshare.empty((3,), "int8"))
            # t's lease is still the parent's: the child sent nothing.
            print(c.get({n!r}).shape, c.stats().leases)
            t.release()
        """, seconds=20)
        self.assertEqual(r.stdout.strip(), "(3,) 1")
        self.assertEqual(r.stderr, "")

    def test_child_close_and_drop(self):
        n = self.name()
        self.client.publish(n, host([1.0, 2.0]))
        t = self.client.get(n)
        c = self.client

        def child():
            # Dropping an inherited tensor sends nothing (the parent's
            # lease stays); closing the client returns at once.
            t.release()
            t0 = time.monotonic()
            c.close()
            assert time.monotonic() - t0 < 0.5, "close took too long"
            assert c.closed
            try:
                c.get(n)
            except dlshare.Closed:
                pass
            else:
                raise AssertionError("a closed client answered")

        base = self.leases()
        self.assertEqual(fork_wait(fork_run(child)), 0)
        self.assertEqual(self.leases(), base)
        self.assertEqual(read_back(self.client.get(n)), [1.0, 2.0])
        self.client.publish(n, host([3.0]))
        self.assertEqual(read_back(self.client.get(n)), [3.0])
        t.release()

    def test_child_calls_fail_clearly(self):
        if os.environ.get("DLSHARE_TEST_SANITIZED"):
            # Seen once in a fresh-clone CI run: the child hung. The
            # parent thread below allocates all the while, and GCC 12's
            # ASan allocator keeps a lock that fork() does not reset (a
            # child forked while it is held hangs in malloc); test_model
            # leaves out its fork children under ASan for the same reason.
            self.skipTest("GCC 12's ASan allocator is not fork-safe while "
                          "another thread allocates")
        n = self.name()
        self.client.publish(n, host([1.0]))
        w = self.client.create(n + "/w", ("float32", (4,)))
        stop = threading.Event()
        errors = []

        def parent_calls():
            try:
                while not stop.is_set():
                    self.assertEqual(read_back(self.client.get(n)), [1.0])
            except Exception as e:  # noqa: BLE001 -- reported below
                errors.append(e)

        def child():
            for call in (lambda: self.client.get(n),
                         lambda: self.client.stats(),
                         lambda: self.client.publish(n, host([2.0])),
                         lambda: self.client.create(n + "/c", ("int8", 1)),
                         lambda: self.client.list(),
                         lambda: w[0],
                         lambda: w.seal()):
                for _ in range(20):
                    try:
                        call()
                    except dlshare.ForkedClient as e:
                        assert "another process" in str(e), str(e)
                        assert e.code == -18
                    else:
                        raise AssertionError("no ForkedClient")
            # Its own client works.
            with dlshare.Client(self.daemon.socket) as own:
                assert read_back(own.get(n)) == [1.0]

        th = threading.Thread(target=parent_calls)
        th.start()
        try:
            self.assertEqual(fork_wait(fork_run(child), 20), 0)
        finally:
            stop.set()
            th.join()
        self.assertEqual(errors, [])
        self.assertTrue(issubclass(dlshare.ForkedClient, dlshare.Error))
        self.assertEqual(dlshare.ForkedClient("x").strerror,
                         "the client was created in another process; "
                         "make a new one in the child")
        # The parent's writer was not touched: it seals.
        w[0].copy_from(host([1.0, 2.0, 3.0, 4.0]))
        self.assertEqual(w.seal(), 1)
        self.assertEqual(read_back(self.client.get(n + "/w")),
                         [1.0, 2.0, 3.0, 4.0])

    def test_fork_while_a_get_waits(self):
        # A parent thread waits in a get when the fork comes: the child's
        # close returns at once, and the parent's get still completes.
        n = self.name()
        got = []

        def waiter():
            try:
                got.append(read_back(self.client.get(n, timeout=20)))
            except Exception as e:  # noqa: BLE001 -- reported below
                got.append(e)

        th = threading.Thread(target=waiter)
        th.start()
        other = dlshare.Client(self.daemon.socket)
        try:
            self.assertTrue(harness.wait_until(
                lambda: other.stats().parked == 1))

            def child():
                t0 = time.monotonic()
                self.client.close()
                assert time.monotonic() - t0 < 0.5, "close took too long"

            self.assertEqual(fork_wait(fork_run(child)), 0)
            other.publish(n, host([5.0]))
            th.join(timeout(10))
            self.assertFalse(th.is_alive())
            self.assertEqual(got, [[5.0]])
        finally:
            other.close()

    def test_fork_while_writer_mapped(self):
        # The writer's memory is not the child's: the parent's seal does
        # not fail with Busy while the child lives.
        n = self.name()
        w = self.client.create(n, ("float32", (1 << 16,)))
        w[0].copy_from(host([1.5] * (1 << 16)))
        r, wr = os.pipe()

        def child():
            os.read(r, 1)
            try:
                memoryview(w[0])   # an Array made before the fork
            except BufferError as e:
                assert "another process" in str(e), str(e)
            else:
                raise AssertionError("the writer's memory in the child")

        pid = fork_run(child)
        try:
            self.assertEqual(w.seal(), 1)
        finally:
            os.write(wr, b"x")
            self.assertEqual(fork_wait(pid), 0)
            os.close(r)
            os.close(wr)
        self.assertEqual(read_back(self.client.get(n))[:2], [1.5, 1.5])


if __name__ == "__main__":
    unittest.main()
