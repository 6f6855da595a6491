"""GEMV 1x4096x4096 NT (x @ W.T, a batch-1 linear layer) as a user calls it,
wall clock beside torch.mm with TF32 off, in one process (issue 16's two
measures):

- one call on its own: ``pw.gemm(...)`` then ``dev.synchronize()``, against
  ``torch.mm(...)`` then ``torch.cuda.synchronize()``;
- in a batch: ten calls in one ``dev.batch()`` then ``dev.synchronize()``,
  against ten ``torch.mm`` then one synchronize; per call.

It also splits the single call into recording, submission and waiting, and
times the same path for 1x4x4 (no GPU work to speak of: the host's floor).
On the GPU machine, after installing the package:

    source .gpu/prelude.sh && python3 bench/gemv_wall.py [--json FILE] [--only pywgtrain|torch]

``--only`` times one side in a process without the other (no CUDA context
beside the Vulkan device, or no Vulkan device beside CUDA); the issue's
measure is both in one process.
"""

import argparse
import json
import statistics
import time

import numpy as np

import pywgtrain as pw
from pywgtrain import _core
from pywgtrain.benchmarks.common import _torch_cuda
from pywgtrain.benchmarks.gemm import warm_up
from pywgtrain.device import Device

REPS = 300
BATCH = 10


def _timed(fn, reps=REPS, per=1):
    for _ in range(20):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e6 / per)
    return {"median_us": statistics.median(ts), "p10_us": float(np.percentile(ts, 10))}


def ours(dev, k, n):
    rng = np.random.default_rng(0)
    x = pw.tensor(rng.standard_normal((1, k), np.float32), dev)
    w = pw.tensor(rng.standard_normal((n, k), np.float32), dev)
    outs = [pw.empty((1, n), np.float32, dev) for _ in range(BATCH)]

    def single():
        pw.gemm(x, w, trans_b=True, out=outs[0])
        dev.synchronize()

    def batch():
        with dev.batch():
            for o in outs:
                pw.gemm(x, w, trans_b=True, out=o)
        dev.synchronize()

    parts = {"record": [], "submit": [], "wait": []}

    def split():
        t0 = time.perf_counter()
        rec = _core._Recorder(dev._dev)
        _core.gemm(rec, x._buf, w._buf, outs[0]._buf, 1, n, k, False, True, 1.0, 0.0)
        t1 = time.perf_counter()
        rec.submit()
        t2 = time.perf_counter()
        dev._dev.wait(0)
        t3 = time.perf_counter()
        for key, dt in (("record", t1 - t0), ("submit", t2 - t1), ("wait", t3 - t2)):
            parts[key].append(dt * 1e6)

    res = {"single": _timed(single), "batch": _timed(batch, per=BATCH)}
    _timed(split)
    res["single_parts_median_us"] = {key: statistics.median(v) for key, v in parts.items()}
    got = pw.gemm(x, w, trans_b=True).numpy().astype(np.float64)
    ref = x.numpy().astype(np.float64) @ w.numpy().astype(np.float64).T
    res["max_abs_err"] = float(np.abs(got - ref).max())
    return res


def theirs(torch, k, n):
    x = torch.randn(1, k, device="cuda")
    w = torch.randn(n, k, device="cuda")
    outs = [torch.empty(1, n, device="cuda") for _ in range(BATCH)]

    def single():
        torch.mm(x, w.t(), out=outs[0])
        torch.cuda.synchronize()

    def batch():
        for o in outs:
            torch.mm(x, w.t(), out=o)
        torch.cuda.synchronize()

    return {"single": _timed(single), "batch": _timed(batch, per=BATCH)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--only", choices=["pywgtrain", "torch"], help="time one side only, in a process without the other")
    args = ap.parse_args()
    dev = None if args.only == "torch" else Device()
    torch = None if args.only == "pywgtrain" else _torch_cuda()
    if dev is None and torch is None:
        raise SystemExit("gemv_wall: --only torch needs PyTorch with CUDA")
    results = {"adapter": dev.info["name"] if dev else None, "only": args.only, "shapes": {}}
    for k, n in ((4096, 4096), (4, 4)):
        name = f"1x{k}x{n} NT"
        # Large GEMMs on both sides first: the first round otherwise ran on a
        # GPU still at idle clocks (session 12: 133.9 us one call, then 75.4).
        warm_up(dev, torch)
        rows = {}
        # Alternate twice so neither side always runs first.
        for rnd in range(2):
            if dev is not None:
                rows[f"pywgtrain_{rnd}"] = ours(dev, k, n)
            if torch is not None:
                rows[f"torch_{rnd}"] = theirs(torch, k, n)
        results["shapes"][name] = rows
        for key, r in rows.items():
            line = f"{name} {key:12s} one call {r['single']['median_us']:7.1f} us (p10 {r['single']['p10_us']:6.1f})"
            line += f", in a batch of {BATCH} {r['batch']['median_us']:6.1f} us per call"
            if "single_parts_median_us" in r:
                parts = ", ".join(f"{p} {v:.1f}" for p, v in r["single_parts_median_us"].items())
                line += f" | one call's parts: {parts} us; max abs err {r['max_abs_err']:.2e}"
            print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
