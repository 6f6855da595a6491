"""The README's plain training loop (zero_grad, forward, loss, backward, step)
without ``dev.batch()`` and inside it, for the nanoGPT char and GPT-2 small
configurations of ``pywgtrain bench gpt``: ms per step over 10 steps after 3.

    python bench/loop_time.py [LABEL]        # on the GPU machine after the prelude
"""

import sys
import time

import pywgtrain as pw
from pywgtrain import optim
from pywgtrain.benchmarks.gpt import CONFIGS, _batches, _groups
from pywgtrain.models.gpt import GPT


def main():
    label = sys.argv[1] if len(sys.argv) > 1 else "tree"
    dev = pw.default_device()
    for name, cfg, batch in CONFIGS:
        model = GPT(cfg, device=dev, seed=0)
        opt = optim.AdamW(_groups(model.named_parameters()), lr=3e-4, betas=(0.9, 0.95), max_grad_norm=1.0)
        data = [(pw.tensor(x, dev), pw.tensor(y, dev)) for x, y in _batches(cfg, batch)]

        def step(x, y):
            opt.zero_grad()
            loss = GPT.loss(model(x), y)
            loss.backward()
            opt.step()
            return loss

        def batched(x, y):
            with dev.batch():
                return step(x, y)

        for kind, fn in (("loop without dev.batch()", step), ("loop in dev.batch()", batched)):
            for i in range(3):
                fn(*data[i % len(data)]).item()
            dev.synchronize()
            t0 = time.perf_counter()
            for i in range(10):
                loss = fn(*data[i % len(data)])
            loss.item()
            dev.synchronize()
            ms = (time.perf_counter() - t0) * 100
            print(f"{label} {name.split(':')[0]} {kind}: {ms:.1f} ms/step", flush=True)


if __name__ == "__main__":
    main()
