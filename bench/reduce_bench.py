"""Reductions as a user calls them, wall clock per call plus ``synchronize()``
(median of REPS), beside the same call in PyTorch on CUDA in the same process
(TF32 off) when it has a GPU: whole-tensor sums and means, a column sum of a
tall matrix, a row sum, max, and a loss written out (``log_softmax(x).sum()``
with its backward). CPU adapters (lavapipe) run every size divided by 64.

    python bench/reduce_bench.py [LABEL] [REPS]     # on the GPU machine after the prelude
"""

import statistics
import sys
import time

import numpy as np

import pywgtrain as pw
import pywgtrain.functions as F
from pywgtrain.benchmarks.common import _torch_cuda, is_cpu_adapter


def timed(fn, sync, reps):
    fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main():
    label = sys.argv[1] if len(sys.argv) > 1 else "tree"
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    dev = pw.default_device()
    torch = _torch_cuda()
    div = 64 if is_cpu_adapter(dev) else 1
    rng = np.random.default_rng(0)
    shapes = {"big": (8192 // div, 50304), "tall": ((1 << 20) // div, 16), "mid": (4096, 4096 // div)}
    data = {k: rng.standard_normal(s, dtype=np.float32) for k, s in shapes.items()}
    ours = {k: pw.tensor(v, dev) for k, v in data.items()}
    theirs = {k: torch.from_numpy(v).cuda() for k, v in data.items()} if torch is not None else None
    big_grad = pw.tensor(data["big"], dev, requires_grad=True)
    big_grad_t = theirs["big"].clone().requires_grad_(True) if theirs else None

    def loss_ours():
        F.log_softmax(big_grad, -1).sum().backward()
        big_grad.grad = None

    def loss_theirs():
        torch.log_softmax(big_grad_t, -1).sum().backward()
        big_grad_t.grad = None

    cases = [
        ("sum() of 8192 x 50304", lambda: ours["big"].sum(), lambda: theirs["big"].sum()),
        ("mean() of 4096 x 4096", lambda: ours["mid"].mean(), lambda: theirs["mid"].mean()),
        ("sum(0) of 1M x 16", lambda: ours["tall"].sum(0), lambda: theirs["tall"].sum(0)),
        ("sum(1) of 4096 x 4096", lambda: ours["mid"].sum(1), lambda: theirs["mid"].sum(1)),
        ("max() of 4096 x 4096", lambda: ours["mid"].max(), lambda: theirs["mid"].max()),
        ("log_softmax(x).sum() fwd+bwd, 8192 x 50304", loss_ours, loss_theirs),
    ]
    print(f"{label}: {dev.name} ({dev.backend}), sizes / {div}, median of {reps}", flush=True)
    for name, mine, other in cases:
        line = f"{label} {name:44s} pywgtrain {timed(mine, dev.synchronize, reps):9.3f} ms"
        if torch is not None:
            line += f"   torch {timed(other, torch.cuda.synchronize, reps):9.3f} ms"
        print(line, flush=True)


if __name__ == "__main__":
    main()
