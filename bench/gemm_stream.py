"""Small GEMMs as a plain loop issues them: ten ``pw.gemm`` calls on device
tensors (streamed, no batch) then ``dev.synchronize()``, against ten
``torch.mm`` then ``torch.cuda.synchronize()`` (TF32 off) in the same
process; wall clock per call, median of REPS rounds, both sides alternating.
Shapes M x N x K: M in {64, 256}, (N, K) in {(768, 768), (3072, 768),
(768, 3072)}, modes NN, NT, TN (op(A) is M x K, op(B) is K x N). CPU adapters
(lavapipe) run every size divided by 8 and 5 rounds: a check that it runs.

    python bench/gemm_stream.py [LABEL]      # on the GPU machine after the prelude
"""

import statistics
import sys
import time

import numpy as np

import pywgtrain as pw
from pywgtrain.benchmarks.common import _torch_cuda, is_cpu_adapter
from pywgtrain.benchmarks.gemm import warm_up

REPS = 60 if len(sys.argv) < 3 else int(sys.argv[2])
CALLS = 10


def main():
    label = sys.argv[1] if len(sys.argv) > 1 else "tree"
    dev = pw.default_device()
    torch = _torch_cuda()
    rng = np.random.default_rng(0)
    cpu = is_cpu_adapter(dev)
    reps, div = (min(REPS, 5), 8) if cpu else (REPS, 1)
    if not cpu:
        warm_up(dev, torch)
    ratios = []
    for m in (64 // div, 256 // div):
        for n, k in ((768 // div, 768 // div), (3072 // div, 768 // div), (768 // div, 3072 // div)):
            for mode in ("NN", "NT", "TN"):
                ta, tb = mode[0] == "T", mode[1] == "T"
                a_np = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
                b_np = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
                a, b = pw.tensor(a_np, dev), pw.tensor(b_np, dev)

                def ours():
                    for _ in range(CALLS):
                        pw.gemm(a, b, trans_a=ta, trans_b=tb)
                    dev.synchronize()

                sides = {"pywgtrain": ours}
                if torch is not None:
                    a_t, b_t = torch.from_numpy(a_np).cuda(), torch.from_numpy(b_np).cuda()

                    def theirs():
                        for _ in range(CALLS):
                            torch.mm(a_t.T if ta else a_t, b_t.T if tb else b_t)
                        torch.cuda.synchronize()

                    sides["torch"] = theirs
                times = {name: [] for name in sides}
                for _ in range(5):
                    for fn in sides.values():
                        fn()
                for _ in range(reps):
                    for name, fn in sides.items():
                        t0 = time.perf_counter()
                        fn()
                        times[name].append((time.perf_counter() - t0) / CALLS * 1e6)
                ours_us = statistics.median(times["pywgtrain"])
                line = f"{label} {m}x{n}x{k} {mode}: pywgtrain {ours_us:.1f} us/call"
                if torch is not None:
                    theirs_us = statistics.median(times["torch"])
                    ratios.append(ours_us / theirs_us)
                    line += f", torch {theirs_us:.1f} us/call, ratio {ours_us / theirs_us:.2f}"
                print(line, flush=True)
    if ratios:
        print(f"{label} ratio median {statistics.median(ratios):.2f}, worst {max(ratios):.2f}", flush=True)


if __name__ == "__main__":
    main()
