"""Plot GEMM TFLOP/s against size from a `pywgtrain bench --json` result, and
print the markdown tables of docs/performance.md with --tables.

    python bench/plot.py bench/results/h100_bench.json docs/gemm_h100.png [--tables]
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    with open(src) as f:
        res = json.load(f)
    square = [r for r in res["gemm"] if r["m"] == r["k"] == r["n"] and not r["trans_a"] and not r["trans_b"]]
    square.sort(key=lambda r: r["m"])
    pow2 = [r for r in square if r["m"] & (r["m"] - 1) == 0]
    ragged = [r for r in square if r["m"] & (r["m"] - 1)]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.plot(
        [r["m"] for r in pow2],
        [r["pywgtrain_tflops"] for r in pow2],
        "o-",
        color="C0",
        label="pywgtrain (WGSL via wgpu-native/Vulkan)",
    )
    ax.plot(
        [r["m"] for r in ragged], [r["pywgtrain_tflops"] for r in ragged], "x", color="C0", label="pywgtrain, 4095/4097"
    )
    if "cublas_tflops" in square[0]:
        ax.plot(
            [r["m"] for r in pow2], [r["cublas_tflops"] for r in pow2], "s-", color="C1", label="cuBLAS fp32 (TF32 off)"
        )
        ax.plot(
            [r["m"] for r in ragged], [r["cublas_tflops"] for r in ragged], "+", color="C1", label="cuBLAS, 4095/4097"
        )
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


def markdown_tables(res):
    """The GEMM, AdamW and train-step tables of docs/performance.md."""
    out = ["| shape (M×K×N, op) | pywgtrain | cuBLAS fp32 | pywgtrain / cuBLAS time |", "|---|---|---|---|"]
    for r in res["gemm"]:
        mode = ("T" if r["trans_a"] else "N") + ("T" if r["trans_b"] else "N")
        shape = f"{r['m']}×{r['k']}×{r['n']} {mode}"
        ours = f"{r['pywgtrain_us']:.1f} µs ({r['pywgtrain_tflops']:.1f} TFLOP/s)"
        theirs = f"{r['cublas_us']:.1f} µs ({r['cublas_tflops']:.1f} TFLOP/s)" if "cublas_us" in r else "—"
        ratio = f"{r['time_ratio']:.2f}×" if "time_ratio" in r else "—"
        out.append(f"| {shape} | {ours} | {theirs} | {ratio} |")
    out += ["", "| AdamW | pywgtrain | PyTorch fused AdamW | ratio |", "|---|---|---|---|"]
    for r in res.get("adamw", []):
        out.append(
            f"| {r['params']} params | {r['pywgtrain_us']:.1f} µs ({r['pywgtrain_GBps']:.0f} GB/s) | "
            f"{r.get('torch_fused_us', float('nan')):.1f} µs | {r.get('time_ratio', float('nan')):.2f}× |"
        )
    out += [
        "",
        "| one training step (fwd, CE, bwd, clip 1.0, AdamW) | pywgtrain, one submission per step "
        "| pywgtrain, grouped steps | of which GPU | PyTorch eager | PyTorch + CUDA graph |",
        "|---|---|---|---|---|---|",
    ]
    nan = float("nan")
    for r in res.get("train", []):
        gpu = r.get("profile", {})
        out.append(
            f"| {r['config']} | {r['pywgtrain_us']:.0f} µs | {r.get('pywgtrain_grouped_us', nan):.0f} µs "
            f"({r.get('steps_per_submit', '?')} per submission) | {gpu.get('gpu_us', nan):.0f} µs, "
            f"{gpu.get('dispatches', '?')} dispatches | {r.get('torch_eager_us', nan):.0f} µs | "
            f"{r.get('torch_graph_us', nan):.0f} µs |"
        )
    return "\n".join(out)


if __name__ == "__main__" and len(sys.argv) > 3 and sys.argv[3] == "--tables":
    with open(sys.argv[1]) as f:
        print(markdown_tables(json.load(f)))
