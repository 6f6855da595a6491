"""Each shape's plan from a plan cache file with its warp block (WARP_W)
replaced, the variants alternating in one process, two rounds each, beside
cuBLAS (docs/gemm_notes.md #103). Shapes are M x N x K:MODE as in the plan
file (not `bench gemm`'s MxKxN). On the GPU machine, after installing the
package:

    source .gpu/prelude.sh && python3 bench/warp_ab.py PLAN_FILE 4096x1024x777:TN,256x4096x4096:NT 4,8,16

Shapes without a plain plan line (swapped products, keyed as their NN
shape) and warp widths the plan's tile cannot take are skipped, with a note.
"""

import os
import sys

import pywgtrain as pw
from pywgtrain.benchmarks.common import _torch_cuda
from pywgtrain.benchmarks.gemm import pywgtrain_gemm_timer, time_torch_gemm, warm_up


def read_plans(path):
    """{(m, n, k, ta, tb): (tiles, splits, workers)} of a v3 plan file's unswapped lines."""
    plans = {}
    with open(path) as f:
        for line in f:
            fields = line.split()
            if len(fields) != 16 or not fields[0].isdigit():
                continue
            m, n, k, ta, tb, tc, bm, bn, bk, tm, tn, ww, lean, splits, workers = map(int, fields[:15])
            if not tc:
                plans[(m, n, k, ta, tb)] = ((bm, bn, bk, tm, tn, ww, lean), splits, workers)
    return plans


def main():
    plans = read_plans(sys.argv[1])
    warps = [int(w) for w in sys.argv[3].split(",")]
    dev = pw.Device()
    torch = _torch_cuda()
    os.environ["PYWGTRAIN_GEMM_AUTOTUNE"] = "0"
    os.environ["PYWGTRAIN_GEMM_ROW_SPLIT"] = "0"
    warm_up(dev, torch, 0.5)
    for item in sys.argv[2].split(","):
        dims, mode = item.split(":")
        m, n, k = map(int, dims.split("x"))
        ta, tb = mode[0] == "T", mode[1] == "T"
        plan = plans.get((m, n, k, int(ta), int(tb)))
        if plan is None:
            print(item, "no plan")
            continue
        (bm, bn, bk, tm, tn, ww, lean), splits, workers = plan
        usable = [w for w in warps if (bn // tn) % w == 0 and (bm // tm) % (32 // w) == 0]
        if not usable:
            print(item, "plan", plan, "takes none of the warp widths")
            continue
        reps = max(20, min(200, int(2e12 / (2.0 * m * n * k) * 4)))
        os.environ["PYWGTRAIN_GEMM_SPLITS"] = str(splits)
        os.environ.pop("PYWGTRAIN_GEMM_STREAM_K", None)
        if workers:
            os.environ["PYWGTRAIN_GEMM_STREAM_K"] = str(workers)
        # The switches are read when a Device opens: one Device per warp width.
        timers = {}
        for w in usable:
            os.environ["PYWGTRAIN_GEMM_TILES"] = f"{bm},{bn},{bk},{tm},{tn},{w},{lean}"
            timers[w] = pywgtrain_gemm_timer(pw.Device(), m, k, n, ta, tb)
        times = {}
        for _ in range(2):
            for w in usable:
                times.setdefault(w, []).append(timers[w](reps))
        cublas = min(time_torch_gemm(torch, m, k, n, ta, tb, reps) for _ in range(2)) if torch else float("nan")
        cells = " | ".join(
            f"W{w} {' '.join(f'{t:.1f}' for t in times[w])} ({min(times[w]) / cublas:.3f})" for w in usable
        )
        print(f"{item} plan {bm}x{bn} w{ww} l{lean} s{splits} k{workers} cublas {cublas:.1f} | {cells}", flush=True)


if __name__ == "__main__":
    main()
