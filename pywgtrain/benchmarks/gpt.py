"""``pywgtrain bench gpt``: a GPT training step (forward, cross-entropy,
backward, clip 1.0, AdamW) in pywgtrain beside the same model in PyTorch,
fp32 with TF32 off, fused AdamW, in one process: ms/step, tokens/s, a
per-kernel profile of ours, the same step in the README's plain loop
(``pywgtrain_loop``: no Trainer), the step under autocast with a GradScaler
(``pywgtrain_fp16``, where the adapter has shader-f16), and the PyTorch variants
(attention written out, scaled_dot_product_attention, SDPA under torch.autocast
float16 with its GradScaler (tensor cores: a reference), torch.compile)."""

import math
import time

import numpy as np

from .. import optim
from ..amp import GradScaler
from ..models.gpt import GPT, GPTConfig
from ..tensor import tensor
from ..train import Trainer
from .common import is_cpu_adapter

CONFIGS = [
    (
        "nanoGPT char: 6 layers, d 384, 6 heads, T 256, batch 64, vocab 65",
        GPTConfig(vocab_size=65, block_size=256, n_layer=6, n_head=6, n_embd=384),
        64,
    ),
    (
        "GPT-2 small: 12 layers, d 768, 12 heads, T 1024, batch 8, vocab 50304, untied head",
        GPTConfig(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768),
        8,
    ),
]
CPU_CONFIGS = [
    (
        "tiny: 2 layers, d 64, 4 heads, T 64, batch 8, vocab 256",
        GPTConfig(vocab_size=256, block_size=64, n_layer=2, n_head=4, n_embd=64),
        8,
    )
]


def _groups(named, wd=0.1):
    named = list(named)
    return [
        {"params": [p for _, p in named if p.dim() >= 2], "weight_decay": wd},
        {"params": [p for _, p in named if p.dim() < 2], "weight_decay": 0.0},
    ]


def _batches(cfg, batch, n=4, seed=0):
    rng = np.random.default_rng(seed)
    data = rng.integers(0, cfg.vocab_size, (n, batch, cfg.block_size + 1)).astype(np.int32)
    return [(d[:, :-1].copy(), d[:, 1:].copy()) for d in data]


def time_ours(dev, cfg, batch, steps, profile=True, loop=False, fp16=False):
    """ms per step through Trainer (captured, 4 steps per submission), or with
    ``loop`` through the README's plain loop: zero_grad, forward, loss,
    backward and step inside ``dev.batch()``. ``fp16``: Trainer with autocast
    and a GradScaler (AdamW capturable, so overflowing steps skip on the GPU)."""
    dev.synchronize()
    dev.memory_stats(reset_peak=True)
    model = GPT(cfg, device=dev, seed=0)
    opt = optim.AdamW(_groups(model.named_parameters()), lr=3e-4, betas=(0.9, 0.95), max_grad_norm=1.0, capturable=fp16)
    scaler = GradScaler() if fp16 else None
    trainer = Trainer(model, opt, GPT.loss, steps_per_submit=4, autocast=fp16, scaler=scaler)

    def plain(x, y):
        with dev.batch():
            opt.zero_grad()
            loss = GPT.loss(model(x), y)
            loss.backward()
            opt.step()
        return loss

    step = plain if loop else trainer.step
    data = [(tensor(x, dev), tensor(y, dev)) for x, y in _batches(cfg, batch)]
    for i in range(3):  # eager, capture, first replay
        step(*data[i % len(data)]).item()
    dev.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        loss = step(*data[i % len(data)])
    loss.item()
    dev.synchronize()
    ms = (time.perf_counter() - t0) / steps * 1e3
    row = {
        "ms": ms,
        "tokens_per_s": batch * cfg.block_size / ms * 1e3,
        "loss": loss.item(),
        "params": model.num_parameters(),
        "memory_mb": dev.memory_stats()["peak_allocated_bytes"] / 2**20,
        "reserved_mb": dev.memory_stats()["peak_reserved_bytes"] / 2**20,
    }
    if profile and not loop and "timestamp-query" in dev.features:
        row["profile"] = trainer.graph.profile(reps=2)
    return row


def _torch_model(torch, cfg, attention):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            c = cfg.n_embd
            self.ln_1, self.ln_2 = nn.LayerNorm(c), nn.LayerNorm(c)
            self.attn = nn.Module()
            self.attn.c_attn, self.attn.c_proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
            self.mlp = nn.Module()
            self.mlp.c_fc, self.mlp.c_proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
            self.register_buffer("mask", torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool).triu(1))

        def forward(self, x):
            b, t, c = x.shape
            h = cfg.n_head
            q, k, v = self.attn.c_attn(self.ln_1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, h, c // h).transpose(1, 2) for z in (q, k, v))
            if attention == "sdpa":
                y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // h))
                att = att.masked_fill(self.mask[:t, :t], float("-inf")).softmax(-1)
                y = att @ v
            x = x + self.attn.c_proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.mlp.c_proj(torch.nn.functional.gelu(self.mlp.c_fc(self.ln_2(x))))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(cfg.vocab_size, cfg.n_embd), nn.Embedding(cfg.block_size, cfg.n_embd)
            self.h = nn.ModuleList([Block() for _ in range(cfg.n_layer)])
            self.ln_f = nn.LayerNorm(cfg.n_embd)
            self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

        def forward(self, ids):
            x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
            for blk in self.h:
                x = blk(x)
            return self.lm_head(self.ln_f(x))

    return Model().cuda()


def time_torch(torch, cfg, batch, steps, attention, compile_model=False, fp16=False):
    """``fp16``: forward and loss under torch.autocast(float16) with torch.amp.GradScaler."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = _torch_model(torch, cfg, attention)
    opt = torch.optim.AdamW(_groups(model.named_parameters()), lr=3e-4, betas=(0.9, 0.95), fused=True)
    data = [(torch.from_numpy(x).long().cuda(), torch.from_numpy(y).long().cuda()) for x, y in _batches(cfg, batch)]
    fwd = torch.compile(model) if compile_model else model
    scaler = torch.amp.GradScaler("cuda", enabled=fp16)  # disabled: every call passes through

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16, enabled=fp16):
            loss = torch.nn.functional.cross_entropy(fwd(x).view(-1, cfg.vocab_size), y.view(-1))
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        return loss

    for i in range(3):
        step(*data[i % len(data)])
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for i in range(steps):
        loss = step(*data[i % len(data)])
    loss.item()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) / steps * 1e3
    out = {
        "ms": ms,
        "tokens_per_s": batch * cfg.block_size / ms * 1e3,
        "memory_mb": torch.cuda.max_memory_allocated() / 2**20,
    }
    del data  # model and opt go with this frame (step() closes over them)
    torch.cuda.empty_cache()
    return out


def bench_gpt(dev, quick, torch, compile_model=True):
    cpu = is_cpu_adapter(dev)
    steps = 3 if cpu else (5 if quick else 20)
    rows = []
    for name, cfg, batch in CPU_CONFIGS if cpu else CONFIGS:
        print(f"{name}:", flush=True)
        row = {
            "config": name,
            "batch": batch,
            **{k: getattr(cfg, k) for k in ("n_layer", "n_embd", "n_head", "block_size", "vocab_size")},
        }
        ours = time_ours(dev, cfg, batch, steps)
        row["pywgtrain"] = ours
        line = f"  pywgtrain: {ours['ms']:.1f} ms/step, {ours['tokens_per_s']:,.0f} tok/s"
        if ours.get("memory_mb"):
            line += f", peak {ours['memory_mb']:,.0f} MiB allocated, {ours['reserved_mb']:,.0f} reserved"
        print(line, flush=True)
        loop = time_ours(dev, cfg, batch, steps, loop=True)
        row["pywgtrain_loop"] = loop
        print(
            f"  pywgtrain_loop (plain loop, no Trainer): {loop['ms']:.1f} ms/step, "
            f"peak {loop['memory_mb']:,.0f} MiB allocated, {loop['reserved_mb']:,.0f} reserved"
        )
        if "shader-f16" in dev.features:
            half = time_ours(dev, cfg, batch, steps, profile=False, fp16=True)
            row["pywgtrain_fp16"] = half
            print(
                f"  pywgtrain_fp16 (Trainer, autocast, GradScaler): {half['ms']:.1f} ms/step, "
                f"{half['tokens_per_s']:,.0f} tok/s, peak {half['memory_mb']:,.0f} MiB allocated, "
                f"{half['reserved_mb']:,.0f} reserved"
            )
        if "profile" in ours:
            prof = ours["profile"]
            print(f"  GPU {prof['gpu_us'] / 1e3:.1f} ms in {prof['dispatches']} dispatches; top kernels:")
            for k in prof["kernels"][:12]:
                print(f"    {k['us'] / 1e3:8.2f} ms  {k['count']:4d}x  {k['kernel'][:90]}")
        if torch is not None:
            variants = [
                ("torch_eager_attention_written_out", "plain", False, False),
                ("torch_eager_sdpa", "sdpa", False, False),
                ("torch_eager_sdpa_autocast_fp16", "sdpa", False, True),  # tensor cores: a reference
            ]
            if compile_model and not quick:
                variants.append(("torch_compile_sdpa", "sdpa", True, False))
            for key, att, comp, half in variants:
                try:
                    r = time_torch(torch, cfg, batch, steps, att, comp, half)
                except Exception as e:  # torch.compile can be unavailable (no Triton / compiler)
                    print(f"  {key}: failed ({type(e).__name__}: {str(e)[:120]})", flush=True)
                    continue
                row[key] = r
                print(
                    f"  {key}: {r['ms']:.1f} ms/step, {r['tokens_per_s']:,.0f} tok/s, peak {r['memory_mb']:,.0f} MiB",
                    flush=True,
                )
        rows.append(row)
    return rows
