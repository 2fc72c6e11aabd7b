"""Weight sync (issue 12): a state dict published as one version, copied
into existing tensors in place with load_state_dict, which checks keys,
shapes and dtypes first like torch's load_state_dict(strict=True); and
examples/weight_sync.py, a trainer and two followers, ending bit-exact."""

import os
import re
import sys
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

EXAMPLES = os.path.join(harness.HERE, "..", "..", "examples")


def numpy_state(seed, n=6):
    rng = np.random.default_rng(seed)
    sd = {}
    for i in range(n):
        sd[f"layers.{i}.weight"] = rng.standard_normal((8, 4 + i),
                                                       dtype=np.float32)
        sd[f"layers.{i}.bias"] = rng.standard_normal(8).astype(np.float64)
    sd["step"] = np.array(seed, np.int64)
    return sd


@unittest.skipIf(np is None, "NumPy is not installed for this interpreter")
class LoadStateDictTest(DaemonTest):
    def publish(self, sd):
        n = self.name()
        v = self.client.publish(n, sd)
        return n, v

    def test_copies_in_place_bit_exact(self):
        src = numpy_state(1)
        n, v = self.publish(src)
        dst = numpy_state(2)
        addrs = {k: a.ctypes.data for k, a in dst.items()}
        got = self.client.load_state_dict(n, dst)
        self.assertEqual(got, v)
        for k in src:
            self.assertEqual(dst[k].tobytes(), src[k].tobytes(), k)
            self.assertEqual(dst[k].ctypes.data, addrs[k], k)
        self.assertLeasesBecome(0)

    def test_bundle_copy_into_and_result(self):
        src = numpy_state(3)
        n, _ = self.publish(src)
        dst = numpy_state(4)
        with self.client.get(n) as b:
            r = b.copy_into(dst)
        self.assertEqual(r, dlshare.LoadResult([], []))
        self.assertTrue(all(np.array_equal(dst[k], src[k]) for k in src))

    def test_destinations_the_fast_path_cannot_take(self):
        """Host arrays of the version's dtype and shape are copied by the
        library in one call; the rest (a non-contiguous view, a read-only
        array, torch tensors where torch is there) by the general path,
        all in one load, and a mismatch among either kind copies
        nothing."""
        src = numpy_state(5)
        n, _ = self.publish(src)
        dst = numpy_state(6)
        wide = np.zeros((8, 2 * 5), np.float32)
        dst["layers.1.weight"] = wide[:, ::2]           # not contiguous
        if torch is not None:
            dst["layers.2.weight"] = torch.zeros(8, 6)  # a CPU tensor
        ro = np.zeros(8, np.float64)
        ro.setflags(write=False)
        dst["layers.3.bias"] = ro                       # read-only
        before = {k: np.asarray(a).tobytes() for k, a in dst.items()}
        with self.client.get(n) as b:
            with self.assertRaisesRegex(ValueError, "layers.3.bias"):
                b.copy_into(dst)                        # ro is refused
            self.assertNothingCopied(
                {k: np.asarray(a) for k, a in dst.items()}, before)
            dst["layers.3.bias"] = np.zeros(8, np.float64)
            dst["layers.4.bias"] = np.zeros(9, np.float64)  # wrong shape
            with self.assertRaisesRegex(dlshare.StateDictMismatch,
                                        "layers.4.bias"):
                b.copy_into(dst)
            dst["layers.4.bias"] = np.zeros(8, np.float64)
            b.copy_into(dst)
        for k in src:
            self.assertTrue(np.array_equal(np.asarray(dst[k]), src[k]), k)

    def assertNothingCopied(self, dst, before):
        for k in before:
            self.assertEqual(dst[k].tobytes(), before[k], k)

    def test_strict_names_missing_and_unexpected_keys(self):
        src = numpy_state(5)
        n, v = self.publish(src)
        dst = numpy_state(6)
        del dst["layers.2.bias"]                   # unexpected in the version
        dst["head.weight"] = np.zeros((2, 2), np.float32)   # missing there
        before = {k: a.tobytes() for k, a in dst.items()}
        with self.assertRaises(dlshare.StateDictMismatch) as cm:
            self.client.load_state_dict(n, dst)
        e = cm.exception
        self.assertIsInstance(e, dlshare.InvalidArgument)
        self.assertEqual(e.missing_keys, ["head.weight"])
        self.assertEqual(e.unexpected_keys, ["layers.2.bias"])
        msg = str(e)
        self.assertIn("'head.weight'", msg)
        self.assertIn("'layers.2.bias'", msg)
        self.assertIn(f"{n} v{v}", msg)
        self.assertIn("nothing copied", msg)
        self.assertNothingCopied(dst, before)
        # strict=False: the keys both have are copied, the rest reported.
        with self.client.get(n) as b:
            r = dlshare.load_state_dict(dst, b, strict=False)
        self.assertEqual(r.missing_keys, ["head.weight"])
        self.assertEqual(r.unexpected_keys, ["layers.2.bias"])
        self.assertTrue(np.array_equal(dst["layers.0.weight"],
                                       src["layers.0.weight"]))
        self.assertFalse(dst["head.weight"].any())

    def test_shape_and_dtype_mismatches_are_named(self):
        src = numpy_state(7)
        n, _ = self.publish(src)
        for strict in (True, False):
            dst = numpy_state(8)
            dst["layers.1.weight"] = np.zeros((8, 6), np.float32)  # (8, 5)
            dst["layers.3.bias"] = np.zeros(8, np.float32)         # float64
            before = {k: a.tobytes() for k, a in dst.items()}
            with self.subTest(strict=strict):
                with self.assertRaises(dlshare.StateDictMismatch) as cm:
                    self.client.load_state_dict(n, dst, strict=strict)
                e = cm.exception
                self.assertEqual(sorted(e.mismatched),
                                 ["layers.1.weight", "layers.3.bias"])
                self.assertIn("'layers.1.weight': the version has "
                              "float32[8, 5], the destination float32[8, 6]",
                              str(e))
                self.assertIn("'layers.3.bias': the version has float64[8], "
                              "the destination float32[8]", str(e))
                self.assertNothingCopied(dst, before)

    def test_single_tensor_version_and_arrays(self):
        n = self.name()
        self.client.publish(n, np.arange(5, dtype=np.int32), keys=["w"])
        dst = {"w": dlshare.empty(5, "int32")}
        self.client.load_state_dict(n, dst)
        self.assertEqual(list(np.asarray(dst["w"])), [0, 1, 2, 3, 4])
        with self.assertRaises(TypeError):
            dlshare.load_state_dict({"w": [0] * 5}, self.client.get(n))

    def test_bool_into_numpy(self):
        n = self.name()
        self.client.publish(n, {"m": np.array([True, False])})
        dst = {"m": np.zeros(2, bool)}
        self.client.load_state_dict(n, dst)
        self.assertEqual(dst["m"].tolist(), [True, False])

    def test_waits_for_a_newer_version(self):
        src = numpy_state(9)
        n, v = self.publish(src)
        with self.assertRaises(dlshare.Timeout):
            self.client.load_state_dict(n, numpy_state(9), newer_than=v,
                                        timeout=0.05)

    @unittest.skipIf(torch is None, "torch is not installed here")
    def test_torch_module_in_place(self):
        torch.manual_seed(0)
        trainer = torch.nn.Sequential(torch.nn.Linear(6, 4),
                                      torch.nn.BatchNorm1d(4))
        with torch.no_grad():
            for p in trainer.parameters():
                p.add_(1)
        n = self.name()
        self.client.publish(n, trainer.state_dict())
        follower = torch.nn.Sequential(torch.nn.Linear(6, 4),
                                       torch.nn.BatchNorm1d(4))
        ptrs = [p.data_ptr() for p in follower.state_dict().values()]
        self.client.load_state_dict(n, follower.state_dict())
        for (k, a), b in zip(trainer.state_dict().items(),
                             follower.state_dict().values()):
            self.assertTrue(torch.equal(a, b), k)
        self.assertEqual([p.data_ptr() for p in
                          follower.state_dict().values()], ptrs)
        # bool (torch 1.13 refuses DLPack's kDLBool) and 0-d tensors.
        m = self.name("mask")
        self.client.publish(m, {"mask": torch.tensor([True, False, True]),
                                "step": torch.tensor(7)})
        dst = {"mask": torch.zeros(3, dtype=torch.bool),
               "step": torch.tensor(0)}
        self.client.load_state_dict(m, dst)
        self.assertEqual(dst["mask"].tolist(), [True, False, True])
        self.assertEqual(int(dst["step"]), 7)
        # A dtype the version does not have: named, nothing copied.
        bad = {k: v.double() if k == "0.weight" else v
               for k, v in follower.state_dict().items()}
        with self.assertRaises(dlshare.StateDictMismatch) as cm:
            self.client.load_state_dict(n, bad)
        self.assertIn("'0.weight': the version has float32[4, 6], the "
                      "destination float64[4, 6]", str(cm.exception))


@unittest.skipIf(np is None, "the example needs NumPy")
class WeightSyncExampleTest(DaemonTest):
    def test_followers_end_bit_exact(self):
        path = os.path.join(EXAMPLES, "weight_sync.py")
        steps = 8
        r = harness.run_py(self.daemon, f"""
            import runpy, sys
            sys.argv = [{path!r}, "demo", "--steps", "{steps}",
                        "--interval", "0.02", "--name", {self.name()!r}]
            runpy.run_path({path!r}, run_name="__main__")
        """, seconds=120)
        lines = r.stdout.splitlines()
        m = re.fullmatch(r"trainer: 200 tensors, last version (\d+) "
                         r"sha256 ([0-9a-f]{16})", lines[0])
        self.assertTrue(m, r.stdout)
        self.assertEqual(int(m.group(1)), steps)
        followers = [re.fullmatch(r"follower (\d): version (\d+) sha256 "
                                  r"([0-9a-f]{16}) updates (\d+) in_place "
                                  r"(\w+)", x) for x in lines[1:]]
        self.assertEqual(len(followers), 2, r.stdout)
        for f in followers:
            self.assertTrue(f, r.stdout)
            self.assertEqual(int(f.group(2)), steps, r.stdout)
            self.assertEqual(f.group(3), m.group(2), r.stdout)   # bit-exact
            self.assertGreaterEqual(int(f.group(4)), 1)
            self.assertEqual(f.group(5), "True")
        self.assertLeasesBecome(0)


if __name__ == "__main__":
    unittest.main()
