#!/usr/bin/env python3
"""PyTorch DataLoader workers hand batches to the trainer through a dlshare
queue name: every batch once, each worker's batches in its order, and the
workers slow down (the queue's depth) when the trainer falls behind.

    dlshared &                      # or the systemd service
    python3 examples/dataloader_queue.py [--batches N] [--workers W]

Each worker makes its own Client in worker_init_fn (a Client belongs to the
process that made it), writes a batch in place into a daemon buffer
(create, write, seal) and hands the DataLoader only the batch's index. The
trainer takes the batches from the queue. A queue keeps each producer's
order, not the sampler's order across workers; the trainer puts the
sampler's order back with a small reorder buffer, which never deadlocks
while the queue's depth is larger than what the DataLoader dispatches ahead
(prefetch_factor * num_workers).
"""
import argparse
import threading

import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

import dlshare

QUEUE = "example/batches"
BATCH, FEATURES = 32, 128
WORKERS, PREFETCH = 4, 2
DEPTH = PREFETCH * WORKERS + 4       # > what the DataLoader runs ahead

_client = None                       # one per worker process


def worker_init_fn(worker_id):
    global _client
    _client = dlshare.Client()


def make_batch(index):
    """The batch of index: deterministic, so the trainer can check it."""
    g = torch.Generator().manual_seed(index)
    x = torch.randn(BATCH, FEATURES, generator=g)
    y = torch.randint(0, 10, (BATCH,), generator=g)
    return x, y


class Batches(Dataset):
    """Item i is batch i; the DataLoader gets only its index back."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        x, y = make_batch(index)
        w = _client.create(QUEUE, ("x", "float32", x.shape),
                           ("y", "int64", y.shape), ("index", "int64", ()),
                           ("worker", "int64", ()),
                           queue=DEPTH, wait=dlshare.WAIT_FOREVER)
        # Written in place in the daemon's buffer: no other copy.
        torch.from_dlpack(w["x"]).copy_(x)
        torch.from_dlpack(w["y"]).copy_(y)
        torch.from_dlpack(w["index"]).fill_(index)
        torch.from_dlpack(w["worker"]).fill_(get_worker_info().id)
        w.seal()
        return index


def batches_in_order(client, loader, n, timeout=60):
    """Yields (index, bundle) in the sampler's order. The DataLoader runs in
    a thread of its own (it returns indices, in the sampler's order, once
    their batches are sealed); the trainer takes batches as they come and
    holds the early ones until their turn."""
    order = []
    # The workers fork here, before any thread of ours is inside dlshare.
    batches = iter(loader)
    feeder = threading.Thread(target=lambda: order.extend(batches),
                              daemon=True)
    feeder.start()
    early = {}                       # index -> bundle, taken early
    for _ in range(n):
        b = client.take_bundle(QUEUE, timeout=timeout)
        early[int(torch.from_dlpack(b["index"]))] = b
        while order and order[0] in early:
            index = order.pop(0)
            yield index, early.pop(index)
    feeder.join()
    for index in order:
        yield index, early.pop(index)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=64)
    ap.add_argument("--workers", type=int, default=WORKERS)
    args = ap.parse_args()

    with dlshare.Client() as client:
        loader = DataLoader(Batches(args.batches), batch_size=None,
                            shuffle=True, num_workers=args.workers,
                            prefetch_factor=PREFETCH,
                            worker_init_fn=worker_init_fn)
        seen = 0
        for index, b in batches_in_order(client, loader, args.batches):
            with b:                  # its release consumes the batch
                x = torch.from_dlpack(b["x"])
                y = torch.from_dlpack(b["y"])
                ex, ey = make_batch(index)
                assert torch.equal(x, ex) and torch.equal(y, ey), index
                del x, y             # torch's views hold the lease too
                seen += 1
        client.delete(QUEUE)
        print(f"trained on {seen} batches, each once, in sampler order")


if __name__ == "__main__":
    main()
