"""Publish (copy) from torch and from NumPy, for dlbench's "publish"
section: the same memory published as a torch tensor (which hands out
explicit strides) and as a NumPy view of it, in turns, with a clone of
each beside as the frameworks' own copy.

    python3 bench/publish_sources.py --socket PATH --bytes B --iters N

Prints one line of key=value medians in ns: torch_ns, numpy_ns,
torch_clone_ns, numpy_copy_ns, n. Exits 77 without torch or NumPy (the
section then says so); runs against the dlshare package on PYTHONPATH.
"""

import argparse
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--bytes", type=int, default=256 << 20)
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    try:
        import numpy
        import torch
    except ImportError as e:
        print(f"publish_sources: {e}", file=sys.stderr)
        return 77
    import dlshare

    t = torch.full((args.bytes // 4,), 1.5, dtype=torch.float32)
    v = t.numpy()                         # the same memory, NumPy's view
    times = {"torch_ns": [], "numpy_ns": [], "torch_clone_ns": [],
             "numpy_copy_ns": []}
    runs = [("torch_ns", lambda c: c.publish("bench/src", t, copy=True)),
            ("numpy_ns", lambda c: c.publish("bench/src", v, copy=True)),
            ("torch_clone_ns", lambda c: t.clone()),
            ("numpy_copy_ns", lambda c: numpy.array(v, copy=True))]
    with dlshare.Client(args.socket) as c:
        for i in range(args.iters + 1):   # the first round warms up
            for k in range(len(runs)):
                key, fn = runs[(i + k) % len(runs)]
                t0 = time.perf_counter_ns()
                out = fn(c)
                dt = time.perf_counter_ns() - t0
                del out
                if i:
                    times[key].append(dt)
    print(" ".join(f"{k}={statistics.median(v):.0f}" for k, v in
                   times.items()) + f" n={args.iters}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
