"""GPT.generate's time per token (greedy, KV cache) for the char and GPT-2
configurations at fixed random weights (seed 0), best of three calls, and a
hash of the tokens so two trees can be checked to agree; beside it, where
PyTorch with CUDA and Hugging Face ``transformers`` are importable, the same
sizes through ``GPT2LMHeadModel.generate`` (greedy, its KV cache, fp32, TF32
off) in the same process.

    python bench/generate_time.py [LABEL]        # on the GPU machine after the prelude
"""

import hashlib
import sys
import time

import numpy as np

import pywgtrain as pw
from pywgtrain.benchmarks.common import _torch_cuda
from pywgtrain.models.gpt import CONFIGS, GPT


def _best(fn, reps=3):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), times, out


def hf_generate(name, new_tokens):
    """Seconds per token of transformers' greedy generate on CUDA; None without torch+CUDA or transformers."""
    torch = _torch_cuda()  # TF32 off
    try:
        import transformers
    except ImportError:
        return None
    if torch is None:
        return None
    cfg = CONFIGS[name]
    hf_cfg = transformers.GPT2Config(
        vocab_size=cfg.vocab_size, n_positions=cfg.block_size, n_embd=cfg.n_embd, n_layer=cfg.n_layer, n_head=cfg.n_head
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(hf_cfg).cuda().eval()
    prompt = (torch.arange(16, device="cuda")[None] % cfg.vocab_size).long()

    def run(n):
        with torch.no_grad():
            out = model.generate(
                prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, use_cache=True, pad_token_id=0
            )
        torch.cuda.synchronize()
        return out

    run(5)
    best, _, _ = _best(lambda: run(new_tokens))
    return best / new_tokens


def main():
    label = sys.argv[1] if len(sys.argv) > 1 else "tree"
    dev = pw.Device()
    for name, new_tokens in (("char", 200), ("gpt2", 60)):
        model = GPT(CONFIGS[name], device=dev, seed=0)
        prompt = np.arange(16, dtype=np.int32)[None] % CONFIGS[name].vocab_size
        model.generate(prompt, 5, temperature=0.0)  # pipelines and plans first
        best, times, out = _best(lambda: model.generate(prompt, new_tokens, temperature=0.0))
        digest = hashlib.sha1(out.tobytes()).hexdigest()[:10]
        print(
            f"{label} {name}: {new_tokens} tokens, best {best * 1e3:.1f} ms = "
            f"{best / new_tokens * 1e3:.2f} ms/token (all {[round(t * 1e3, 1) for t in times]}), "
            f"output sha1 {digest}",
            flush=True,
        )
        hf = hf_generate(name, new_tokens)
        if hf is not None:
            print(f"transformers {name}: {hf * 1e3:.2f} ms/token (GPT2LMHeadModel.generate, CUDA, fp32)", flush=True)


if __name__ == "__main__":
    main()
