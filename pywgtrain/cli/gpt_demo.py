"""The main job behind ``pywgtrain gpt``: a small GPT trained on the Python
standard library's own source files (on every machine; nothing is
downloaded), byte-level tokens, with a progress line (loss, tokens/s),
validation loss, a loss-curve PNG, a safetensors checkpoint and text sampled
from the model at the end.

Batches come from a memory-mapped file; batch ``s`` is drawn from a
generator seeded with ``(seed, s)``, so a resumed run sees exactly the
batches an uninterrupted one would (its next step is bit-identical).

Started by torchrun (``torchrun --nproc_per_node N -m pywgtrain gpt ...``: its
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` are set),
every process trains the same model data-parallel (``DistributedDataParallel`` over
gloo) on the GPU of its ``LOCAL_RANK``: rank r draws batch ``s`` from ``(seed, s, r)``,
``--batch-size`` sequences per rank, and rank 0 alone prints, evaluates, plots,
samples and writes the checkpoint (whose weights load with any number of processes).
"""

import contextlib
import datetime
import os
import sys
import time
from dataclasses import asdict, replace

import numpy as np

from .. import optim
from ..amp import GradScaler
from ..benchmarks.common import check_output_path, rank_adapter
from ..data import ByteTokenizer, TokenDataset, stdlib_corpus_file
from ..device import Device
from ..models.gpt import CONFIGS, GPT
from ..optim.lr_scheduler import warmup_cosine
from ..random import manual_seed
from ..train import Trainer
from .demo import _check_count, _StopOnInterrupt, check_plot_path

# Per named config: steps, batch size, learning rate (a few minutes on a CPU adapter for "tiny").
DEFAULTS = {"tiny": (300, 16, 3e-3), "small": (2000, 32, 1e-3), "char": (5000, 64, 1e-3), "gpt2": (5000, 8, 6e-4)}


def evaluate(model, data, split, batch_size, block_size, iters, seed):
    """Mean loss over ``iters`` fixed batches of ``split`` (no graph recorded)."""
    from ..autograd import no_grad

    rng = np.random.default_rng([seed, 7919])
    model.eval()
    total = 0.0
    try:
        with no_grad():
            for _ in range(iters):
                x, y = data.batch(split, batch_size, block_size, rng)
                total += GPT.loss(model(x), y).item()
    finally:
        model.train()
    return total / iters


def run_gpt(
    config="tiny",
    steps=None,
    batch_size=None,
    block_size=None,
    lr=None,
    weight_decay=0.1,
    seed=0,
    adapter=None,
    eval_every=None,
    eval_iters=10,
    max_bytes=None,
    plot="gpt_loss_curve.png",
    checkpoint=None,
    resume=None,
    sample_tokens=300,
    attention="fused",
    steps_per_submit=8,
    max_grad_norm=1.0,
    warmup=None,
    log_every=None,
    progress=None,
    prompt="def ",
    precision="fp32",
):
    """Train (``precision="fp16"``: training steps under ``pywgtrain.autocast`` with a ``GradScaler``); returns a dict with ``train_losses`` [(step, loss)], ``val_losses``
    [(step, loss)], ``tokens_per_s``, ``sample``, ``interrupted``, ``step``, ``total``
    (under torchrun: rank 0's evaluations and sample; the other ranks' lists of those are empty)."""
    args = dict(locals())
    launch = torchrun_env()
    if launch is None:
        return _train(**args)
    rank, world, local_rank = launch
    import torch.distributed as dist

    # Generous: rank 0 evaluates, plots and saves while the others wait in their next all_reduce.
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
    if args["adapter"] is None:
        args["adapter"] = rank_adapter(local_rank)
    try:
        with (
            open(os.devnull, "w") as devnull,
            contextlib.redirect_stdout(devnull) if rank else contextlib.nullcontext(),
        ):
            return _train(**args, rank=rank, world=world)
    finally:
        dist.destroy_process_group()


def torchrun_env():
    """(rank, world size, local rank) in a process torchrun started (its variables set), else None."""
    env = os.environ
    if not all(k in env for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")):
        return None
    return int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"])


def _train(
    config,
    steps,
    batch_size,
    block_size,
    lr,
    weight_decay,
    seed,
    adapter,
    eval_every,
    eval_iters,
    max_bytes,
    plot,
    checkpoint,
    resume,
    sample_tokens,
    attention,
    steps_per_submit,
    max_grad_norm,
    warmup,
    log_every,
    progress,
    prompt,
    precision,
    rank=None,
    world=1,
):
    """run_gpt's training; ``rank`` set: one of ``world`` data-parallel processes (a process group is up)."""
    lead = not rank  # rank 0, or the only process: prints, evaluates, plots, samples, saves
    if config not in CONFIGS:
        raise ValueError(f"config must be one of {sorted(CONFIGS)}, got {config!r}")
    d_steps, d_batch, d_lr = DEFAULTS[config]
    steps = d_steps if steps is None else steps
    batch_size = d_batch if batch_size is None else batch_size
    lr = d_lr if lr is None else lr
    for v, n in ((steps, "steps"), (batch_size, "batch_size"), (eval_iters, "eval_iters")):
        _check_count(v, n)
    for v, n in (
        (block_size, "block_size"),
        (eval_every, "eval_every"),
        (log_every, "log_every"),
        (max_bytes, "max_bytes"),
    ):
        _check_count(v, n, allow_none=True)
    if sample_tokens < 0:
        raise ValueError(f"sample_tokens must be >= 0, got {sample_tokens}")
    check_output_path(checkpoint, "--checkpoint")
    check_plot_path(plot)
    cfg = CONFIGS[config]
    cfg = replace(cfg, attention=attention, **({"block_size": block_size} if block_size else {}))
    eval_every = eval_every or max(steps // 5, 1)
    log_every = log_every or max(steps // 20, 1)
    warmup = min(steps // 10, 100) if warmup is None else warmup

    tok = ByteTokenizer()
    path = stdlib_corpus_file(max_bytes)
    data = TokenDataset(path)
    dev = Device(adapter)
    model = GPT(cfg, device=dev, seed=seed)
    net = model
    if rank is not None:
        from ..nn.parallel import DistributedDataParallel

        net = DistributedDataParallel(model)  # rank 0's initial weights everywhere
    named = list(model.named_parameters())
    groups = [
        {"params": [p for _, p in named if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for _, p in named if p.dim() < 2], "weight_decay": 0.0},
    ]
    fp16 = precision == "fp16"
    # fp16: loss scaling without readbacks needs the optimizer to skip overflowing steps on the GPU
    opt = optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), max_grad_norm=max_grad_norm, capturable=fp16)
    sched = warmup_cosine(opt, warmup, steps, min_lr_ratio=0.1)
    trainer = Trainer(
        net, opt, GPT.loss, steps_per_submit=steps_per_submit, autocast=fp16, scaler=GradScaler() if fp16 else None
    )
    start = 0
    if resume:
        trainer.load(resume)  # every rank reads the file (on multi-host runs: a path all hosts see)
        start = trainer.step_count
        sched.last_epoch = start - 1
        sched.step()
    if rank is not None:  # dropout: every rank its own masks (after a resume too, not rank 0's saved state)
        manual_seed(int(np.random.default_rng([seed, start, rank]).integers(1 << 62)), dev)
    print(f"adapter: {dev.name} ({dev.backend}, {dev.info['driver']})")
    print(
        f"model: GPT '{config}' {cfg.n_layer} layers, d {cfg.n_embd}, {cfg.n_head} heads, context "
        f"{cfg.block_size}, {cfg.attention} attention; {model.num_parameters():,} parameters"
    )
    print(
        f"data: Python {sys.version.split()[0]} standard library sources, {len(data):,} bytes "
        f"({len(data.splits['train']):,} train / {len(data.splits['val']):,} validation), byte tokens"
    )
    print(
        f"training: {steps} steps of {batch_size} x {cfg.block_size} tokens, AdamW lr {lr:g} (warm-up {warmup}, "
        f"cosine), clip {max_grad_norm}" + (f"; resumed at step {start}" if resume else "")
    )
    if start >= steps:
        print(f"{resume} is at step {start}, at or past --steps {steps}: nothing to train (raise --steps to go on)")
    if rank is not None:
        print(
            f"data-parallel: {world} processes (torchrun), gloo all_reduce, {batch_size} x {cfg.block_size} tokens "
            "per rank and step, each rank its own batches; this process (rank 0) alone writes the outputs"
        )
    sys.stdout.flush()

    tokens_per_step = batch_size * cfg.block_size * world
    train_losses, val_losses, pending = [], [], []
    use_bar = progress == "bar" or (progress is None and sys.stdout.isatty() and sys.stderr.isatty())
    bar, t0, timed_from, s = None, None, start, start

    def read():
        for step, loss in pending:
            train_losses.append((step, loss.item()))
        pending.clear()

    with _StopOnInterrupt() as stop:
        while s < steps and not stop.requested:
            x, y = data.batch("train", batch_size, cfg.block_size, np.random.default_rng(_batch_seed(seed, s, rank)))
            first = s == start
            if first:
                print("compiling kernels (first steps)...", end=" ", flush=True)
                tc = time.perf_counter()
            pending.append((s, trainer.step(x, y)))
            sched.step()
            s += 1
            if first:
                read()
                print(f"done in {time.perf_counter() - tc:.1f} s", flush=True)
                t0, timed_from = time.perf_counter(), s
                if use_bar:
                    from tqdm import tqdm

                    bar = tqdm(total=steps, initial=start, desc="train", unit="step")
            if rank is not None:
                _agree_on_stop(stop)  # every rank stops after the same step (a Ctrl-C reaches them apart)
            if s % log_every == 0 or s == steps or s % eval_every == 0 or stop.requested:
                read()
                rate = tokens_per_step * (s - timed_from) / (time.perf_counter() - t0) if s > timed_from else 0.0
                msg = f"loss {train_losses[-1][1]:.4f}, {rate:,.0f} tok/s"
                if lead and (s % eval_every == 0 or s == steps):
                    val = evaluate(model, data, "val", batch_size, cfg.block_size, eval_iters, seed)
                    val_losses.append((s, val))
                    msg += f", val {val:.4f}"
                if bar is not None:
                    bar.set_postfix_str(msg, refresh=False)
                else:
                    print(f"step {s}/{steps}: {msg}", flush=True)
            if bar is not None:
                bar.update(1)
        read()
        if bar is not None:
            bar.close()
        elapsed = time.perf_counter() - t0 if t0 is not None else 0.0
        interrupted = stop.requested and s < steps
        if lead and checkpoint and (interrupted or s > start):
            trainer.save(checkpoint, extra={"config": asdict(cfg)})
            print(f"checkpoint: {checkpoint} (step {s})", flush=True)
    tps = tokens_per_step * (s - timed_from) / elapsed if elapsed > 0 and s > timed_from else None
    result = {
        "train_losses": train_losses,
        "val_losses": val_losses,
        "tokens_per_s": tps,
        "interrupted": interrupted,
        "step": s,
        "total": steps,
        "sample": None,
    }
    if interrupted:
        print(f"interrupted at step {s} of {steps}", flush=True)
        return result
    if tps:
        print(
            f"{tps:,.0f} tokens/s ({elapsed / (s - timed_from) * 1e3:.1f} ms/step over {s - timed_from} steps, "
            "not counting the first)"
        )
    if val_losses:
        print(f"validation loss {val_losses[-1][1]:.4f} (bits per byte {val_losses[-1][1] / np.log(2):.3f})")
    if lead and plot and train_losses:
        _plot(plot, train_losses, val_losses, dev, config)
        print(f"loss curve: {plot}")
    if lead and sample_tokens:
        ids = tok.encode(prompt)
        out = model.generate(ids, sample_tokens, temperature=0.8, top_k=50, seed=seed)
        result["sample"] = tok.decode(out[0])
        print(f"sample ({sample_tokens} tokens, temperature 0.8, top-k 50, KV cache):\n" + "-" * 60)
        print(result["sample"])
        print("-" * 60)
    sys.stdout.flush()
    return result


def _batch_seed(seed, step, rank):
    """Batch ``step``'s generator seed: (seed, step) alone, or rank's own under torchrun."""
    return [seed, step] if rank is None else [seed, step, rank]


def _agree_on_stop(stop):
    """Stop on every rank if any rank was asked to (a max all_reduce of the flag)."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([int(stop.requested)])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    stop.requested = bool(flag.item())


def _plot(path, train_losses, val_losses, dev, config):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([s for s, _ in train_losses], [v for _, v in train_losses], lw=1, label="train")
    if val_losses:
        ax.plot([s for s, _ in val_losses], [v for _, v in val_losses], "o-", lw=1.5, label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per byte)")
    ax.set_title(f"pywgtrain GPT '{config}' on Python stdlib sources\n({dev.name[:50]})", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
