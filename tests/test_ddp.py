"""DistributedDataParallel over torch.distributed (gloo) with 2 and 3 processes on
localhost, each with its own Device: after 10 AdamW steps on equal shards of a global
batch, every rank's parameters equal those of one process training on the global batch.

Each process group runs every scenario once (starting processes and devices is the
slow part on a 2-core machine); the tests compare the files the ranks wrote with the
single-process reference computed here. This file doubles as the worker script:
``python tests/test_ddp.py worker <out_dir> <scenario,...>`` with RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set."""

import contextlib
import datetime
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import pywgtrain as pw

# The workers import the pywgtrain this process imported (installed, or a source tree with its build).
PACKAGE_PARENT = Path(pw.__file__).resolve().parent.parent
STEPS = 10
BATCH = 12  # the global batch: equal shards for 2 and 3 ranks, and 2 micro-batches each
SIZES = [8, 16, 4]
LR = 1e-2
CLIP = 0.05  # below the gradient norms here, so every step clips
DROP_SEED = 100
# "gloo": every byte through the process group, not the ranks' shared memory (one host here)
SCENARIOS = ["plain", "small_buckets", "unfused", "clip", "accumulate", "dropout", "trainer", "no_overlap", "gloo"]
# Buckets started while backward still ran: every bucket from the second step on (the first step
# finds the buckets), none where nothing overlaps (a captured step's hooks run after it).
OVERLAPPED = {"plain", "small_buckets", "unfused", "clip", "accumulate", "dropout", "gloo"}


def _batch(step):
    rng = np.random.default_rng(1234 + step)
    return rng.standard_normal((BATCH, SIZES[0])).astype(np.float32), rng.integers(0, SIZES[-1], BATCH)


def _shard(a, rank, world):
    n = len(a) // world
    return a[rank * n : (rank + 1) * n]


def _model(dev, scenario, seed):
    rng = np.random.default_rng(seed)
    if scenario == "dropout":
        return pw.nn.Sequential(
            pw.nn.Linear(SIZES[0], SIZES[1], activation="relu", device=dev, rng=rng),
            pw.nn.Dropout(0.3),
            pw.nn.Linear(SIZES[1], SIZES[2], device=dev, rng=rng),
        )
    return pw.nn.MLP(SIZES, device=dev, seed=seed)


def _optimizer(scenario, params):
    return pw.optim.AdamW(
        params, lr=LR, max_grad_norm=CLIP if scenario == "clip" else None, fused=scenario != "unfused"
    )


def _params(model):
    return {k: v for k, v in model.state_dict().items()}


# -- the ranks' side ---------------------------------------------------------------------------
def _run_rank(dev, scenario, rank, world):
    from pywgtrain.nn.parallel import DistributedDataParallel

    if scenario == "fp16":
        return _fp16_rank(dev, rank, world)
    loss_fn = pw.nn.CrossEntropyLoss()
    if scenario == "dropout":
        pw.manual_seed(DROP_SEED + rank)  # every rank its own masks
    # Each rank initializes differently: the wrap broadcasts rank 0's parameters.
    model = DistributedDataParallel(
        _model(dev, scenario, seed=rank),
        bucket_cap_mb=1e-4 if scenario == "small_buckets" else 25.0,
        overlap=scenario != "no_overlap",
        host_reduction="gloo" if scenario == "gloo" else "shm",
    )
    opt = _optimizer(scenario, model.parameters())
    out = {"norms": []}
    if scenario == "trainer":
        from pywgtrain.train import Trainer

        trainer = Trainer(model, opt, loss_fn)
        for step in range(STEPS):
            x, y = _batch(step)
            trainer.step(_shard(x, rank, world), _shard(y, rank, world))
        assert trainer._graph is not None  # steps 3+ replayed a captured step
    else:
        for step in range(STEPS):
            x, y = (_shard(a, rank, world) for a in _batch(step))
            opt.zero_grad()
            if scenario == "accumulate":
                half = len(x) // 2
                with model.no_sync():  # the first micro-batch accumulates locally
                    (loss_fn(model(x[:half]), y[:half]) * 0.5).backward()
                    local = model.module[0].weight.grad.numpy()
                (loss_fn(model(x[half:]), y[half:]) * 0.5).backward()  # reduces both micro-batches
                if step == 0:
                    out["local_grad"] = local
            else:
                loss_fn(model(x), y).backward()
            opt.step()
            if scenario == "clip":
                out["norms"].append(opt.last_grad_norm())
            if step == 0:
                out["first_buckets"] = model.comm_stats()["buckets"]
    if scenario == "dropout":
        out["mask"] = pw.nn.functional.dropout(pw.ones((256,), device=dev), 0.5, training=True).numpy() != 0
    stats = model.comm_stats()
    out["buckets"], out["early_buckets"] = stats["buckets"], stats["early_buckets"]
    out.update({f"param.{k}": v for k, v in model.module.state_dict().items()})
    out["state_keys"] = np.array(sorted(model.state_dict()))
    return out


def _fp16_rank(dev, rank, world):
    """One backward with fp16 gradient compression after a local one (no_sync) on the same batch:
    the test compares the averaged gradients with the mean of the ranks' local ones."""
    from pywgtrain.nn.parallel import DistributedDataParallel

    loss_fn = pw.nn.CrossEntropyLoss()
    model = DistributedDataParallel(
        pw.nn.MLP([8, 64, 4], device=dev, seed=0),
        bucket_cap_mb=1e-3,
        gradient_compression="fp16",
        host_reduction="gloo",  # compression applies to what goes through gloo
    )
    opt = pw.optim.AdamW(model.parameters(), lr=LR)  # fused: the buckets are spans of its arena
    x, y = (_shard(a, rank, world) for a in _batch(0))
    out = {"norms": []}
    for sync in (False, True):
        opt.zero_grad()
        with model.no_sync() if not sync else contextlib.nullcontext():
            loss_fn(model(x), y).backward()
        for k, p in model.module.named_parameters():
            out[f"{'avg' if sync else 'local'}.{k}"] = p.grad.numpy()
    out["buckets"] = model.comm_stats()["buckets"]
    return out


def _worker(out_dir, scenarios):
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=20))
    dev = pw.Device()
    if scenarios in (["die"], ["hang"]):
        _die_scenario(dev, rank, world, out_dir, hang=scenarios == ["hang"])
        return
    for scenario in scenarios:
        out = _run_rank(dev, scenario, rank, world)
        out["norms"] = np.array(out["norms"], np.float64)
        np.savez(Path(out_dir) / f"{scenario}.rank{rank}.npz", **out)
    dist.destroy_process_group()


def _die_scenario(dev, rank, world, out_dir, hang=False):
    """Rank 1 exits after two steps (``hang``: stops responding for 35 s, then exits); rank 0
    must fail with a clear error, not hang."""
    from pywgtrain.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(pw.nn.MLP(SIZES, device=dev, seed=0))
    opt = pw.optim.AdamW(model.parameters(), lr=LR)
    loss_fn = pw.nn.CrossEntropyLoss()
    start = time.monotonic()
    try:
        for step in range(STEPS):
            if rank == 1 and step == 2:
                if hang:
                    time.sleep(35)
                os._exit(3)
            x, y = (_shard(a, rank, world) for a in _batch(step))
            opt.zero_grad()
            start = time.monotonic()
            loss_fn(model(x), y).backward()
            opt.step()
    except RuntimeError as e:
        (Path(out_dir) / "error.txt").write_text(f"{time.monotonic() - start:.2f}\n{e}")
        os._exit(0)
    (Path(out_dir) / "error.txt").write_text("no error")


# -- the test's side -------------------------------------------------------------------------
def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(world, out_dir, scenarios, timeout=120):
    env = dict(os.environ)
    env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        WORLD_SIZE=str(world),
        PYTHONPATH=os.pathsep.join([str(PACKAGE_PARENT), env.get("PYTHONPATH", "")]),
        OMP_NUM_THREADS="1",
    )
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "worker", str(out_dir), ",".join(scenarios)],
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for r in range(world)
    ]
    logs, codes = [], []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"the ranks did not finish within {timeout} s") from None
        logs.append(out.decode(errors="replace"))
        codes.append(p.returncode)
    return codes, logs


def _reference(dev, scenario, world):
    """One process on the global batch (dropout: each rank's shard with that rank's RNG stream)."""
    loss_fn = pw.nn.CrossEntropyLoss()
    model = _model(dev, scenario, seed=0)
    opt = _optimizer(scenario, model.parameters())
    norms = []
    if scenario == "dropout":
        states = []
        for r in range(world):
            pw.manual_seed(DROP_SEED + r, dev)
            states.append(pw.get_rng_state(dev))
    for step in range(STEPS):
        x, y = _batch(step)
        opt.zero_grad()
        if scenario == "dropout":
            for r in range(world):
                pw.set_rng_state(states[r], dev)
                (loss_fn(model(_shard(x, r, world)), _shard(y, r, world)) * (1.0 / world)).backward()
                states[r] = pw.get_rng_state(dev)
        else:
            loss_fn(model(x), y).backward()
        opt.step()
        if scenario == "clip":
            norms.append(opt.last_grad_norm())
    return _params(model), np.array(norms)


@pytest.fixture(scope="module", params=[2, 3], ids=["2ranks", "3ranks"])
def group_run(request, tmp_path_factory):
    pytest.importorskip("torch.distributed")
    world = request.param
    out_dir = tmp_path_factory.mktemp(f"ddp{world}")
    start = time.monotonic()
    codes, logs = _launch(world, out_dir, SCENARIOS + ["fp16"])
    assert codes == [0] * world, "\n".join(logs)
    print(f"{world} ranks, {len(SCENARIOS)} scenarios: {time.monotonic() - start:.1f} s")
    return world, out_dir


def _load(out_dir, scenario, world):
    return [dict(np.load(Path(out_dir) / f"{scenario}.rank{r}.npz")) for r in range(world)]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_ranks_match_one_process_on_the_global_batch(group_run, scenario, dev):
    world, out_dir = group_run
    ranks = _load(out_dir, scenario, world)
    ref_scenario = "plain" if scenario == "trainer" else scenario
    ref, ref_norms = _reference(dev, ref_scenario, world)
    for r, got in enumerate(ranks):
        for k, v in ref.items():
            np.testing.assert_allclose(got[f"param.{k}"], v, rtol=1e-5, atol=1e-7, err_msg=f"rank {r} {k}")
            # the replicas stay identical, bit for bit
            np.testing.assert_array_equal(got[f"param.{k}"], ranks[0][f"param.{k}"], err_msg=f"rank {r} {k}")
        assert list(got["state_keys"]) == sorted(f"module.{k}" for k in ref)  # torch's DDP state_dict keys
    if scenario == "clip":
        # AdamW clipped with the global norm (the norm of the averaged gradient), not a rank's own
        assert (ref_norms > CLIP).all()
        for got in ranks:
            np.testing.assert_allclose(got["norms"], ref_norms, rtol=1e-5)
    for got in ranks:  # the buckets reduced while backward ran, and the result is the same
        if scenario in OVERLAPPED:
            assert got["early_buckets"] == got["buckets"] - got["first_buckets"] > 0, scenario
        else:
            assert got["early_buckets"] == 0, scenario
    if scenario == "small_buckets":
        assert ranks[0]["buckets"] >= 3 * STEPS  # several buckets in flight per step


def test_fp16_gradient_compression_error(group_run):
    """fp16 compression: each rank's gradient / world size rounded to fp16, summed in fp16, widened:
    within fp16's precision of the float64 mean (measured here), identical on every rank."""
    world, out_dir = group_run
    ranks = _load(out_dir, "fp16", world)
    assert ranks[0]["buckets"] >= 2
    worst = 0.0
    for key in [k for k in ranks[0] if k.startswith("avg.")]:
        name = key[4:]
        ref = np.mean([r[f"local.{name}"].astype(np.float64) for r in ranks], axis=0)
        got = ranks[0][key]
        err = np.abs(got - ref).max() / np.abs(ref).max()
        worst = max(worst, err)
        assert err < 2e-3, (name, err)  # fp16 keeps 11 bits: 2^-11 per rounding, world + 1 roundings
        for r in ranks[1:]:
            np.testing.assert_array_equal(r[key], got)
    assert worst > 0  # compressed: not the float32 mean
    print(f"fp16 compression, {world} ranks: largest error {worst:.2e} of the largest gradient")


def test_no_sync_accumulates_locally(group_run):
    world, out_dir = group_run
    ranks = _load(out_dir, "accumulate", world)
    # inside no_sync the ranks' gradients are their own (different shards), not averaged
    assert not np.allclose(ranks[0]["local_grad"], ranks[1]["local_grad"])


def test_dropout_masks_differ_across_ranks(group_run):
    world, out_dir = group_run
    masks = [r["mask"] for r in _load(out_dir, "dropout", world)]
    for r in range(1, world):
        assert (masks[r] != masks[0]).any()


def test_a_rank_that_dies_makes_the_others_fail(tmp_path):
    pytest.importorskip("torch.distributed")
    start = time.monotonic()
    codes, logs = _launch(2, tmp_path, ["die"], timeout=60)
    elapsed = time.monotonic() - start
    assert codes[1] == 3, logs[1]
    assert codes[0] == 0, logs[0]
    text = (tmp_path / "error.txt").read_text()
    assert text != "no error"
    waited, message = text.split("\n", 1)
    assert "DistributedDataParallel (rank 0 of 2)" in message and "gradient bucket" in message, message
    assert float(waited) < 25 and elapsed < 60  # within the process group's 20 s timeout, not a hang


@pytest.mark.slow
def test_a_rank_that_stops_responding_makes_the_others_time_out(tmp_path):
    pytest.importorskip("torch.distributed")
    codes, logs = _launch(2, tmp_path, ["hang"], timeout=90)
    assert codes == [0, 3], logs
    waited, message = (tmp_path / "error.txt").read_text().split("\n", 1)
    assert "DistributedDataParallel (rank 0 of 2)" in message and "gradient bucket" in message, message
    assert 15 < float(waited) < 30, (waited, message)  # the process group's 20 s timeout


def test_without_a_process_group(dev):
    pytest.importorskip("torch.distributed")
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is initialized in this process")
    with pytest.raises(RuntimeError, match="init_process_group"):
        pw.nn.parallel.DistributedDataParallel(pw.nn.MLP(SIZES, device=dev))


def test_post_backward_hooks_run_after_backward_capture_and_replay(dev):
    """What DDP builds on: a hook sees each backward pass's leaves when backward returns;
    inside a graph capture it runs after the block, and again after every replay."""
    model = pw.nn.MLP(SIZES, device=dev)
    x, y = _batch(0)
    seen = []

    def hook(leaves):
        seen.append(({id(t) for t in leaves} == {id(p) for p in model.parameters()}, dev._in_batch()))

    handle = pw.autograd.register_post_backward_hook(dev, hook)
    try:
        pw.nn.CrossEntropyLoss()(model(x), y).backward()
        assert seen == [(True, False)]
        g = pw.Graph()
        static_x = pw.tensor(x, dev)
        with pw.graph(g, dev):
            pw.nn.CrossEntropyLoss()(model(static_x), y).backward()
            assert len(seen) == 1  # held back: a host read here would break the capture
        assert len(seen) == 2
        g.replay({static_x: x})
        g.replay({static_x: x})
        assert seen[2:] == [(True, False)] * 2
    finally:
        handle.remove()
    pw.nn.CrossEntropyLoss()(model(x), y).backward()
    assert len(seen) == 4


def test_gradient_ready_hooks_report_each_leaf_once_its_gradient_is_complete(dev):
    """What DDP's overlap builds on: during backward each leaf is reported once, when its gradient
    is final (read here mid-pass, it equals the gradient after backward), a leaf used twice after
    its last use and before the layers further from the loss; nothing inside a graph capture."""
    rng = np.random.default_rng(0)
    model = pw.nn.MLP([8, 16, 16, 4], device=dev, seed=0)
    shared = pw.tensor(rng.standard_normal((4,)).astype(np.float32), dev, requires_grad=True)
    x, y = _batch(0)
    seen = []

    def hook(leaves):
        dev.flush()  # the pass's batch so far, as DDP does before reading
        seen.append([(id(t), t.grad.numpy().copy()) for t in leaves])

    def loss():
        h = model(x) * shared
        return pw.nn.CrossEntropyLoss()(h + shared, y)

    handle = pw.autograd.register_gradient_ready_hook(dev, hook)
    try:
        loss().backward()
        leaves = [shared, *model.parameters()]
        reported = [i for call in seen for i, _ in call]
        assert sorted(reported) == sorted(id(t) for t in leaves)  # each exactly once
        final = {id(t): t.grad.numpy() for t in leaves}
        for call in seen:
            for i, g in call:
                np.testing.assert_array_equal(g, final[i])
        # `shared` is final after the product (the nodes nearer the loss), before the MLP's backward
        assert reported[0] == id(shared) and len(seen[0]) == 1 and len(seen) >= 2
        count = len(seen)
        g = pw.Graph()
        static_x = pw.tensor(x, dev)
        with pw.graph(g, dev):
            pw.nn.CrossEntropyLoss()(model(static_x), y).backward()
        g.replay({static_x: x})
        assert len(seen) == count  # a capture and its replays report nothing
    finally:
        handle.remove()
    loss().backward()
    assert len(seen) == count


# -- the main job under torchrun, and the benchmark --------------------------------------------
def _module_env():
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(PACKAGE_PARENT), os.environ.get("PYTHONPATH", "")]),
        OMP_NUM_THREADS="1",
    )


@pytest.mark.slow
def test_main_job_under_torchrun_trains_data_parallel_and_rank_0_alone_writes(tmp_path):
    """torchrun --nproc_per_node 2 -m pywgtrain gpt: one progress log, one checkpoint and plot
    (rank 0's), and the checkpoint resumes in a single process."""
    pytest.importorskip("torch.distributed")
    job = ["gpt", "--steps", "4", "--batch-size", "2", "--max-bytes", "100000", "--eval-iters", "1"]
    job += ["--sample-tokens", "8", "--plot", "curve.png", "--checkpoint", "run.safetensors"]
    port = str(_free_port())
    run = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", port]
    r = subprocess.run(
        [*run, "-m", "pywgtrain", *job], cwd=tmp_path, env=_module_env(), capture_output=True, text=True, timeout=240
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "data-parallel: 2 processes (torchrun)" in r.stdout
    assert r.stdout.count("step 4/4: loss") == 1 and r.stdout.count("validation loss") == 1, r.stdout
    assert r.stdout.count("checkpoint: run.safetensors (step 4)") == 1
    assert (tmp_path / "curve.png").stat().st_size > 0
    # 2 ranks x 2 sequences x 64 tokens per step: the rate counts both ranks' tokens
    assert "training: 4 steps of 2 x 64 tokens" in r.stdout
    # the weights are saved without DDP's "module." prefix: one process resumes them
    env = {k: v for k, v in _module_env().items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    r1 = subprocess.run(
        [sys.executable, "-m", "pywgtrain", *job, "--steps", "5", "--resume", "run.safetensors", "--plot", ""],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r1.returncode == 0, r1.stdout + r1.stderr
    assert "resumed at step 4" in r1.stdout and "data-parallel" not in r1.stdout


@pytest.mark.slow
def test_main_job_across_two_torchrun_nodes(tmp_path):
    """The README's multi-host command on one machine: two torchrun launches (--nnodes 2,
    --node_rank 0 and 1, c10d rendezvous at a shared endpoint), one process each; node 0's
    rank 0 alone reports and saves."""
    pytest.importorskip("torch.distributed")
    endpoint = f"127.0.0.1:{_free_port()}"
    job = ["gpt", "--steps", "3", "--batch-size", "2", "--max-bytes", "100000", "--eval-iters", "1"]
    job += ["--sample-tokens", "0", "--plot", "", "--checkpoint", "run.safetensors"]
    nodes = []
    for node in (0, 1):
        cwd = tmp_path / f"node{node}"
        cwd.mkdir()
        run = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node)]
        run += ["--nproc_per_node", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint]
        env = dict(_module_env(), GLOO_SOCKET_IFNAME="lo")
        nodes.append(
            subprocess.Popen(
                [*run, "-m", "pywgtrain", *job], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
        )
    outs = []
    try:
        for p in nodes:
            outs.append(p.communicate(timeout=240)[0].decode(errors="replace"))
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in nodes] == [0, 0], "\n".join(outs)
    lead = [k for k, out in enumerate(outs) if "data-parallel: 2 processes (torchrun)" in out]
    assert len(lead) == 1, outs  # one rank 0, on whichever node the rendezvous made it
    assert "step 3/3: loss" in outs[lead[0]] and "step 3/3" not in outs[1 - lead[0]]
    assert (tmp_path / f"node{lead[0]}" / "run.safetensors").exists()
    assert not (tmp_path / f"node{1 - lead[0]}" / "run.safetensors").exists()


@pytest.mark.slow
def test_bench_ddp_runs_one_and_two_processes(tmp_path):
    """`pywgtrain bench ddp --quick --gpus 1,2`: two processes share the CPU adapter; a row per
    process count and accumulation, with the time split."""
    pytest.importorskip("torch.distributed")
    out = tmp_path / "ddp.json"
    r = subprocess.run(
        [sys.executable, "-m", "pywgtrain", "bench", "ddp", "--quick", "--gpus", "1,2", "--accumulate", "2"]
        + ["--no-baseline", "--json", str(out)],
        cwd=tmp_path,  # not the checkout: `-m` would import its sources, which have no extension
        env=_module_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(out.read_text())["ddp"]["rows"]
    assert [(row["gpus"], row["accumulate"]) for row in rows] == [(1, 2), (1, 1), (2, 2), (2, 1)]
    for row in rows:
        assert row["impl"] == "pywgtrain" and row["tokens_per_s"] > 0 and row["compute_ms"] > 0
        for key in ("download_ms", "upload_ms", "all_reduce_ms", "exposed_ms", "overlap_ms"):
            assert row[key] >= 0, key
        # reduced while backward ran; a world of one has nothing to reduce
        assert row["early_buckets_per_step"] == row["buckets_per_step"] == (row["gpus"] > 1)
    assert len(re.findall(r"^ pywgtrain +[12] +[12] ", r.stdout, re.M)) == 4, r.stdout


def test_bench_ddp_gpu_counts_are_checked():
    from pywgtrain.benchmarks.ddp import parse_gpus

    assert parse_gpus("1,2,4") == [1, 2, 4]
    for bad in ("0,1", "1,1", "two", ""):
        with pytest.raises(ValueError, match="--gpus"):
            parse_gpus(bad)


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    _worker(sys.argv[2], sys.argv[3].split(","))


def test_host_reduction_slices_cover_the_bucket_once():
    from pywgtrain.nn._host_reduce import _cuts

    for n in (1, 7, 15, 16, 17, 33, 129, 1000, 4096):
        for parts in (1, 2, 3, 4, 8):
            cuts = _cuts(n, parts)
            assert len(cuts) == parts + 1 and cuts[0] == 0 and cuts[-1] == n
            assert all(a <= b for a, b in zip(cuts, cuts[1:]))
            assert all(c % 16 == 0 for c in cuts[1:-1] if c < n)  # 64-byte aligned slice starts


def test_host_reduction_is_checked(dev):
    pytest.importorskip("torch.distributed")
    from pywgtrain.nn.parallel import DistributedDataParallel

    model = pw.nn.MLP([4, 4], device=dev, seed=0)
    with pytest.raises(ValueError, match="host_reduction must be 'shm' or 'gloo', got 'nccl'"):
        DistributedDataParallel(model, host_reduction="nccl")  # checked before the process group
