"""Device memory of the float32-list ops on a float16 input under pywgtrain.autocast: what one
op's forward leaves allocated (its result and what autograd keeps) and the peak of its
forward and backward, from the caching allocator's counters
(``Device.memory_stats()``): they depend only on the op sequence, so lavapipe gives the
figures a GPU would. A kernel that reads float16 itself keeps no float32 copy of the input;
one that runs on a cast keeps or briefly holds that copy. Run it in two trees to compare.
Usage: python bench/f16_op_memory.py [--rows N] [--cols N] [--json FILE]"""

import argparse
import json

import numpy as np

import pywgtrain as pw

OPS = {
    "layer_norm": lambda x, w, b: pw.layer_norm(x, (x.shape[-1],), w, b),
    "softmax": lambda x, w, b: pw.softmax(x, -1),
    "log_softmax": lambda x, w, b: pw.log_softmax(x, -1),
    "sum(-1)": lambda x, w, b: x.sum(-1),
    "mean(-1)": lambda x, w, b: x.mean(-1),
}


def measure(dev, fn, x16, w, b):
    """(bytes kept after the forward, peak bytes of forward and backward) above what was allocated."""
    tx = pw.tensor(x16, dev, requires_grad=True)
    tw, tb = pw.tensor(w, dev, requires_grad=True), pw.tensor(b, dev, requires_grad=True)
    dev.synchronize()
    dev.memory_stats(reset_peak=True)
    base = dev.memory_stats()["allocated_bytes"]
    with pw.autocast():
        y = fn(tx, tw, tb)
    dev.synchronize()
    kept = dev.memory_stats()["allocated_bytes"] - base
    y.backward(pw.tensor(np.ones(y.shape, y.dtype), dev))
    dev.synchronize()
    return kept, dev.memory_stats()["peak_allocated_bytes"] - base


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=384)
    ap.add_argument("--json", help="write the rows to this file")
    args = ap.parse_args()
    dev = pw.default_device()
    rng = np.random.default_rng(0)
    x16 = rng.standard_normal((args.rows, args.cols)).astype(np.float16)
    w, b = (rng.standard_normal(args.cols).astype(np.float32) for _ in range(2))
    print(f"float16 input [{args.rows}, {args.cols}] ({x16.nbytes / 2**20:.2f} MiB), under autocast")
    print(f"{'op':<12} {'kept after forward MiB':>23} {'peak forward+backward MiB':>26}")
    rows = []
    for name, fn in OPS.items():
        measure(dev, fn, x16, w, b)  # compiles the kernels
        kept, peak = measure(dev, fn, x16, w, b)
        rows.append({"op": name, "kept_bytes": kept, "peak_bytes": peak})
        print(f"{name:<12} {kept / 2**20:>23.2f} {peak / 2**20:>26.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": dev.info["name"], "rows": args.rows, "cols": args.cols, "ops": rows}, f, indent=1)


if __name__ == "__main__":
    main()
