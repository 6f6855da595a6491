"""Greedy decoding time per token at batch 1: GPT.generate with its captured
decode step (the default), the same with every op recorded per token
(``capture=False``), and, where PyTorch with CUDA and Hugging Face
``transformers`` are importable, ``GPT2LMHeadModel.generate`` on the same
configuration (greedy, its KV cache, PyTorch eager, fp32, TF32 off) in the
same process. Each figure is one whole ``generate`` call (the prompt's
forward included, as on transformers' side) divided by the new tokens, best
of ``--reps`` calls after a warm-up call; random weights (seed 0), prompt
``arange(prompt) % vocab``. The tokens' hash shows that the captured and
eager paths agree.

    python bench/generate_time.py                        # char and gpt2, 16-token prompt, 200 new tokens
    python bench/generate_time.py --configs tiny --tokens 20 --reps 1   # a CPU adapter (lavapipe)
    python bench/generate_time.py --json out.json        # also write the rows as JSON
"""

import argparse
import hashlib
import json
import time
from functools import partial

import numpy as np

import pywgtrain as pw
from pywgtrain.benchmarks.common import _torch_cuda
from pywgtrain.models.gpt import CONFIGS, GPT


def _best(fn, reps):
    fn()  # warm-up: pipelines, GEMM plans, the captured step
    best, out = float("inf"), None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def hf_generate(name, prompt_len, new_tokens, reps):
    """Seconds per token of transformers' greedy generate on CUDA; None without torch+CUDA or transformers."""
    torch = _torch_cuda()  # TF32 off
    if torch is None:
        return None
    try:
        import transformers
    except ImportError:
        return None
    cfg = CONFIGS[name]
    hf_cfg = transformers.GPT2Config(
        vocab_size=cfg.vocab_size, n_positions=cfg.block_size, n_embd=cfg.n_embd, n_layer=cfg.n_layer, n_head=cfg.n_head
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(hf_cfg).cuda().eval()
    prompt = (torch.arange(prompt_len, device="cuda")[None] % cfg.vocab_size).long()

    def run():
        with torch.no_grad():
            out = model.generate(
                prompt,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                use_cache=True,
                pad_token_id=0,
            )
        torch.cuda.synchronize()
        return out

    best, _ = _best(run, reps)
    return best / new_tokens


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", nargs="+", default=["char", "gpt2"], choices=sorted(CONFIGS))
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    ap.add_argument("--tokens", type=int, default=200, help="new tokens per generate call")
    ap.add_argument("--reps", type=int, default=3, help="timed calls (best kept)")
    ap.add_argument("--json", help="write the rows to this file")
    args = ap.parse_args(argv)
    dev = pw.Device()
    print(f"device: {dev.name}; batch 1, greedy, {args.prompt}-token prompt, {args.tokens} new tokens")
    print(f"{'config':8} {'path':32} {'ms/token':>9} {'tokens/s':>9}  tokens sha1")
    rows = []

    def row(name, path, sec, digest=""):
        rows.append({"config": name, "path": path, "ms_per_token": sec * 1e3, "tokens_per_s": 1.0 / sec})
        print(f"{name:8} {path:32} {sec * 1e3:9.2f} {1.0 / sec:9.1f}  {digest}", flush=True)

    for name in args.configs:
        cfg = CONFIGS[name]
        model = GPT(cfg, device=dev, seed=0)
        prompt = np.arange(args.prompt, dtype=np.int32)[None] % cfg.vocab_size
        for path, capture in (("pywgtrain (captured step)", True), ("pywgtrain (eager)", False)):
            best, out = _best(partial(model.generate, prompt, args.tokens, temperature=0.0, capture=capture), args.reps)
            row(name, path, best / args.tokens, hashlib.sha1(out.tobytes()).hexdigest()[:10])
        hf = hf_generate(name, args.prompt, args.tokens, args.reps)
        if hf is None:
            print(
                f"{name:8} {'transformers (CUDA eager, KV)':32} {'n/a':>9} {'n/a':>9}  (needs torch with CUDA and transformers)"
            )
        else:
            row(name, "transformers (CUDA eager, KV)", hf)
            ours = rows[-3]["tokens_per_s"]
            print(f"{name:8} captured step / transformers: {ours * hf:.2f}x tokens/s", flush=True)
        del model
        dev.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": dev.name, "prompt": args.prompt, "tokens": args.tokens, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
