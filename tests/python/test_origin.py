"""A version's origin from Python (protocol 1.5): create(origin=...) as a
relay written in Python would, and stat()/list() showing it."""

import unittest

import dlshare

from harness import DaemonTest


class OriginTest(DaemonTest):
    def test_stat_shows_origin(self):
        n = self.name("mirrored")
        w = self.client.create(n, ("float32", (4,)),
                               origin=("node-a", 17))
        w.seal()
        info = self.client.stat(n)
        self.assertEqual(info.origin_node, "node-a")
        self.assertEqual(info.origin_version, 17)
        [listed] = [i for i in self.client.list(n) if i.name == n]
        self.assertEqual(listed.origin_node, "node-a")
        self.assertEqual(listed.origin_version, 17)
        # A version made here has none; the newest version's is shown.
        self.client.publish(n, dlshare.empty((4,), "float32"))
        info = self.client.stat(n)
        self.assertIsNone(info.origin_node)
        self.assertEqual(info.origin_version, 0)

    def test_bad_origin_refused(self):
        n = self.name("bad")
        for node in ("x" * 65, "has space", ""):
            with self.assertRaises(ValueError) as cm:
                self.client.create(n, ("float32", (4,)), origin=(node, 1))
            self.assertIn("origin", str(cm.exception))
        with self.assertRaises(dlshare.NotFound):
            self.client.stat(n)


if __name__ == "__main__":
    unittest.main()
