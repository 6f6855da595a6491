"""A GPT training step under autocast with the parameters' float16 shadows (a fused AdamW writes
each parameter's float16 copy in its update, autocast's products read it) beside the cast path
(shadows removed: every parameter cast every step), in one process: the step is forward, loss,
``GradScaler``-scaled backward, unscale, capturable AdamW and scaler update, captured once with
``pw.graph`` and replayed. Per path: dispatches of the step and the parameter-sized casts among
them (``Graph.kernel_names()``), the caching allocator's peak of one eager step
(``Device.memory_stats()``, after a warm-up; it depends only on the op sequence, so any adapter
gives the GPU's figure), ms per replayed step and the last loss (equal on both paths).
Usage: python bench/half_weights.py [--config char] [--batch N] [--steps N] [--json FILE]
(batch default: 64, 2 on a CPU adapter such as lavapipe)."""

import argparse
import json
import time

import numpy as np

import pywgtrain as pw
from pywgtrain import optim
from pywgtrain.amp import GradScaler
from pywgtrain.benchmarks.common import is_cpu_adapter
from pywgtrain.models import GPT
from pywgtrain.models.gpt import CONFIGS


def run(dev, cfg, batch, steps, shadows):
    model = GPT(cfg, device=dev, seed=0, dropout=0.0)  # no dropout: both paths compute the same
    params = list(model.parameters())
    opt = optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), max_grad_norm=1.0, capturable=True)
    if not shadows:
        for p in params:
            p.untyped_storage().half_shadow = None  # what autocast reads then: a cast per step
    scaler = GradScaler()
    rng = np.random.default_rng(0)
    data = rng.integers(0, cfg.vocab_size, (batch, cfg.block_size + 1)).astype(np.int32)
    x, y = pw.tensor(data[:, :-1].copy(), dev), pw.tensor(data[:, 1:].copy(), dev)
    out = {}

    def step():
        opt.zero_grad()
        with pw.autocast():
            loss = GPT.loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        out["loss"] = loss

    step()  # compiles, and makes the shadows
    dev.synchronize()
    dev.memory_stats(reset_peak=True)
    base = dev.memory_stats()["allocated_bytes"]
    with dev.batch():
        step()
    out["loss"].item()
    peak = dev.memory_stats()["peak_allocated_bytes"]
    g = pw.Graph()
    with pw.graph(g, dev):
        step()
    names = g.kernel_names()
    g.replay()
    dev.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        g.replay()
    loss = out["loss"].item()
    ms = (time.perf_counter() - t0) / steps * 1e3
    return {
        "dispatches": len(names),
        "casts_f32_to_f16": sum(n.startswith("cast:f32_to_f16") for n in names),
        "peak_mib": peak / 2**20,
        "step_mib": (peak - base) / 2**20,
        "ms": ms,
        "loss": loss,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="char", choices=sorted(CONFIGS))
    ap.add_argument("--batch", type=int)
    ap.add_argument("--steps", type=int, default=10, help="timed replays")
    ap.add_argument("--json", help="write the rows to this file")
    args = ap.parse_args()
    dev = pw.default_device()
    cfg = CONFIGS[args.config]
    batch = args.batch or (2 if is_cpu_adapter(dev) else 64)
    print(f"{dev.info['name']}: {args.config}, batch {batch}, T {cfg.block_size}")
    print(f"{'path':<8} {'dispatches':>10} {'casts':>6} {'peak MiB':>9} {'step MiB':>9} {'ms/step':>8}  loss")
    rows = []
    for name, shadows in (("cast", False), ("shadow", True)):
        r = run(dev, cfg, batch, args.steps, shadows)
        rows.append({"path": name, **r})
        print(
            f"{name:<8} {r['dispatches']:>10} {r['casts_f32_to_f16']:>6} {r['peak_mib']:>9.1f} "
            f"{r['step_mib']:>9.1f} {r['ms']:>8.1f}  {r['loss']:.6f}",
            flush=True,
        )
        dev.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": dev.info["name"], "config": args.config, "batch": batch, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
