"""Stream-K against the tiled plans, shape by shape, beside cuBLAS (H100).

Runs each product with the heuristic's plan (autotuning off), then forced
stream-K on 64x128 tiles (PYWGTRAIN_GEMM_TILES / PYWGTRAIN_GEMM_STREAM_K,
read when a Device opens: a Device per configuration) with the worker counts given, timed as `pywgtrain bench gemm`
times (GPU timestamps, rotated operands). Usage:

    PYWGTRAIN_GEMM_AUTOTUNE=0 python bench/stream_k_ab.py [--json out.json] [--workers 264,528]
"""

import argparse
import json
import os

import pywgtrain as pw
from pywgtrain.benchmarks.common import _torch_cuda
from pywgtrain.benchmarks.gemm import time_pywgtrain_gemm, time_torch_gemm, warm_up

# (M, K, N, trans_a, trans_b): the sweep's shapes above 1.25x cuBLAS in session 12, and some near it.
SHAPES = [
    (768, 8192, 768, True, False),
    (768, 4096, 768, True, False),
    (777, 2304, 768, False, False),
    (256, 4096, 4096, False, True),
    (256, 4096, 4096, False, False),
    (777, 4096, 4096, False, True),
    (777, 4096, 1024, False, True),
    (777, 4096, 1024, False, False),
    (777, 1024, 4096, False, False),
    (777, 1024, 4096, False, True),
    (64, 50304, 768, False, False),
    (3072, 777, 768, True, False),
    (768, 777, 3072, True, False),
    (1024, 768, 2304, False, True),
    (1024, 777, 4096, True, False),
    (1024, 1024, 4096, True, False),
    (1024, 4096, 1024, False, False),
    (1024, 768, 768, False, True),
    (777, 768, 3072, False, False),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--workers", default="264")
    args = ap.parse_args()
    torch = _torch_cuda()
    configs = [("heuristic", {})]
    for w in args.workers.split(","):
        for lean in (0, 1):
            configs.append(
                (
                    f"sk{w}{'L' if lean else ''}",
                    {"PYWGTRAIN_GEMM_TILES": f"64,128,16,8,4,8,{lean}", "PYWGTRAIN_GEMM_STREAM_K": w},
                )
            )
    devices = {}
    for name, env in configs:
        for key in ("PYWGTRAIN_GEMM_TILES", "PYWGTRAIN_GEMM_STREAM_K"):
            os.environ.pop(key, None)
        os.environ.update(env)
        devices[name] = pw.Device()
    for key in ("PYWGTRAIN_GEMM_TILES", "PYWGTRAIN_GEMM_STREAM_K"):
        os.environ.pop(key, None)
    rows = []
    for m, k, n, ta, tb in SHAPES:
        warm_up(devices["heuristic"], torch, 0.25)
        reps = max(10, min(200, int(2e12 / (2.0 * m * n * k) * 4)))
        row = {"m": m, "k": k, "n": n, "ta": ta, "tb": tb}
        for name, _ in configs:
            row[name] = time_pywgtrain_gemm(devices[name], m, k, n, ta, tb, reps)
        if torch is not None:
            row["cublas"] = time_torch_gemm(torch, m, k, n, ta, tb, reps)
        rows.append(row)
        mode = ("T" if ta else "N") + ("T" if tb else "N")
        base = row.get("cublas", row["heuristic"])
        print(
            f"{m}x{k}x{n} {mode}: "
            + " ".join(f"{name} {row[name]:8.1f} ({row[name] / base:.2f})" for name, _ in configs)
            + (f" cuBLAS {row['cublas']:8.1f}" if "cublas" in row else ""),
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"adapter": devices["heuristic"].name, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
