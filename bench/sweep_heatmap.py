"""Heat map of pywgtrain / cuBLAS time over the GEMM sweep
(`pywgtrain bench gemm --sweep --json X`): one panel per linear-layer mode,
layers down, batch rows across.

    python bench/sweep_heatmap.py bench/results/h100_gemm_sweep.json docs/gemm_sweep_h100.png
"""

import json
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def main(src, dst):
    rows = json.load(open(src))["gemm"]
    modes = ["forward NT", "dX NN", "dW TN"]
    layers = sorted({tuple(r["layer"]) for r in rows}, key=lambda lf: (lf[0] * lf[1], lf))
    ms = sorted({r["m"] if r["mode"] != "dW TN" else r["k"] for r in rows})
    fig, axes = plt.subplots(1, 3, figsize=(15, 0.5 * len(layers) + 2), sharey=True)
    for ax, mode in zip(axes, modes):
        grid = np.full((len(layers), len(ms)), np.nan)
        for r in rows:
            if r["mode"] != mode or "time_ratio" not in r:
                continue
            m = r["k"] if mode == "dW TN" else r["m"]
            grid[layers.index(tuple(r["layer"])), ms.index(m)] = r["time_ratio"]
        im = ax.imshow(grid, cmap="RdYlGn_r", vmin=0.6, vmax=1.8, aspect="auto")
        for i in range(len(layers)):
            for j in range(len(ms)):
                if not np.isnan(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(ms)), [str(m) for m in ms])
        ax.set_yticks(range(len(layers)), [f"{a}->{b}" for a, b in layers])
        ax.set_xlabel("batch rows (M; K for dW)")
        ax.set_title(mode)
    fig.colorbar(im, ax=axes, label="pywgtrain time / cuBLAS time")
    ratios = [r["time_ratio"] for r in rows if "time_ratio" in r]
    fig.suptitle(f"GEMM sweep: median {statistics.median(ratios):.2f}x, worst {max(ratios):.2f}x cuBLAS fp32 time")
    fig.savefig(dst, dpi=110, bbox_inches="tight")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
