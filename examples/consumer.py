"""A trainer: takes each new batch that worker WORKER publishes, zero-copy,
with PyTorch (or NumPy when torch is not installed).

    python3 examples/consumer.py [WORKER] [COUNT]

The arrays map the daemon's memory read-only; dropping them releases the
lease, so the daemon can free old batches.
"""
import sys

import dlshare

try:
    from torch import from_dlpack
except ImportError:
    from numpy import from_dlpack

worker = sys.argv[1] if len(sys.argv) > 1 else "0"
count = int(sys.argv[2]) if len(sys.argv) > 2 else 5

seen = 0
with dlshare.Client() as client:
    for _ in range(count):
        # Waits (up to 10 s) for a batch newer than the last one seen.
        try:
            batch = client.get(f"batch/{worker}", newer_than=seen, timeout=10)
        except dlshare.Timeout:
            print(f"no batch newer than {seen} for 10 s: stopping")
            break
        images = from_dlpack(batch["images"])
        labels = from_dlpack(batch["labels"])
        seen = batch.version
        print(f"version {seen}: images {tuple(images.shape)} "
              f"mean {float(images.mean()):+.3f}, "
              f"labels {labels[:6].tolist()}", flush=True)
        del images, labels, batch   # the lease goes with the last of them
