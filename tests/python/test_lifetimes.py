"""Name lifetimes from Python (protocol 1.4): owned names, TTLs, delete by
prefix, per-uid stats."""

import os
import unittest

import dlshare

from harness import DaemonTest, wait_until


def tensor(*values):
    a = dlshare.empty((len(values),), "float32")
    mv = memoryview(a).cast("B").cast("f")
    for i, v in enumerate(values):
        mv[i] = v
    return a


class LifetimeTest(DaemonTest):
    daemon_args = ("--default-ttl", "0", "--max-ttl", "60000")

    def names(self):
        return self.client.stats().names

    def test_owned_goes_with_its_process(self):
        n = self.name("owned")
        child = self.child(f"""
            import dlshare
            c = dlshare.Client()
            a = dlshare.empty((4,), "float32")
            c.publish({n!r}, a, owned=True)
            w = c.create({n!r} + ".store", ("float32", (4,)), owned=True)
            w.seal()
            print("ready")
            input()
        """)
        self.assertEqual(child.readline(), "ready")
        info = self.client.stat(n)
        self.assertTrue(info.owned)
        self.assertGreater(info.owner_pid, 0)
        held = self.client.get(n + ".store")
        # Another connection may not add to it without taking it over.
        with self.assertRaises(dlshare.PermissionDenied):
            self.client.publish(n, tensor(1.0))
        child.kill()
        self.assertTrue(wait_until(lambda: self.names() == 0))
        with self.assertRaises(dlshare.NotFound):
            self.client.stat(n)
        # The reader's tensor is still there until released.
        self.assertEqual(held.nbytes, 16)
        held.release()
        self.assertLeasesBecome(0)

    def test_ttl(self):
        n = self.name("ttl")
        self.client.publish(n, tensor(1.0), ttl=0.05)
        keep = self.name("keep")
        self.client.publish(keep, tensor(2.0), ttl=60)
        self.assertEqual(self.client.stat(keep).ttl_ms, 60000)
        self.assertTrue(wait_until(lambda: self.names() == 1))
        self.assertGreaterEqual(self.client.stats().expired, 1)
        with self.assertRaises(dlshare.LimitExceeded):
            self.client.publish(keep, tensor(3.0), ttl=61)
        with self.assertRaises(ValueError):
            self.client.publish(keep, tensor(3.0), ttl=0)
        self.client.delete(keep)

    def test_delete_prefix_and_uid_stats(self):
        for i in range(30):
            self.client.publish(self.name(f"p/{i}"), tensor(float(i)))
        self.client.publish(self.name("q"), tensor(0.0))
        st = self.client.stats()
        mine = [u for u in st.uids if u.uid == os.getuid()]
        self.assertEqual(len(mine), 1)
        self.assertEqual(mine[0].names, 31)
        self.assertGreaterEqual(st.nuids, 1)
        with self.assertRaises(ValueError):
            self.client.delete(self.name("p/"))
        with self.assertRaises(ValueError):
            self.client.delete(prefix="")
        self.assertEqual(self.client.delete(prefix=self.name("p/")), 30)
        self.assertEqual(self.names(), 1)
        self.client.delete(self.name("q"))


if __name__ == "__main__":
    unittest.main()
