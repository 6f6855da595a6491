"""GPT training step time through Trainer (captured, replayed) and through the
README's plain loop (zero_grad, forward, loss, backward, step inside
``dev.batch()``), in one process, on the nanoGPT char configuration (GPU) or a
tiny one (CPU adapter). Prints one JSON line per way.

    python bench/loop_step.py [--steps N]     # on the GPU machine after the prelude
"""

import argparse
import json
import time

import pywgtrain as pw
from pywgtrain.bench import is_cpu_adapter
from pywgtrain.bench_gpt import CONFIGS, CPU_CONFIGS, _batches, _groups
from pywgtrain.models import GPT
from pywgtrain.train import Trainer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    dev = pw.Device()
    name, cfg, batch = (CPU_CONFIGS if is_cpu_adapter(dev) else CONFIGS)[0]
    data = [(pw.tensor(x, dev), pw.tensor(y, dev)) for x, y in _batches(cfg, batch)]

    def fresh():
        model = GPT(cfg, device=dev, seed=0)
        opt = pw.optim.AdamW(_groups(model.named_parameters()), lr=3e-4, betas=(0.9, 0.95), max_grad_norm=1.0)
        return model, opt

    def run(step):
        for i in range(3):
            step(*data[i % len(data)]).item()
        dev.synchronize()
        t0 = time.perf_counter()
        for i in range(args.steps):
            loss = step(*data[i % len(data)])
        value = loss.item()
        dev.synchronize()
        return (time.perf_counter() - t0) / args.steps * 1e3, value

    model, opt = fresh()
    trainer = Trainer(model, opt, GPT.loss, steps_per_submit=4)
    ms, loss = run(trainer.step)
    print(json.dumps({"config": name, "way": "trainer", "ms": round(ms, 2), "loss": loss}), flush=True)

    model, opt = fresh()

    def plain(x, y):
        with dev.batch():
            opt.zero_grad()
            loss = GPT.loss(model(x), y)
            loss.backward()
            opt.step()
        return loss

    ms, loss = run(plain)
    print(json.dumps({"config": name, "way": "plain_loop", "ms": round(ms, 2), "loss": loss}), flush=True)


if __name__ == "__main__":
    main()
