"""Softmax, log_softmax and cross-entropy over many short rows (issue 34: 4.2M
rows x 8 took minutes on lavapipe), wall clock per call after a warm-up,
beside an element-wise pass over the same data. After installing the package:

    .venv/bin/python bench/short_rows.py [--rows 500000] [--cols 8] [--reps 3]

Each figure is the median of --reps runs of one call plus ``dev.synchronize()``.
"""

import argparse
import statistics
import time

import numpy as np

import pywgtrain as pw
import pywgtrain.functions as F
from pywgtrain import _core


def timed(dev, fn, reps):
    fn()
    dev.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        dev.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=500_000)
    ap.add_argument("--cols", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    dev = pw.default_device()
    rows, cols = args.rows, args.cols
    rng = np.random.default_rng(0)
    x = pw.tensor(rng.standard_normal((rows, cols)).astype(np.float32), dev)
    dy = pw.tensor(rng.standard_normal((rows, cols)).astype(np.float32), dev)
    y, dx = pw.empty((rows, cols), device=dev), pw.empty((rows, cols), device=dev)
    labels = pw.tensor(rng.integers(0, cols, rows).astype(np.int32), dev)
    row_bufs = [pw.empty((rows, 2), device=dev)] + [
        pw.empty((rows,), device=dev) for _ in range(2)
    ]  # stats, loss, valid
    out, scale, one = pw.empty((1,), device=dev), pw.empty((1,), device=dev), pw.tensor(np.ones(1, np.float32), dev)

    def run(body):
        with dev.batch() as rec:
            body(rec)

    cases = {
        "elementwise exp (same data)": lambda rec: _core.unary(rec, 3, x._buf, y._buf, x.numel(), 0.0, 0.0, 0.0),
        "softmax forward": lambda rec: _core.softmax(rec, x._buf, y._buf, rows, cols, False),
        "log_softmax forward": lambda rec: _core.softmax(rec, x._buf, y._buf, rows, cols, True),
        "log_softmax backward": lambda rec: _core.softmax_backward(
            rec, y._buf, dy._buf, dx._buf, rows, cols, True, 0.0
        ),
        "cross_entropy forward": lambda rec: _core.cross_entropy_forward(
            rec, x._buf, labels._buf, *(b._buf for b in row_bufs), out._buf, scale._buf, rows, cols, -100, True
        ),
        "cross_entropy backward": lambda rec: _core.cross_entropy_backward(
            rec, x._buf, labels._buf, row_bufs[0]._buf, one._buf, scale._buf, dx._buf, rows, cols, -100, False, 0.0
        ),
    }
    print(f"{dev.name} ({dev.backend}): {rows} rows x {cols} columns, median of {args.reps}")
    for name, body in cases.items():
        print(f"  {name:30s} {timed(dev, lambda b=body: run(b), args.reps) * 1e3:10.1f} ms", flush=True)
    # the op a user calls, forward + backward through autograd
    xt = pw.tensor(x.numpy(), dev, requires_grad=True)
    lab = labels.numpy()

    def step():
        loss = F.cross_entropy(xt, lab)
        loss.backward()
        xt.grad = None

    print(f"  {'F.cross_entropy fwd+bwd':30s} {timed(dev, step, args.reps) * 1e3:10.1f} ms")

    def step_ls():
        F.log_softmax(xt, -1).sum().backward()
        xt.grad = None

    print(f"  {'F.log_softmax(...).sum() fwd+bwd':30s} {timed(dev, step_ls, args.reps) * 1e3:10.1f} ms")


if __name__ == "__main__":
    main()
