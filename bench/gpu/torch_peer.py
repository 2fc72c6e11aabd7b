#!/usr/bin/env python3
"""torch_peer — torch.multiprocessing as the peer of dlshare's GPU handoff.

Run by dlshare-gpubench (bench/gpu/gpubench.c), which reads its stdout:
"sample KEY VALUE" per timed repeat, "info TEXT", or "skip TEXT" (no torch,
or no CUDA in it) and exit 0. Exit status 3: the consumer read wrong data;
1: something failed (said on stderr).

Figures, the same shape as dlshare's handoff:
  torch_floor    one process: fill_ an int64 tensor of --bytes with a value,
                 then torch.aminmax of it (one write and one read of every
                 byte), to the stream's completion.
  torch_handoff  the producer (this process) fill_s the tensor with the
                 repeat's value and puts it on a torch.multiprocessing Queue
                 (spawn context; CUDA IPC with an interprocess event, as
                 torch shares CUDA tensors); a consumer process waiting in
                 Queue.get runs aminmax on it and synchronises its stream.
                 From before the fill_ to after that synchronisation
                 (CLOCK_MONOTONIC, comparable across processes).
min == max == value checks every element bit for bit. The consumer drops
the tensor after each repeat, as dlshare's "cold" handoff does.

  python3 torch_peer.py --bytes 1073741824 --repeats 10
  python3 torch_peer.py --device cpu --bytes 1048576   # the logic, no GPU
"""
import argparse
import ctypes
import queue
import signal
import sys
import time


def out(line):
    print(line, flush=True)


def die_with_parent():
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def value(r):
    """The int64 every element holds in repeat r (the warm-up is -1)."""
    return (0x0123456789ABCDEF ^ ((r + 2) * 0x9E3779B97F4A7C15)) & 0x7FFFFFFFFFFFFFFF


def minmax(torch, x):
    if hasattr(torch, "aminmax"):
        return torch.aminmax(x)
    return x.min(), x.max()


def sync(torch, dev):
    if dev.type == "cuda":
        torch.cuda.current_stream(dev).synchronize()


def consumer(q, back, device, timeout):
    die_with_parent()
    try:
        import torch

        dev = torch.device(device)
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
            torch.cuda.init()
        while True:
            back.put(("ready",))
            item = q.get(timeout=timeout)
            if item is None:
                break
            r, x = item
            mn, mx = minmax(torch, x)
            sync(torch, dev)
            t1 = time.monotonic_ns()
            ok = int(mn) == value(r) and int(mx) == value(r)
            del x, mn, mx, item
            back.put(("done", r, t1, ok))
    except Exception as e:  # reported by the producer
        back.put(("error", repr(e)))


def expect(back, proc, timeout, what):
    end = time.monotonic() + timeout
    while True:
        try:
            msg = back.get(timeout=1.0)
        except queue.Empty:
            if not proc.is_alive():
                raise RuntimeError(f"the consumer exited ({proc.exitcode}) before '{what}'")
            if time.monotonic() > end:
                raise RuntimeError(f"no '{what}' from the consumer within {timeout} s")
            continue
        if msg[0] == "error":
            raise RuntimeError("consumer: " + msg[1])
        if msg[0] != what:
            raise RuntimeError(f"consumer sent {msg[0]!r}, want {what!r}")
        return msg


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bytes", type=int, default=1 << 30)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()

    try:
        import torch
        import torch.multiprocessing as tmp
    except Exception as e:
        out(f"skip no torch in {sys.executable} ({type(e).__name__}: {e})")
        return 0
    dev = torch.device(a.device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            out(f"skip torch {torch.__version__} in {sys.executable}: "
                "torch.cuda.is_available() is False")
            return 0
        torch.cuda.set_device(dev)
        dev = torch.device("cuda", torch.cuda.current_device())
        out(f"info torch {torch.__version__} (CUDA {torch.version.cuda}) on "
            f"{torch.cuda.get_device_name(dev)}, {sys.executable}")
    else:
        out(f"info torch {torch.__version__} on {dev} (no GPU: the logic only)")

    n = a.bytes // 8
    buf = torch.empty(n, dtype=torch.int64, device=dev)

    for r in range(-1, a.repeats):
        v = value(r)
        t0 = time.monotonic_ns()
        buf.fill_(v)
        mn, mx = minmax(torch, buf)
        sync(torch, dev)
        t1 = time.monotonic_ns()
        if int(mn) != v or int(mx) != v:
            print(f"torch_peer: DATA MISMATCH in the floor, repeat {r}", file=sys.stderr)
            return 3
        if r >= 0:
            out(f"sample torch_floor {(t1 - t0) / 1e6:.6f}")

    ctx = tmp.get_context("spawn")
    q, back = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=consumer, args=(q, back, str(dev), a.timeout), daemon=True)
    proc.start()
    rc = 0
    try:
        for r in range(-1, a.repeats):
            expect(back, proc, a.timeout, "ready")
            time.sleep(0.002)  # let the consumer block in Queue.get
            t0 = time.monotonic_ns()
            buf.fill_(value(r))
            q.put((r, buf))
            _, rr, t1, ok = expect(back, proc, a.timeout, "done")
            if rr != r:
                raise RuntimeError(f"consumer answered repeat {rr}, want {r}")
            if not ok:
                print(f"torch_peer: DATA MISMATCH: the consumer read other values "
                      f"than repeat {r}'s", file=sys.stderr)
                rc = 3
                break
            if r >= 0:
                out(f"sample torch_handoff {(t1 - t0) / 1e6:.6f}")
        else:
            expect(back, proc, a.timeout, "ready")
    except RuntimeError as e:
        print(f"torch_peer: {e}", file=sys.stderr)
        rc = 1
    q.put(None)
    proc.join(a.timeout if rc == 0 else 5)
    if proc.is_alive():
        proc.kill()
        proc.join()
    # The consumer let go of every tensor before it exited: buf may go.
    return rc


if __name__ == "__main__":
    sys.exit(main())
