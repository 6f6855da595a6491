"""LayerNorm forward and backward (dx, dweight, dbias) at the GPT configurations'
shapes: ours through the raw kernels, captured once in a ``pywgtrain.Graph``
and timed per dispatch with GPU timestamps (``Graph.profile``, median of
REPS replays; the backward's scratch is allocated once, as in a training
step), and torch's on CUDA in the same process (TF32 off), wall clock of REPS
calls back to back, then a synchronize. CPU adapters (lavapipe) run rows / 16
and 3 replays.

    python bench/layernorm_bench.py [LABEL] [REPS]     # on the GPU machine after the prelude
"""

import sys
import time

import numpy as np

import pywgtrain as pw
from pywgtrain import _core
from pywgtrain.benchmarks.common import _torch_cuda, is_cpu_adapter

SHAPES = {"nanoGPT char": (64 * 256, 384), "GPT-2 small": (8 * 1024, 768)}


def main():
    label = sys.argv[1] if len(sys.argv) > 1 else "tree"
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    dev = pw.default_device()
    torch = _torch_cuda()
    cpu = is_cpu_adapter(dev)
    reps, div = (3, 16) if cpu else (reps, 1)
    rng = np.random.default_rng(0)
    for name, (rows, cols) in SHAPES.items():
        rows //= div
        x, dy = (rng.standard_normal((rows, cols), dtype=np.float32) for _ in range(2))
        w, b = (rng.standard_normal(cols, dtype=np.float32) for _ in range(2))
        tx, tdy, tw, tb = (pw.tensor(a, dev) for a in (x, dy, w, b))
        y, dx = pw.empty((rows, cols), device=dev), pw.empty((rows, cols), device=dev)
        mean, rstd, dw, db = (pw.empty((n,), device=dev) for n in (rows, rows, cols, cols))

        def forward(rec):
            _core.layer_norm_forward(rec, tx._buf, tw._buf, tb._buf, y._buf, mean._buf, rstd._buf, rows, cols, 1e-5)

        def backward(rec):
            _core.layer_norm_backward(
                rec, tx._buf, tw._buf, mean._buf, rstd._buf, tdy._buf, dx._buf, dw._buf, db._buf,
                rows, cols, 0.0, 0.0, 0.0,
            )  # fmt: skip

        g = pw.Graph()
        with pw.graph(g, dev):
            with dev._recording() as rec:
                forward(rec)
                backward(rec)
        g.profile(reps)  # warm-up: the GPU's clocks rise during the first tens of milliseconds of work
        kernels = [(k["kernel"].split(";")[0].split(":")[-1], k["us"]) for k in g.profile(reps)["kernels"]]
        fwd_us = sum(us for k, us in kernels if k == "ln_forward")
        bwd = [(k, us) for k, us in kernels if k != "ln_forward"]
        parts = " + ".join(f"{k} {us:.1f}" for k, us in bwd)
        line = f"{label} {name} {rows} x {cols}: forward {fwd_us:6.1f} us, backward {sum(us for _, us in bwd):6.1f} us ({parts})"
        if torch is not None:
            xt = torch.from_numpy(x).cuda().requires_grad_(True)
            wt, bt = (torch.from_numpy(a).cuda().requires_grad_(True) for a in (w, b))
            dyt = torch.from_numpy(dy).cuda()

            def theirs(backward_too):
                out = torch.nn.functional.layer_norm(xt, (cols,), wt, bt, 1e-5)
                if backward_too:
                    torch.autograd.grad(out, (xt, wt, bt), dyt)

            def timed(fn):
                fn()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(reps):
                    fn()
                torch.cuda.synchronize()
                return (time.perf_counter() - t0) / reps * 1e6

            fwd = timed(lambda: theirs(False))
            both = timed(lambda: theirs(True))
            line += f"; torch forward {fwd:7.1f} us, forward + backward {both:7.1f} us"
        print(line, flush=True)


if __name__ == "__main__":
    main()
