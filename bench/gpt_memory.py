"""Peak device memory of one GPT training step (forward, loss, backward, AdamW) in float32
and under pywgtrain.autocast (float16), from the caching allocator's counter
(``Device.memory_stats()['peak_allocated_bytes']``): it depends only on the op sequence,
so lavapipe gives the figures a GPU would. The parameters, AdamW's state and the batch
are allocated before the peak is reset; the step runs eagerly, once to compile and once
measured. Prints a table and the autocast / float32 ratio; ``--json FILE`` writes the rows.
Usage: python bench/gpt_memory.py [--config small|char_b16|gpt2_b1_t256|...] [--json FILE]"""

import argparse
import json

import numpy as np

import pywgtrain as pw
from pywgtrain import optim
from pywgtrain.models import GPT, GPTConfig
from pywgtrain.models.gpt import CONFIGS

# name: (config, batch). gpt2_b1_t256: GPT-2 small's shape at a batch and block a CPU adapter runs.
SHAPES = {
    "tiny": (CONFIGS["tiny"], 8),
    "small": (CONFIGS["small"], 8),
    "gpt2_b1_t256": (GPTConfig(vocab_size=50304, block_size=256, n_layer=12, n_head=12, n_embd=768), 1),
    "char_b16": (CONFIGS["char"], 16),  # the char config at a batch a CPU adapter runs
    "gpt2": (CONFIGS["gpt2"], 8),
}


def step_peak(dev, cfg, batch, half):
    """Peak allocated bytes of one eager training step (after one warm-up step)."""
    model = GPT(cfg, device=dev, seed=0)
    opt = optim.AdamW(model.parameters(), lr=1e-4)
    rng = np.random.default_rng(0)
    data = rng.integers(0, cfg.vocab_size, (batch, cfg.block_size + 1)).astype(np.int32)
    x, y = pw.tensor(data[:, :-1].copy(), dev), pw.tensor(data[:, 1:].copy(), dev)

    def step():
        with dev.batch():
            opt.zero_grad()
            with pw.autocast(enabled=half):
                loss = GPT.loss(model(x), y)
            loss.backward()
            opt.step()
        return loss.item()

    step()
    dev.synchronize()
    dev.memory_stats(reset_peak=True)
    base = dev.memory_stats()["allocated_bytes"]
    loss = step()
    peak = dev.memory_stats()["peak_allocated_bytes"]
    return {"peak_bytes": peak, "step_bytes": peak - base, "loss": loss}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", choices=sorted(SHAPES), help="repeatable; default: small")
    ap.add_argument("--json", help="write the rows to this file")
    args = ap.parse_args()
    dev = pw.default_device()
    rows = []
    print(
        f"{'config':<14} {'batch':>5} {'fp32 peak MiB':>14} {'autocast MiB':>13} {'ratio':>6} {'step-only ratio':>16}"
    )
    for name in args.config or ["small"]:
        cfg, batch = SHAPES[name]
        f32 = step_peak(dev, cfg, batch, False)
        f16 = step_peak(dev, cfg, batch, True)
        row = {"config": name, "batch": batch, "float32": f32, "autocast": f16}
        row["ratio"] = f16["peak_bytes"] / f32["peak_bytes"]
        row["step_ratio"] = f16["step_bytes"] / f32["step_bytes"]
        rows.append(row)
        print(
            f"{name:<14} {batch:>5} {f32['peak_bytes'] / 2**20:>14.1f} {f16['peak_bytes'] / 2**20:>13.1f} "
            f"{row['ratio']:>6.3f} {row['step_ratio']:>16.3f}",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": dev.info["name"], "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
