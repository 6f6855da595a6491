"""GPT.generate's time per token (greedy, KV cache) for the char and GPT-2
configurations at fixed random weights (seed 0), best of three calls, and a
hash of the tokens so two trees can be checked to agree.

    python bench/generate_time.py [LABEL]        # on the GPU machine after the prelude
"""

import hashlib
import sys
import time

import numpy as np

import pywgtrain as pw
from pywgtrain.models.gpt import CONFIGS, GPT


def main():
    label = sys.argv[1] if len(sys.argv) > 1 else "tree"
    dev = pw.Device()
    for name, new_tokens in (("char", 200), ("gpt2", 60)):
        model = GPT(CONFIGS[name], device=dev, seed=0)
        prompt = np.arange(16, dtype=np.int32)[None] % CONFIGS[name].vocab_size
        model.generate(prompt, 5, temperature=0.0)  # pipelines and plans first
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            out = model.generate(prompt, new_tokens, temperature=0.0)
            times.append(time.perf_counter() - t0)
        digest = hashlib.sha1(out.tobytes()).hexdigest()[:10]
        print(
            f"{label} {name}: {new_tokens} tokens, best {min(times) * 1e3:.1f} ms = "
            f"{min(times) / new_tokens * 1e3:.2f} ms/token (all {[round(t * 1e3, 1) for t in times]}), "
            f"output sha1 {digest}",
            flush=True,
        )


if __name__ == "__main__":
    main()
