"""Parity of a GPT under pywgtrain.autocast with its PyTorch twin under
torch.autocast(dtype=torch.float16): the same weights, the same batches, AdamW
around forward + loss under autocast (torch's recipe), no loss scaling (the
losses stay far from float16's range limits). Prints the logits' relative
difference (max |ours - torch| / max |torch|) and each step's loss on both
sides. torch runs on CUDA when it is available (tensor cores: its float16
products accumulate differently), else on the CPU.
Usage (from the repo root: it imports the twin of tests/test_gpt.py):
    python bench/autocast_parity.py [--steps 20] [--json FILE]"""

import argparse
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as TF

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import pywgtrain as pw  # noqa: E402
from pywgtrain.models import GPT, GPTConfig  # noqa: E402
from test_gpt import rel, twin  # noqa: E402

CONFIG = dict(vocab_size=256, block_size=128, n_layer=4, n_head=4, n_embd=256)
BATCH = 8


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    where = "cuda" if torch.cuda.is_available() else "cpu"
    dev = pw.default_device()
    model = GPT(GPTConfig(**CONFIG), device=dev, seed=1)
    tm = twin(model).to(where)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, CONFIG["vocab_size"], (BATCH, CONFIG["block_size"]))
    with pw.autocast():
        got = model(ids.astype(np.int32)).numpy()
    with torch.autocast(where, dtype=torch.float16):
        want = tm(torch.from_numpy(ids).to(where)).detach().float().cpu().numpy()
    logits_rel = rel(got, want)
    print(f"adapter: {dev.name}; torch {torch.__version__} on {where}")
    print(f"GPT {CONFIG}, batch {BATCH}: logits under autocast, max |ours - torch| / max |torch| = {logits_rel:.2e}")

    opt = pw.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    topt = torch.optim.AdamW(tm.parameters(), lr=1e-3, betas=(0.9, 0.95))
    rows = []
    print(f"{'step':>4} {'ours':>9} {'torch':>9} {'rel diff':>9}")
    for step in range(args.steps):
        d = rng.integers(0, CONFIG["vocab_size"], (BATCH, CONFIG["block_size"] + 1))
        opt.zero_grad()
        with pw.autocast():
            loss = GPT.loss(model(d[:, :-1].astype(np.int32)), d[:, 1:].astype(np.int32))
        loss.backward()
        opt.step()
        topt.zero_grad()
        td = torch.from_numpy(d).to(where)
        with torch.autocast(where, dtype=torch.float16):
            tloss = TF.cross_entropy(tm(td[:, :-1]).reshape(-1, CONFIG["vocab_size"]), td[:, 1:].reshape(-1))
        tloss.backward()
        topt.step()
        a, b = loss.item(), tloss.item()
        rows.append(dict(step=step, ours=a, torch=b, rel=abs(a - b) / abs(b)))
        print(f"{step:>4} {a:9.5f} {b:9.5f} {rows[-1]['rel']:9.2e}")
    worst = max(r["rel"] for r in rows)
    print(f"largest relative loss difference over {args.steps} steps: {worst:.2e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                dict(
                    adapter=dev.name,
                    torch_device=where,
                    config=CONFIG,
                    batch=BATCH,
                    logits_rel=logits_rel,
                    steps=rows,
                    worst_loss_rel=worst,
                ),
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
