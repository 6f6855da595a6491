"""GPU time per kernel family of the `bench gpt` training step through Trainer, float32 and
under autocast (GradScaler, capturable AdamW), for each of `bench gpt`'s GPU configurations:
where the autocast step spends what the float32 one does not. One timed pass per dispatch
(`Graph.profile`); kernels are grouped by family, entry and element type, GEMMs also by
transpose mode, epilogue and tile. On a CPU adapter it runs `bench gpt`'s CPU configuration.

    python bench/autocast_profile.py [--precisions fp32,fp16] [--json FILE]
"""

import argparse
import collections
import json

import pywgtrain as pw
from pywgtrain.benchmarks.common import is_cpu_adapter
from pywgtrain.benchmarks.gpt import CONFIGS, CPU_CONFIGS, time_ours


def family(kernel):
    """'family:entry[element type]' of a kernel key, with a GEMM's mode, epilogue and tile."""
    head, _, rest = kernel.partition(";")
    keys = {}
    for item in rest.split(";"):
        name, sep, value = item.partition("=") if "=" in item else item.partition(":")
        keys[name] = value
    dtype = next((keys[k] for k in ("AB", "ET", "XT", "T0", "ST", "LT") if k in keys), "")
    extra = ""
    if head.startswith("gemm:gemm"):
        extra = " " + " ".join(f"{k}={keys.get(k)}" for k in ("TRANS_A", "TRANS_B", "EPILOGUE", "BM", "BN"))
    return f"{head}[{dtype}]{extra}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precisions", default="fp32,fp16")
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = pw.default_device()
    out = {}
    for name, cfg, batch in CPU_CONFIGS if is_cpu_adapter(dev) else CONFIGS:
        for precision in args.precisions.split(","):
            r = time_ours(dev, cfg, batch, steps=10 if cfg.n_layer > 6 else 20, profile=True, fp16=precision == "fp16")
            prof = r.get("profile")
            if prof is None:
                raise SystemExit("the adapter has no timestamp-query feature: no per-kernel profile")
            groups = collections.defaultdict(lambda: [0.0, 0])
            for k in prof["kernels"]:
                g = groups[family(k["kernel"])]
                g[0] += k["us"]
                g[1] += k["count"]
            print(
                f"== {name} {precision}: {r['ms']:.1f} ms/step, GPU {prof['gpu_us'] / 1e3:.1f} ms in "
                f"{prof['dispatches']} dispatches",
                flush=True,
            )
            for fam, (us, count) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:24]:
                print(f"  {us / 1e3:8.2f} ms {count:4d}x {fam}")
            out[f"{name} {precision}"] = {
                "ms": r["ms"],
                "families": {f: {"us": u, "count": c} for f, (u, c) in groups.items()},
            }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
