"""One GPT training step per `bench gpt` configuration through Trainer, under
autocast (GradScaler, capturable AdamW) and in float32: ms per step and the
caching allocator's peak (allocated and reserved). Run it once per installed
tree, in one call, to compare trees (`h200_autocast_step.txt`). On a CPU adapter
(lavapipe) it runs `bench gpt`'s CPU configuration instead.

    python bench/autocast_step.py LABEL [fp32]    # fp32: the float32 step too
"""

import sys

import pywgtrain as pw
from pywgtrain.benchmarks.common import is_cpu_adapter
from pywgtrain.benchmarks.gpt import CONFIGS, CPU_CONFIGS, time_ours


def main():
    label = sys.argv[1] if len(sys.argv) > 1 else "ours"
    dev = pw.default_device()
    for name, cfg, batch in CPU_CONFIGS if is_cpu_adapter(dev) else CONFIGS:
        for fp16 in (True, False) if "fp32" in sys.argv[2:] else (True,):
            r = time_ours(dev, cfg, batch, steps=10 if cfg.n_layer > 6 else 20, profile=False, fp16=fp16)
            print(
                f"{label:5s} {name[:12]:12s} {'fp16' if fp16 else 'fp32'}: {r['ms']:7.1f} ms/step, "
                f"peak {r['memory_mb']:8.0f} MiB allocated, {r['reserved_mb']:8.0f} reserved, loss {r['loss']:.4f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
