"""Times forced GEMM plans with warm and with rotated operands, in one process.

The autotuner times each candidate on one operand set (warm in L2); `pywgtrain
bench gemm` rotates up to 8 sets through 256 MB. This shows, shape by shape,
whether a plan's speed depends on that. Plans are given as
TILES[/SPLITS[/STREAM_K]] (PYWGTRAIN_GEMM_TILES, _SPLITS, _STREAM_K; read when
a Device opens, so each plan runs on a Device of its own). Usage:

    PYWGTRAIN_GEMM_AUTOTUNE=0 python bench/plan_probe.py 1024x2304x768:NN \
        64,128,16,8,4,8,0/2 64,128,16,8,4,8,0/4 64,128,16,8,4,8,1/1/264
"""

import os
import sys

import pywgtrain as pw
from pywgtrain.benchmarks.common import _torch_cuda
from pywgtrain.benchmarks.gemm import parse_shapes, time_pywgtrain_gemm, time_torch_gemm, warm_up

KEYS = ("PYWGTRAIN_GEMM_TILES", "PYWGTRAIN_GEMM_SPLITS", "PYWGTRAIN_GEMM_STREAM_K")


def main():
    shapes = parse_shapes(sys.argv[1])
    plans = sys.argv[2:]
    devices = {}
    for plan in plans:
        for key in KEYS:
            os.environ.pop(key, None)
        os.environ.update(dict(zip(KEYS, plan.split("/"))))
        devices[plan] = pw.Device()
    for key in KEYS:
        os.environ.pop(key, None)
    torch = _torch_cuda()
    for m, k, n, ta, tb in shapes:
        mode = ("T" if ta else "N") + ("T" if tb else "N")
        reps = max(10, min(200, int(2e12 / (2.0 * m * n * k) * 4)))
        for plan in plans:
            dev = devices[plan]
            warm_up(dev, torch, 0.25)
            warm = time_pywgtrain_gemm(dev, m, k, n, ta, tb, reps, rotate_bytes=0)
            rotated = time_pywgtrain_gemm(dev, m, k, n, ta, tb, reps)
            print(f"{m}x{k}x{n} {mode} plan {plan}: warm {warm:8.1f} us, rotated {rotated:8.1f} us", flush=True)
        if torch is not None:
            print(
                f"{m}x{k}x{n} {mode} cuBLAS (rotated) {time_torch_gemm(torch, m, k, n, ta, tb, reps):8.1f} us",
                flush=True,
            )


if __name__ == "__main__":
    main()
