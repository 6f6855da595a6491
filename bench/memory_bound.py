"""Memory-bound operations as a user calls them, wall clock per call plus
``synchronize()`` (median of REPS) and the bytes it must move per second,
beside the same call in PyTorch on CUDA in the same process (TF32 off) when it
has a GPU: element-wise ops on an activation-sized tensor and on GPT-2's
logits, softmax, whole-tensor sums and means, a column sum of a tall matrix, a
row sum, max, and a loss written out (``log_softmax(x).sum()`` with its
backward). CPU adapters (lavapipe) run every size divided by 64.

    python bench/memory_bound.py [LABEL] [REPS]     # on the GPU machine after the prelude
"""

import statistics
import sys
import time

import numpy as np

import pywgtrain as pw
import pywgtrain.functions as F
from pywgtrain.benchmarks.common import _torch_cuda, is_cpu_adapter


def timed(fn, sync, reps):
    """Median seconds of fn() plus sync()."""
    fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    label = sys.argv[1] if len(sys.argv) > 1 else "tree"
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    dev = pw.default_device()
    torch = _torch_cuda()
    div = 64 if is_cpu_adapter(dev) else 1
    rng = np.random.default_rng(0)
    shapes = {
        "big": (8192 // div, 50304),
        "tall": ((1 << 20) // div, 16),
        "mid": (4096, 4096 // div),
        "act": (8192 // div, 768),
        "act2": (8192 // div, 768),
    }
    data = {k: rng.standard_normal(s, dtype=np.float32) for k, s in shapes.items()}
    ours = {k: pw.tensor(v, dev) for k, v in data.items()}
    theirs = {k: torch.from_numpy(v).cuda() for k, v in data.items()} if torch is not None else None
    tF = torch.nn.functional if torch is not None else None
    big_grad = pw.tensor(data["big"], dev, requires_grad=True)
    big_grad_t = theirs["big"].clone().requires_grad_(True) if theirs else None

    def loss_ours():
        F.log_softmax(big_grad, -1).sum().backward()
        big_grad.grad = None

    def loss_theirs():
        torch.log_softmax(big_grad_t, -1).sum().backward()
        big_grad_t.grad = None

    mb = {k: float(np.prod(v)) * 4 for k, v in shapes.items()}  # bytes of each float32 tensor
    o, t = ours, theirs
    cases = [  # (name, bytes moved, ours, torch)
        ("x + y, 8192 x 768", 3 * mb["act"], lambda: o["act"] + o["act2"], lambda: t["act"] + t["act2"]),
        ("gelu(x), 8192 x 768", 2 * mb["act"], lambda: F.gelu(o["act"]), lambda: tF.gelu(t["act"])),
        ("exp(x), 8192 x 50304", 2 * mb["big"], lambda: o["big"].exp(), lambda: t["big"].exp()),
        ("x * 2, 8192 x 50304", 2 * mb["big"], lambda: o["big"] * 2.0, lambda: t["big"] * 2.0),
        ("softmax(x, -1), 8192 x 50304", 2 * mb["big"], lambda: F.softmax(o["big"], -1), lambda: t["big"].softmax(-1)),
        ("sum() of 8192 x 50304", mb["big"], lambda: o["big"].sum(), lambda: t["big"].sum()),
        ("mean() of 4096 x 4096", mb["mid"], lambda: o["mid"].mean(), lambda: t["mid"].mean()),
        ("sum(0) of 1M x 16", mb["tall"], lambda: o["tall"].sum(0), lambda: t["tall"].sum(0)),
        ("sum(1) of 4096 x 4096", mb["mid"], lambda: o["mid"].sum(1), lambda: t["mid"].sum(1)),
        ("max() of 4096 x 4096", mb["mid"], lambda: o["mid"].max(), lambda: t["mid"].max()),
        ("log_softmax(x).sum() fwd+bwd, 8192 x 50304", 4 * mb["big"], loss_ours, loss_theirs),
    ]
    print(
        f"{label}: {dev.name} ({dev.backend}), sizes / {div}, median of {reps}; GB/s: the bytes each must move",
        flush=True,
    )
    for name, nbytes, mine, other in cases:
        s = timed(mine, dev.synchronize, reps)
        line = f"{label} {name:44s} pywgtrain {s * 1e3:9.3f} ms {nbytes / s / 1e9:7.0f} GB/s"
        if torch is not None:
            s = timed(other, torch.cuda.synchronize, reps)
            line += f"   torch {s * 1e3:9.3f} ms {nbytes / s / 1e9:7.0f} GB/s"
        print(line, flush=True)


if __name__ == "__main__":
    main()
