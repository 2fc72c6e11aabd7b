"""A data-loader worker: publishes a batch (images and labels) as a new
version of batch/WORKER, twice a second.

    python3 examples/producer.py [WORKER] [COUNT]

Store mode: the worker writes straight into the daemon's buffer (no copy),
and each sealed batch outlives the worker. Start dlshared first; both find
the socket by the same default rule. Needs NumPy.
"""
import sys
import time

import numpy as np

import dlshare

worker = sys.argv[1] if len(sys.argv) > 1 else "0"
count = int(sys.argv[2]) if len(sys.argv) > 2 else 5
rng = np.random.default_rng(int(worker) if worker.isdigit() else 0)

with dlshare.Client() as client:
    for step in range(count):
        with client.create(f"batch/{worker}",
                           ("images", "float32", (32, 3, 64, 64)),
                           ("labels", "int64", (32,))) as batch:
            rng.standard_normal(out=np.asarray(batch["images"]),
                                dtype=np.float32)
            np.asarray(batch["labels"])[:] = rng.integers(0, 10, 32)
        # Leaving the with-block sealed it: immutable and visible now.
        print(f"worker {worker}: batch/{worker} version {batch.version}",
              flush=True)
        if step + 1 < count:
            time.sleep(0.5)
