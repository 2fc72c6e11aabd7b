"""Queue names with PyTorch's own DataLoader (Debian's python3-torch 1.13):
4 forked workers write batches in place into one queue name, a trainer
slower than they are takes them. Checked: every batch arrives exactly once,
bit for bit; each worker's batches arrive in the order the sampler gave
them to that worker (what a queue promises: each producer's order); the
queue never holds more than its depth; and the recipe's reorder buffer
(examples/dataloader_queue.py) gives back the sampler's own order. Skipped
without torch. Also the Python API of queues, with NumPy."""

import os
import sys
import threading
import time
import unittest

import dlshare
import harness
from harness import DaemonTest

try:
    import torch
    from torch.utils.data import DataLoader, Dataset, get_worker_info
except ImportError:
    torch = None

EXAMPLES = os.path.join(harness.HERE, "..", "..", "examples")

BATCH, FEATURES = 8, 64
WORKERS, PREFETCH = 4, 2
DEPTH = PREFETCH * WORKERS + 2
NBATCHES = 48

_client = None


def _worker_init(worker_id):
    global _client
    _client = dlshare.Client()        # DLSHARE_SOCKET names the daemon


def _batch(index):
    g = torch.Generator().manual_seed(1000 + index)
    return (torch.randn(BATCH, FEATURES, generator=g),
            torch.randint(0, 1 << 40, (BATCH,), generator=g))


if torch is not None:
    class _Batches(Dataset):
        def __init__(self, queue):
            self.queue = queue

        def __len__(self):
            return NBATCHES

        def __getitem__(self, index):
            x, y = _batch(index)
            w = _client.create(self.queue, ("x", "float32", x.shape),
                               ("y", "int64", y.shape),
                               ("meta", "int64", (2,)),
                               queue=DEPTH, wait=dlshare.WAIT_FOREVER)
            torch.from_dlpack(w["x"]).copy_(x)
            torch.from_dlpack(w["y"]).copy_(y)
            torch.from_dlpack(w["meta"]).copy_(
                torch.tensor([index, get_worker_info().id]))
            w.seal()
            return index


@unittest.skipIf(torch is None, "torch is not installed for this interpreter "
                 "(Debian: apt install python3-torch)")
class DataLoaderQueueTest(DaemonTest):
    def setUp(self):
        super().setUp()
        self._socket = os.environ.get("DLSHARE_SOCKET")
        os.environ["DLSHARE_SOCKET"] = self.daemon.socket

    def tearDown(self):
        if self._socket is None:
            os.environ.pop("DLSHARE_SOCKET", None)
        else:
            os.environ["DLSHARE_SOCKET"] = self._socket
        super().tearDown()

    def _loader(self, queue, sampler):
        return DataLoader(_Batches(queue), batch_size=None, sampler=sampler,
                          num_workers=WORKERS, prefetch_factor=PREFETCH,
                          worker_init_fn=_worker_init,
                          multiprocessing_context="fork")

    def test_workers_to_slow_trainer(self):
        q = self.name()
        g = torch.Generator().manual_seed(7)
        sampler = torch.randperm(NBATCHES, generator=g).tolist()
        loader = self._loader(q, sampler)
        returned = []                  # the DataLoader's own, in order
        # The workers fork here, while no thread is inside dlshare.
        batches = iter(loader)
        feeder = threading.Thread(target=lambda: returned.extend(batches))
        feeder.start()
        got, by_worker, most = [], {}, 0
        try:
            for _ in range(NBATCHES):
                b = self.client.take_bundle(q, timeout=harness.timeout(60))
                with b:
                    index, worker = torch.from_dlpack(b["meta"]).tolist()
                    x, y = _batch(index)
                    self.assertTrue(torch.equal(torch.from_dlpack(b["x"]), x))
                    self.assertTrue(torch.equal(torch.from_dlpack(b["y"]), y))
                got.append(index)
                by_worker.setdefault(worker, []).append(index)
                qi = self.client.queue_info(q)
                most = max(most, qi.queued + qi.taken + qi.pending)
                time.sleep(0.01)       # the trainer is the slow one
        finally:
            feeder.join(harness.timeout(60))
        self.assertFalse(feeder.is_alive())
        # Exactly once, every batch.
        self.assertEqual(sorted(got), list(range(NBATCHES)))
        # The DataLoader's own reassembly: the sampler's order.
        self.assertEqual(returned, sampler)
        # Each worker's batches in the sampler's order, as the queue
        # promises: a subsequence of it.
        pos = {index: i for i, index in enumerate(sampler)}
        self.assertEqual(len(by_worker), WORKERS)
        for worker, indices in by_worker.items():
            self.assertEqual(indices, sorted(indices, key=pos.get), worker)
        # Memory stays bounded by the depth, however slow the trainer.
        self.assertLessEqual(most, DEPTH)
        self.assertEqual(self.client.queue_info(q).queued, 0)
        self.client.delete(q)
        self.assertLeasesBecome(0)

    def test_recipe_restores_sampler_order(self):
        sys.path.insert(0, EXAMPLES)
        try:
            import dataloader_queue as recipe
        finally:
            sys.path.pop(0)
        q = self.name()
        sampler = torch.randperm(NBATCHES,
                                 generator=torch.Generator().manual_seed(3))
        sampler = sampler.tolist()
        old = recipe.QUEUE
        recipe.QUEUE = q
        try:
            loader = DataLoader(recipe.Batches(NBATCHES), batch_size=None,
                                sampler=sampler, num_workers=WORKERS,
                                prefetch_factor=recipe.PREFETCH,
                                worker_init_fn=recipe.worker_init_fn,
                                multiprocessing_context="fork")
            order = []
            for index, b in recipe.batches_in_order(
                    self.client, loader, NBATCHES,
                    timeout=harness.timeout(60)):
                with b:
                    x, y = recipe.make_batch(index)
                    self.assertTrue(torch.equal(torch.from_dlpack(b["x"]), x))
                    self.assertTrue(torch.equal(torch.from_dlpack(b["y"]), y))
                order.append(index)
        finally:
            recipe.QUEUE = old
        self.assertEqual(order, sampler)
        self.client.delete(q)
        self.assertLeasesBecome(0)


class QueueApiTest(DaemonTest):
    def test_take_publish_and_errors(self):
        import numpy as np
        q = self.name()
        for i in range(3):
            self.client.publish(q, np.full(4, i, dtype=np.int32), queue=3)
        info = self.client.queue_info(q)
        self.assertEqual((info.depth, info.queued, info.taken), (3, 3, 0))
        listed = [n for n in self.client.list(q) if n.name == q][0]
        self.assertEqual(listed.queue.depth, 3)
        self.assertEqual(listed.queue.queued, 3)
        # Full: at once, or after a wait; the message names the queue.
        with self.assertRaises(dlshare.LimitExceeded) as cm:
            self.client.publish(q, np.zeros(4, dtype=np.int32), queue=3)
        self.assertIn(q, str(cm.exception))
        self.assertIn("depth 3", str(cm.exception))
        with self.assertRaises(dlshare.Timeout):
            self.client.publish(q, np.zeros(4, dtype=np.int32), queue=3,
                                wait=0.05)
        # get reads ordinary names only; an ordinary create is refused.
        with self.assertRaises(dlshare.InvalidArgument):
            self.client.get(q)
        with self.assertRaises(dlshare.InvalidArgument):
            self.client.publish(q, np.zeros(4, dtype=np.int32))
        with self.assertRaises(ValueError):
            self.client.publish(q, np.zeros(4, dtype=np.int32), wait=1)
        for i in range(3):
            t = self.client.take(q)
            self.assertEqual(np.from_dlpack(t).tolist(), [i] * 4)
            t.release()
        with self.assertRaises(dlshare.NotFound):
            self.client.take(q)
        with self.assertRaises(dlshare.Timeout):
            self.client.take(q, timeout=0.05)
        # queue=True: any depth of an existing queue name.
        w = self.client.create(q, ("float32", (2,)), queue=True)
        w.seal()
        self.client.delete(q)
        self.assertLeasesBecome(0)


if __name__ == "__main__":
    unittest.main()
