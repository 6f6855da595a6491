"""float32 vs pywgtrain.autocast (float16) wall times per forward + backward: a linear layer
with bias and GELU (float32: one fused GEMM epilogue; autocast: the float16 GEMM, then the bias
add and GELU as separate float16 element-wise ops), and a GPT training step (forward,
loss, backward, AdamW), beside torch on CUDA in float32 (TF32 off) and under
torch.autocast(dtype=torch.float16) when PyTorch with CUDA is importable.
Usage: python bench/autocast_bench.py [--quick] [--json FILE]"""

import json
import sys
import time

import numpy as np

import pywgtrain as pw
from pywgtrain.benchmarks.common import _torch_cuda
from pywgtrain.models import GPT, GPTConfig

LINEARS = [(8192, 768, 3072), (8192, 3072, 768), (16384, 1024, 4096)]  # rows, in, out
GPTS = [dict(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768, batch=8)]
QUICK_LINEARS = [(33, 64, 129)]
QUICK_GPTS = [dict(vocab_size=67, block_size=24, n_layer=2, n_head=4, n_embd=32, batch=3)]


def timed(fn, sync, reps):
    fn()  # warm-up (pipelines compiled)
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t0) / reps


def ours_linear(rows, k, n, amp, reps):
    dev = pw.default_device()
    rng = np.random.default_rng(0)
    x = pw.tensor(rng.standard_normal((rows, k), dtype=np.float32), dev)
    w = pw.tensor(rng.standard_normal((n, k), dtype=np.float32) * k**-0.5, dev, requires_grad=True)
    b = pw.tensor(rng.standard_normal(n, dtype=np.float32), dev, requires_grad=True)

    def step():
        w.grad = b.grad = None
        with pw.autocast(enabled=amp):
            y = pw.linear(x, w, b, "gelu")
        y.sum().backward()

    return timed(step, lambda: w.grad.numpy(), reps)


def ours_gpt(cfg, amp, reps):
    cfg = dict(cfg)
    batch = cfg.pop("batch")
    dev = pw.default_device()
    model = GPT(GPTConfig(**cfg), device=dev, seed=0)
    opt = pw.optim.AdamW(model.parameters(), lr=1e-4)
    rng = np.random.default_rng(0)
    data = rng.integers(0, cfg["vocab_size"], (batch, cfg["block_size"] + 1)).astype(np.int32)
    x, y = (pw.tensor(np.ascontiguousarray(a), dev) for a in (data[:, :-1], data[:, 1:]))
    last = []

    def step():
        opt.zero_grad()
        with pw.autocast(enabled=amp):
            loss = GPT.loss(model(x), y)
        loss.backward()
        opt.step()
        last[:] = [loss]

    return timed(step, lambda: last[0].item(), reps)


def torch_linear(torch, rows, k, n, amp, reps):
    x = torch.randn(rows, k, device="cuda")
    lin = torch.nn.Linear(k, n, device="cuda")

    def step():
        lin.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            y = torch.nn.functional.gelu(lin(x))
        y.float().sum().backward()

    return timed(step, torch.cuda.synchronize, reps)


def torch_gpt(torch, cfg, amp, reps):
    sys.path.insert(0, "tests")
    from test_gpt import TorchGPT  # the twin the parity tests use

    cfg = dict(cfg)
    batch = cfg.pop("batch")
    model = TorchGPT(GPTConfig(**cfg)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.randint(0, cfg["vocab_size"], (batch, cfg["block_size"] + 1), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            logits = model(data[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg["vocab_size"]), data[:, 1:].reshape(-1))
        loss.backward()
        opt.step()

    return timed(step, torch.cuda.synchronize, reps)


def main():
    quick = "--quick" in sys.argv
    out = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
    reps = 2 if quick else 10
    torch = _torch_cuda()
    print(f"adapter: {pw.default_device().name}; torch CUDA: {'yes' if torch else 'no'} (TF32 off)")
    rows = []
    header = f"{'case':<44} {'f32 ms':>9} {'amp ms':>9} {'speedup':>8} {'torch f32':>10} {'torch amp':>10}"
    print(header)
    cases = [
        (f"linear+gelu fwd+bwd {r}x{k}->{n}", ours_linear, torch_linear, (r, k, n))
        for r, k, n in (QUICK_LINEARS if quick else LINEARS)
    ]
    cases += [
        (f"gpt step L{c['n_layer']} d{c['n_embd']} B{c['batch']} T{c['block_size']}", ours_gpt, torch_gpt, (c,))
        for c in (QUICK_GPTS if quick else GPTS)
    ]
    for name, ours, theirs, args in cases:
        f32, amp = (ours(*args, a, reps) * 1e3 for a in (False, True))
        t32 = tamp = None
        if torch is not None:
            t32, tamp = (theirs(torch, *args, a, reps) * 1e3 for a in (False, True))
        fmt = lambda v: f"{v:10.3f}" if v is not None else f"{'-':>10}"  # noqa: E731
        print(f"{name:<44} {f32:9.3f} {amp:9.3f} {f32 / amp:7.2f}x {fmt(t32)} {fmt(tamp)}", flush=True)
        rows.append(dict(case=name, f32_ms=f32, amp_ms=amp, torch_f32_ms=t32, torch_amp_ms=tamp))
    if out:
        with open(out, "w") as f:
            json.dump(dict(adapter=pw.default_device().name, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
