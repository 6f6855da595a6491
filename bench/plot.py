"""Plot GEMM TFLOP/s against size from a `pywgtrain bench --json` result.

    python bench/plot.py bench/results/h100_bench.json docs/gemm_h100.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    with open(src) as f:
        res = json.load(f)
    rows = [r for r in res["gemm"] if r["m"] == r["k"] == r["n"] and not r["trans_a"] and not r["trans_b"]]
    rows.sort(key=lambda r: r["m"])
    sizes = [r["m"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.plot(sizes, [r["pywgtrain_tflops"] for r in rows], "o-", label="pywgtrain (WGSL via wgpu-native/Vulkan)")
    if "cublas_tflops" in rows[0]:
        ax.plot(sizes, [r["cublas_tflops"] for r in rows], "s-", label="cuBLAS fp32 (TF32 off)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M = N = K")
    ax.set_ylabel("TFLOP/s")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Square SGEMM on {res['meta']['adapter']}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=120)


if __name__ == "__main__":
    main(*sys.argv[1:3])
