"""``pywgtrain bench ddp``: data-parallel GPT training over 1, 2, 4... processes, one
per GPU, beside PyTorch's DistributedDataParallel over NCCL on the same cards.

For every GPU count the benchmark launches its own worker processes the way torchrun
does (``MASTER_ADDR``/``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``; this
module is the worker: ``python -m pywgtrain.benchmarks.ddp SPEC_JSON``). Each rank
trains GPT-2 small (or ``--config tiny``) on its own batches with the README's plain
loop, fused AdamW, clip 1.0, fp32, two ways: ``--accumulate`` micro-batches per
optimizer step (``no_sync()`` for all but the last) and one micro-batch per step.

Per step, each rank measures
- ``step_ms``: wall clock of a DDP step (the slowest rank's is reported);
- ``compute_ms``: the same step with every backward inside ``no_sync()`` (no
  communication at all), measured in the same process;
- ``download_ms``, ``upload_ms``, ``all_reduce_ms``: the gradient buckets' busy times,
  summed over buckets (``DistributedDataParallel.comm_stats``);
- ``exposed_ms`` = step - compute: what communication added to the step;
- ``overlap_ms`` = download + upload + all_reduce - exposed: communication time that
  did not lengthen the step (hidden behind backward, or behind other buckets);
- ``tokens_per_s``: all ranks' tokens per step over ``step_ms``.
PyTorch's row (``torch_nccl``) runs the same model written in torch (SDPA attention,
TF32 off, fused AdamW) under ``torch.nn.parallel.DistributedDataParallel`` with NCCL.
"""

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pywgtrain

from .common import check_output_path, gpu_adapters, rank_adapter, time_steps

PACKAGE_PARENT = Path(pywgtrain.__file__).resolve().parent.parent


def parse_gpus(text):
    """'1,2,4' -> [1, 2, 4]: distinct positive counts."""
    try:
        counts = [int(v) for v in str(text).split(",")]
    except ValueError:
        counts = []
    if not counts or any(c < 1 for c in counts) or len(set(counts)) != len(counts):
        raise ValueError(f"--gpus must list distinct positive process counts like 1,2,4, got {text!r}")
    return counts


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(world, spec, timeout):
    """Run ``world`` workers of ``spec``; returns every rank's result dict."""
    with tempfile.TemporaryDirectory(prefix="pywgtrain-ddp-") as tmp:
        env = dict(os.environ)
        env.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(_free_port()),
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(world),
            PYTHONPATH=os.pathsep.join(p for p in [str(PACKAGE_PARENT), env.get("PYTHONPATH", "")] if p),
        )
        spec = dict(spec, out=tmp)
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "pywgtrain.benchmarks.ddp", json.dumps(spec)],
                cwd=tmp,  # `-m` puts the working directory first: a source checkout there would shadow PACKAGE_PARENT
                env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            for r in range(world)
        ]
        logs, deadline = [], time.monotonic() + timeout
        try:
            for p in procs:
                out, _ = p.communicate(timeout=max(deadline - time.monotonic(), 1))
                logs.append(out.decode(errors="replace"))
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{spec['impl']} with {world} processes did not finish within {timeout} s") from None
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        if any(p.returncode for p in procs):
            bad = next(r for r, p in enumerate(procs) if p.returncode)
            raise RuntimeError(f"{spec['impl']} rank {bad} of {world} failed:\n{logs[bad][-3000:]}")
        return [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(world)]


def _combine(ranks, world, tokens_per_rank_step):
    """One row from the ranks' measurements: the slowest rank's step, the mean of the rest."""
    step = max(r["step_ms"] for r in ranks)
    row = {"gpus": world, "step_ms": step, "tokens_per_s": world * tokens_per_rank_step / step * 1e3}
    for key in ranks[0]:
        if key != "step_ms":
            row[key] = sum(r[key] for r in ranks) / len(ranks)
    if "compute_ms" in row:
        row["exposed_ms"] = max(step - row["compute_ms"], 0.0)
        if "all_reduce_ms" in row:
            busy = row["download_ms"] + row["upload_ms"] + row["all_reduce_ms"]
            row["overlap_ms"] = max(busy - row["exposed_ms"], 0.0)
    return row


def bench_ddp(args):
    from ..device import Device
    from ..models.gpt import CONFIGS
    from .common import _torch_cuda, is_cpu_adapter

    counts = parse_gpus(args.gpus) if args.gpus else None
    if args.json:
        check_output_path(args.json, "--json")
    torch = None if args.no_baseline else _torch_cuda()
    gpus = gpu_adapters()
    probe = Device(args.adapter if args.adapter is not None else rank_adapter(0))
    cpu = is_cpu_adapter(probe)
    config = args.config or ("tiny" if cpu else "gpt2")
    if config not in ("tiny", "gpt2"):
        raise ValueError(f"--config must be tiny or gpt2 for bench ddp, got {config!r}")
    cfg = CONFIGS[config]
    batch = 8  # sequences per micro-batch and rank: bench gpt's GPT-2 small step
    if counts is None:
        counts = [n for n in (1, 2, 4) if n <= max(len(gpus), 1)] if not cpu else [1, 2]
    accumulate = args.accumulate
    steps = 1 if args.quick else (2 if cpu else 5)
    header = {
        "adapter": probe.name,
        "gpu_adapters": len(gpus),
        "config": config,
        "batch_per_rank": batch,
        "block_size": cfg.block_size,
        "accumulate": [accumulate, 1],
        "steps": steps,
        "overlap": not args.no_overlap,
        "gradient_compression": args.compression,
        "host_reduction": args.host_reduction,
        "bucket_cap_mb": args.bucket_cap_mb,
        "torch_cuda": None if torch is None else torch.cuda.get_device_name(0),
        "torch_gpus": 0 if torch is None else torch.cuda.device_count(),
    }
    del probe
    print(
        f"adapter: {header['adapter']} ({len(gpus)} GPU adapter(s)); GPT '{config}': {cfg.n_layer} layers, "
        f"d {cfg.n_embd}, T {cfg.block_size}, {batch} sequences per micro-batch and rank; accumulation "
        f"{accumulate} and 1; overlap {'on' if header['overlap'] else 'off'}, compression {args.compression}, host reduction {args.host_reduction}; "
        f"baseline: {'PyTorch DDP over NCCL on ' + header['torch_cuda'] if torch else 'none'}",
        flush=True,
    )
    if max(counts) > max(len(gpus), 1):
        print(f"  (more processes than GPU adapters: ranks beyond {len(gpus)} share the default adapter)")
    spec = {
        "config": config,
        "batch": batch,
        "accumulate": [accumulate, 1],
        "steps": steps,
        "overlap": header["overlap"],
        "compression": args.compression,
        "host_reduction": args.host_reduction,
        "bucket_cap_mb": args.bucket_cap_mb,
        "adapter": args.adapter,
    }
    rows = []
    print(
        f"{'impl':>10} {'gpus':>4} {'accum':>5} {'tok/s':>10} {'step ms':>9} {'compute':>8} {'download':>8} "
        f"{'upload':>7} {'allred':>7} {'exposed':>8} {'overlap':>8} {'scaling':>7}",
        flush=True,
    )
    base = {}
    for world in counts:
        impls = [("pywgtrain", world)]
        if torch is not None and world <= torch.cuda.device_count():
            impls.append(("torch_nccl", world))
        for impl, w in impls:
            ranks = _launch(w, dict(spec, impl=impl), timeout=args.timeout)
            for a, acc in enumerate(spec["accumulate"]):
                row = _combine([r["runs"][a] for r in ranks], w, acc * batch * cfg.block_size)
                row = {"impl": impl, "accumulate": acc, **row}
                key = (impl, acc)
                base.setdefault(key, row["tokens_per_s"] / w)  # per-GPU rate at the smallest count
                row["scaling_efficiency"] = row["tokens_per_s"] / (w * base[key])
                rows.append(row)
                print(
                    f"{impl:>10} {w:>4} {acc:>5} {row['tokens_per_s']:>10,.0f} {row['step_ms']:>9.1f} "
                    f"{row.get('compute_ms', 0):>8.1f} {row.get('download_ms', 0):>8.1f} {row.get('upload_ms', 0):>7.1f} "
                    f"{row.get('all_reduce_ms', 0):>7.1f} {row.get('exposed_ms', 0):>8.1f} "
                    f"{row.get('overlap_ms', 0):>8.1f} {row['scaling_efficiency']:>7.2f}",
                    flush=True,
                )
    result = {"meta": header, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ddp": result}, f, indent=1)
    return result


# -- the workers ----------------------------------------------------------------------------
def _pywgtrain_worker(spec, rank, world, local_rank):
    import torch.distributed as dist

    from .. import optim
    from ..device import Device
    from ..models.gpt import CONFIGS, GPT
    from ..nn.parallel import DistributedDataParallel
    from ..tensor import tensor
    from .gpt import _batches, _groups

    cfg = CONFIGS[spec["config"]]
    dev = Device(spec["adapter"] if spec["adapter"] is not None else rank_adapter(local_rank))
    model = DistributedDataParallel(
        GPT(cfg, device=dev, seed=0),
        bucket_cap_mb=spec["bucket_cap_mb"],
        gradient_compression=spec["compression"],
        host_reduction=spec["host_reduction"],
        overlap=spec["overlap"],
    )
    opt = optim.AdamW(_groups(model.named_parameters()), lr=3e-4, betas=(0.9, 0.95), max_grad_norm=1.0)
    data = [(tensor(x, dev), tensor(y, dev)) for x, y in _batches(cfg, spec["batch"], n=4, seed=1 + rank)]
    runs = []
    for accum in spec["accumulate"]:

        def step(i, sync=True, accum=accum):
            opt.zero_grad()
            for m in range(accum):
                x, y = data[(i * accum + m) % len(data)]
                quiet = model.no_sync() if not sync or m < accum - 1 else contextlib.nullcontext()
                with quiet:
                    (GPT.loss(model(x), y) * (1.0 / accum)).backward()
            opt.step()

        step(0), step(1)  # kernels and autotuning; the bucket plan, then a step that overlaps
        compute = time_steps(lambda i: step(i, sync=False), spec["steps"], dev.synchronize)
        dist.barrier()
        model.comm_stats(reset=True)
        ms = time_steps(step, spec["steps"], dev.synchronize)
        stats = model.comm_stats(reset=True)
        n = spec["steps"]
        runs.append(
            {
                "step_ms": ms,
                "compute_ms": compute,
                **{f"{k[:-2]}_ms": stats[k] / n * 1e3 for k in ("download_s", "upload_s", "all_reduce_s", "blocked_s")},
                "buckets_per_step": stats["buckets"] / n,
                "early_buckets_per_step": stats["early_buckets"] / n,
            }
        )
    return runs


def _torch_worker(spec, rank, world, local_rank):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from ..models.gpt import CONFIGS
    from .gpt import _batches, _groups, _torch_model

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.cuda.set_device(local_rank)
    cfg = CONFIGS[spec["config"]]
    model = DistributedDataParallel(
        _torch_model(torch, cfg, "sdpa"), device_ids=[local_rank], bucket_cap_mb=spec["bucket_cap_mb"]
    )
    opt = torch.optim.AdamW(_groups(model.named_parameters()), lr=3e-4, betas=(0.9, 0.95), fused=True)
    data = [
        (torch.from_numpy(x).long().cuda(), torch.from_numpy(y).long().cuda())
        for x, y in _batches(cfg, spec["batch"], n=4, seed=1 + rank)
    ]
    runs = []
    for accum in spec["accumulate"]:

        def step(i, sync=True, accum=accum):
            opt.zero_grad(set_to_none=True)
            for m in range(accum):
                x, y = data[(i * accum + m) % len(data)]
                quiet = model.no_sync() if not sync or m < accum - 1 else contextlib.nullcontext()
                with quiet:
                    logits = model(x)
                    loss = torch.nn.functional.cross_entropy(logits.view(-1, cfg.vocab_size), y.view(-1)) / accum
                    loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()

        step(0), step(1)
        compute = time_steps(lambda i: step(i, sync=False), spec["steps"], torch.cuda.synchronize)
        dist.barrier()
        runs.append({"step_ms": time_steps(step, spec["steps"], torch.cuda.synchronize), "compute_ms": compute})
    return runs


def _worker(spec):
    import datetime

    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    torch_side = spec["impl"] == "torch_nccl"
    dist.init_process_group(
        "nccl" if torch_side else "gloo",
        timeout=datetime.timedelta(minutes=5),
        **({"device_id": __import__("torch").device("cuda", local_rank)} if torch_side else {}),
    )
    try:
        runs = (_torch_worker if torch_side else _pywgtrain_worker)(spec, rank, world, local_rank)
        (Path(spec["out"]) / f"rank{rank}.json").write_text(json.dumps({"runs": runs}))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    _worker(json.loads(sys.argv[1]))
