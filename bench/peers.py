"""dlshare against its peers, for dlbench's "peers" section (issue 12).

    python3 bench/peers.py torch_mp --socket PATH [--tensors N] [--iters N]
    python bench/peers.py safetensors --socket PATH [--tensors N] [--iters N]

torch_mp (Debian's python3 with torch): a state dict of N tensors
(float32[1024], 4 KiB each, ~60-byte keys) handed from this process to a
forked consumer, end to end per iteration (producer-side start to
consumer-side every tensor reachable as a torch tensor, its data pointer
read), by dlshare (Client.publish of the dict; the consumer's
Client.get(newer_than=...) and torch.from_dlpack of each) and by
torch.multiprocessing (share_memory_() of each + a torch.multiprocessing
Queue carrying the dict; the consumer reads each tensor's data pointer).
Each iteration hands over fresh tensors (clones made before the clock
starts): share_memory_() of a tensor already shared costs nothing.

safetensors (a python with NumPy and PyPI safetensors): a consumer gets a
version of N tensors (float32[16], ~60-byte keys) until every tensor is a
NumPy array (numpy.from_dlpack), against opening the same tensors as a
safetensors file in /dev/shm with safe_open(framework="numpy") and
get_tensor of every key.

load_state_dict (a python with NumPy): the version of N float32[16]
tensors got warm and copied into an existing dict of N NumPy arrays with
dlshare.load_state_dict (strict: every key, shape and dtype checked), as
an inference process updating its model does; the clock covers the get and
the copy. Prints load_ns=... per repeat (for dlbench's "bundle" section).

Prints one line per repeat, key=value in ns (the two sides alternate which
goes first). Exits 77 when torch, NumPy or safetensors is missing (the
section then says so); runs against the dlshare package on PYTHONPATH.
"""

import argparse
import os
import resource
import sys
import time

NAME = "bench/peers"


def keys(n):
    """~60-byte keys shaped like a large model's."""
    out = []
    for i in range(n):
        layer, expert = divmod(i, 128)
        proj = ("down_proj", "gate_proj")[expert & 1]
        out.append(f"model.layers.{layer}.mlp.experts.{expert >> 1}."
                   f"{proj}.weight.shard{i % 10:02d}")
    return out


def now():
    return time.monotonic_ns()   # CLOCK_MONOTONIC: one clock for both sides


# ---- torch_mp ---------------------------------------------------------------

def dl_consumer(sock, iters, conn):
    import torch
    import dlshare
    with dlshare.Client(sock) as c:
        last = 0
        conn.send("ready")
        for _ in range(iters):
            b = c.get(NAME, newer_than=last, timeout=120)
            for t in b:
                torch.from_dlpack(t).data_ptr()
            t1 = now()
            last = b.version
            b.release()
            del b
            conn.send(t1)


def mp_consumer(q, iters, conn):
    conn.send("ready")
    for _ in range(iters):
        d = q.get()
        for v in d.values():
            v.data_ptr()
        t1 = now()
        del d
        conn.send(t1)


def recv(conn, procs):
    """The consumer's next message; fails when a consumer died first."""
    while not conn.poll(1.0):
        for p in procs:
            if not p.is_alive():
                raise SystemExit(f"peers: consumer {p.name} exited "
                                 f"({p.exitcode})")
    return conn.recv()


def torch_mp(args):
    try:
        import torch
        import torch.multiprocessing as tmp
    except ImportError as e:
        print(f"peers: {e}", file=sys.stderr)
        return 77
    import dlshare

    # file_descriptor sharing (torch's default) holds two fds a storage
    # in the producer until the consumer has them: 2*10^4 is past our
    # hard RLIMIT_NOFILE (EMFILE). file_system, torch's advice for many
    # tensors, passes /dev/shm names instead; the limit is still raised.
    tmp.set_sharing_strategy(args.strategy)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 4 * args.tensors + 1024) if hard >= 0 else \
        4 * args.tensors + 1024
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    ks = keys(args.tensors)
    base = torch.randn(args.tensors, 1024)
    rounds = args.iters + 1              # the first round warms up

    def fresh():
        return {k: base[i].clone() for i, k in enumerate(ks)}

    ctx = tmp.get_context("fork")        # before this process has a Client
    q = ctx.Queue()
    dl_r, dl_w = ctx.Pipe(duplex=False)
    mp_r, mp_w = ctx.Pipe(duplex=False)
    pd = ctx.Process(target=dl_consumer, args=(args.socket, rounds, dl_w))
    pm = ctx.Process(target=mp_consumer, args=(q, rounds, mp_w))
    pd.start()
    pm.start()
    procs = (pd, pm)
    assert recv(dl_r, procs) == "ready" and recv(mp_r, procs) == "ready"
    times = {"dlshare_ns": [], "torch_mp_ns": []}
    with dlshare.Client(args.socket) as c:
        for i in range(rounds):
            for side in ((0, 1) if i % 2 == 0 else (1, 0)):
                sd = fresh()
                if side == 0:
                    t0 = now()
                    c.publish(NAME, sd)
                    t1 = recv(dl_r, procs)
                    key = "dlshare_ns"
                else:
                    t0 = now()
                    for v in sd.values():
                        v.share_memory_()
                    q.put(sd)
                    t1 = recv(mp_r, procs)
                    key = "torch_mp_ns"
                del sd
                if i:
                    times[key].append(t1 - t0)
        c.delete(NAME)
    pd.join(60)
    pm.join(60)
    for a, b in zip(times["dlshare_ns"], times["torch_mp_ns"]):
        print(f"dlshare_ns={a} torch_mp_ns={b} n={args.tensors} "
              f"strategy={args.strategy}")
    return 0


# ---- safetensors --------------------------------------------------------------

def safetensors_side(args):
    try:
        import numpy
        from safetensors import safe_open
        from safetensors.numpy import save_file
    except ImportError as e:
        print(f"peers: {e}", file=sys.stderr)
        return 77
    import dlshare

    ks = keys(args.tensors)
    rng = numpy.random.default_rng(1)
    base = rng.standard_normal((args.tensors, 16), dtype=numpy.float32)
    sd = {k: base[i] for i, k in enumerate(ks)}
    path = f"/dev/shm/dlshare-bench-peers-{os.getpid()}.safetensors"
    save_file(sd, path)
    times = {"dlshare_ns": [], "safetensors_ns": []}
    try:
        with dlshare.Client(args.socket) as c:
            c.publish(NAME, sd)
            del sd
            for i in range(args.iters + 1):
                for side in ((0, 1) if i % 2 == 0 else (1, 0)):
                    if side == 0:
                        t0 = now()
                        b = c.get(NAME)
                        arrs = [numpy.from_dlpack(t) for t in b]
                        t1 = now()
                        key = "dlshare_ns"
                    else:
                        t0 = now()
                        with safe_open(path, framework="numpy") as f:
                            arrs = [f.get_tensor(k) for k in f.keys()]
                        t1 = now()
                        key = "safetensors_ns"
                    assert len(arrs) == args.tensors
                    del arrs
                    if side == 0:
                        b.release()
                        del b
                    if i:
                        times[key].append(t1 - t0)
    finally:
        os.unlink(path)
    for a, b in zip(times["dlshare_ns"], times["safetensors_ns"]):
        print(f"dlshare_ns={a} safetensors_ns={b} n={args.tensors}")
    return 0


# ---- load_state_dict ----------------------------------------------------------

def load_side(args):
    try:
        import numpy
    except ImportError as e:
        print(f"peers: {e}", file=sys.stderr)
        return 77
    import dlshare

    ks = keys(args.tensors)
    rng = numpy.random.default_rng(2)
    base = rng.standard_normal((args.tensors, 16), dtype=numpy.float32)
    dst = {k: numpy.zeros(16, numpy.float32) for k in ks}
    times = []
    with dlshare.Client(args.socket) as c:
        c.publish(NAME + "-load", {k: base[i] for i, k in enumerate(ks)})
        for i in range(args.iters + 1):
            t0 = now()
            with c.get(NAME + "-load") as b:
                dlshare.load_state_dict(dst, b)
            t1 = now()
            if i:
                times.append(t1 - t0)
        assert numpy.array_equal(dst[ks[-1]], base[-1])
        c.delete(NAME + "-load")
    for t in times:
        print(f"load_ns={t} n={args.tensors}")
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("part", choices=("torch_mp", "safetensors",
                                     "load_state_dict"))
    ap.add_argument("--socket", required=True)
    ap.add_argument("--tensors", type=int)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--strategy", default="file_system",
                    help="torch.multiprocessing sharing strategy")
    args = ap.parse_args()
    if args.part == "torch_mp":
        args.tensors = args.tensors or 10000
        return torch_mp(args)
    args.tensors = args.tensors or 100000
    if args.part == "load_state_dict":
        return load_side(args)
    return safetensors_side(args)


if __name__ == "__main__":
    sys.exit(main())
