"""Weight sync: a trainer publishes its whole model every step as one
version; inference processes follow the newest version and copy it into
their own model in place (same tensors, same memory: nothing reallocated).

    python3 examples/weight_sync.py demo [--steps 20] [--followers 2]
    python3 examples/weight_sync.py trainer [--steps 20] [--name weights/demo]
    python3 examples/weight_sync.py follower [--id 0] [--name weights/demo]

demo starts the trainer and the followers, each a process of its own,
against the running dlshared (DLSHARE_SOCKET or the default socket) and
prints what each ended with. The model is 50 blocks of Linear(64, 64) +
LayerNorm(64): 200 tensors. With PyTorch it is a torch.nn.Module (CPU),
else NumPy arrays of the same shapes (--numpy forces that).

The trainer publishes ``model.state_dict()`` as one bundle per step and, at
the end, the last version's number as NAME.done. A follower waits for each
version newer than the one it has (``newer_than``), copies it into its
model with ``client.load_state_dict`` (keys, shapes and dtypes checked like
torch's ``load_state_dict(strict=True)``), and stops once it holds the
version NAME.done names. Each prints a SHA-256 of its final weights: they
match, bit for bit.
"""

import argparse
import hashlib
import os
import subprocess
import sys
import time

import dlshare

BLOCKS, WIDTH = 50, 64


def use_torch(args):
    if args.numpy:
        return False
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


def make_model(torch_backend, seed):
    """The model and its state dict (the tensors that are its weights)."""
    if torch_backend:
        import torch
        torch.manual_seed(seed)
        layers = []
        for _ in range(BLOCKS):
            layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.LayerNorm(WIDTH)]
        model = torch.nn.Sequential(*layers)
        return model, model.state_dict()
    import numpy as np
    rng = np.random.default_rng(seed)
    sd = {}
    for b in range(BLOCKS):
        sd[f"{2 * b}.weight"] = rng.standard_normal((WIDTH, WIDTH),
                                                    dtype=np.float32)
        sd[f"{2 * b}.bias"] = rng.standard_normal(WIDTH, dtype=np.float32)
        sd[f"{2 * b + 1}.weight"] = np.ones(WIDTH, np.float32)
        sd[f"{2 * b + 1}.bias"] = np.zeros(WIDTH, np.float32)
    return None, sd


def train_step(torch_backend, sd, step):
    """Stands in for an optimizer step: changes every weight in place."""
    if torch_backend:
        import torch
        g = torch.Generator().manual_seed(step)
        with torch.no_grad():
            for p in sd.values():
                p.add_(torch.randn(p.shape, generator=g) * 0.01)
    else:
        import numpy as np
        rng = np.random.default_rng(step)
        for p in sd.values():
            p += rng.standard_normal(p.shape, dtype=np.float32) * 0.01


def digest(torch_backend, sd):
    h = hashlib.sha256()
    for k in sorted(sd):
        v = sd[k]
        h.update(k.encode())
        h.update((v.numpy() if torch_backend else v).tobytes())
    return h.hexdigest()[:16]


def addresses(torch_backend, sd):
    return [v.data_ptr() if torch_backend else v.ctypes.data
            for v in sd.values()]


def trainer(args):
    tb = use_torch(args)
    _, sd = make_model(tb, seed=1)
    with dlshare.Client() as client:
        version = 0
        for step in range(args.steps):
            train_step(tb, sd, step)
            version = client.publish(args.name, sd)
            time.sleep(args.interval)
        import numpy as np
        client.publish(args.name + ".done", np.array([version], np.int64))
    print(f"trainer: {len(sd)} tensors, last version {version} "
          f"sha256 {digest(tb, sd)}", flush=True)


def last_version(client, name):
    """The version NAME.done names, or None while the trainer runs."""
    try:
        t = client.get(name + ".done")
    except dlshare.NotFound:
        return None
    import numpy as np
    with t:
        return int(np.asarray(t)[0])     # read-only, through __array__


def follower(args):
    tb = use_torch(args)
    _, sd = make_model(tb, seed=100 + args.id)    # other weights at first
    before = addresses(tb, sd)
    have, updates = 0, 0
    with dlshare.Client() as client:
        while True:
            try:
                have = client.load_state_dict(args.name, sd, newer_than=have,
                                              timeout=0.2)
                updates += 1
            except dlshare.Timeout:
                pass
            last = last_version(client, args.name)
            if last is not None and have >= last:
                break
    in_place = addresses(tb, sd) == before
    print(f"follower {args.id}: version {have} sha256 {digest(tb, sd)} "
          f"updates {updates} in_place {in_place}", flush=True)


def demo(args):
    me = [sys.executable, os.path.abspath(__file__)]
    common = ["--name", args.name] + (["--numpy"] if args.numpy else [])
    followers = [subprocess.Popen(me + ["follower", "--id", str(i)] + common,
                                  stdout=subprocess.PIPE, text=True)
                 for i in range(args.followers)]
    t = subprocess.run(me + ["trainer", "--steps", str(args.steps),
                             "--interval", str(args.interval)] + common,
                       stdout=subprocess.PIPE, text=True, check=True)
    print(t.stdout, end="")
    rc = 0
    for f in followers:
        out, _ = f.communicate(timeout=120)
        print(out, end="")
        rc |= f.returncode
    return rc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("role", choices=["demo", "trainer", "follower"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--followers", type=int, default=2)
    ap.add_argument("--interval", type=float, default=0.05,
                    help="seconds between the trainer's steps")
    ap.add_argument("--id", type=int, default=0)
    ap.add_argument("--name", default="weights/demo")
    ap.add_argument("--numpy", action="store_true",
                    help="NumPy arrays even where torch is installed")
    args = ap.parse_args()
    return {"demo": demo, "trainer": trainer, "follower": follower}[
        args.role](args) or 0


if __name__ == "__main__":
    sys.exit(main())
