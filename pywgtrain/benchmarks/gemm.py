"""``pywgtrain bench {gemm,adamw,train}``: GEMMs (the standard set, given
shapes or the linear-layer sweep) beside cuBLAS, the AdamW kernel beside
PyTorch's fused AdamW, and MLP training steps through Trainer beside PyTorch
eager and CUDA graphs."""

import statistics
import time

import numpy as np

from .. import _core, nn, optim
from ..ops import gemm as pw_gemm
from ..tensor import tensor, zeros
from ..train import Trainer
from .common import _time_cuda, fmt_bandwidth, fmt_flops, is_cpu_adapter

SQUARE = [1024, 2048, 4095, 4096, 4097, 8192]
TRAINING = [(64, 1024, 1024), (256, 768, 3072), (512, 1024, 4096), (4096, 4096, 1024), (4096, 1024, 4096)]
GEMV = [(1, 4096, 4096)]
ROTATE_BYTES = 256 << 20  # > 5x the H100's 50 MB L2
# CPU adapters: the same kinds of shapes (powers of two, ragged, transposed,
# training-sized, GEMV) at sizes that take milliseconds there.
CPU_SQUARE = [64, 128, 255, 256, 257, 512]
CPU_TRAINING = [(64, 256, 256), (128, 256, 512)]
CPU_GEMV = [(1, 1024, 1024)]
CPU_ROTATE_BYTES = 16 << 20
# Alternating timing rounds per GEMM shape on GPUs (bench_gemm).
GPU_ROUNDS = 2
MAX_DIM = 2**31 - 1


def _sets(nbytes, rotate_bytes=ROTATE_BYTES):
    return int(min(8, max(1, rotate_bytes // max(nbytes, 1))))


def pywgtrain_gemm_timer(dev, m, k, n, ta, tb, rotate_bytes=ROTATE_BYTES, dtype=np.float32):
    """Operand sets for m x k x n of ``dtype`` (float32 or float16; rotated
    through ``rotate_bytes``), and a function ``time(reps, warmup=3)`` giving
    the median GPU time of one call in microseconds (each call in its own
    timed pass), callable repeatedly on the same sets."""
    rng = np.random.default_rng(0)
    a_shape = (k, m) if ta else (m, k)
    b_shape = (n, k) if tb else (k, n)
    dtype = np.dtype(dtype)
    half = dtype == np.float16
    nsets = _sets(dtype.itemsize * (m * k + k * n + m * n), rotate_bytes)
    sets = [
        (
            tensor(rng.standard_normal(a_shape, np.float32).astype(dtype), dev),
            tensor(rng.standard_normal(b_shape, np.float32).astype(dtype), dev),
            zeros((m, n), dtype, device=dev),
        )
        for _ in range(nsets)
    ]

    dev.flush()  # the operands' uploads and clears run before the recordings below

    def time_calls(reps, warmup=3):
        timer = _core._PassTimer(dev._dev, reps)
        rec = _core._Recorder(dev._dev)
        for i in range(warmup):
            a, b, c = sets[i % nsets]
            _core.gemm(rec, a._buf, b._buf, c._buf, m, n, k, ta, tb, 1.0, 0.0, half)
        rec.submit()
        for i in range(reps):
            a, b, c = sets[i % nsets]
            timer.time_next_pass(rec, i)
            _core.gemm(rec, a._buf, b._buf, c._buf, m, n, k, ta, tb, 1.0, 0.0, half)
        ns = timer.read(rec, reps)
        return statistics.median(ns) / 1e3

    return time_calls


def time_pywgtrain_gemm(dev, m, k, n, ta, tb, reps, warmup=3, rotate_bytes=ROTATE_BYTES):
    """Median GPU time of one m x k x n product in microseconds (fresh operand sets)."""
    return pywgtrain_gemm_timer(dev, m, k, n, ta, tb, rotate_bytes)(reps, warmup)


def torch_gemm_timer(torch, m, k, n, ta, tb, half=False):
    """As pywgtrain_gemm_timer, for torch.mm (cuBLAS; fp16 when ``half``): ``time(reps)``."""
    dtype = torch.float16 if half else torch.float32
    nsets = _sets((2 if half else 4) * (m * k + k * n + m * n))
    g = torch.Generator(device="cuda").manual_seed(0)
    sets = []
    for _ in range(nsets):
        a = torch.randn((k, m) if ta else (m, k), device="cuda", generator=g, dtype=dtype)
        b = torch.randn((n, k) if tb else (k, n), device="cuda", generator=g, dtype=dtype)
        sets.append((a.t() if ta else a, b.t() if tb else b, torch.empty(m, n, device="cuda", dtype=dtype)))

    def run(i):
        a, b, c = sets[i % nsets]
        torch.mm(a, b, out=c)

    return lambda reps: _time_cuda(torch, run, reps)


def time_torch_gemm(torch, m, k, n, ta, tb, reps):
    return torch_gemm_timer(torch, m, k, n, ta, tb)(reps)


def parse_shapes(text):
    """'4096x4096x4096:NT,64x1024x1024' -> [(m, k, n, trans_a, trans_b)] (M x K x N, default NN).
    Raises ValueError naming the bad item: every dimension must be an integer >= 1."""
    out = []
    for item in text.split(","):
        item = item.strip()
        dims, _, mode = item.partition(":")
        try:
            m, k, n = (int(v) for v in dims.lower().split("x"))
        except ValueError:
            raise ValueError(
                f"bad GEMM shape {item!r}: expected MxKxN[:NN|NT|TN|TT] with integer sizes, "
                "e.g. 64x1024x1024 or 4096x4096x4096:NT"
            ) from None
        if min(m, k, n) < 1:
            raise ValueError(f"bad GEMM shape {item!r}: every dimension must be >= 1")
        if max(m, k, n) > MAX_DIM:
            raise ValueError(f"bad GEMM shape {item!r}: a dimension is above {MAX_DIM} (32-bit kernel indices)")
        mode = (mode or "NN").upper()
        if mode not in ("NN", "NT", "TN", "TT"):
            raise ValueError(f"bad GEMM shape {item!r}: the mode after ':' must be NN, NT, TN or TT, got {mode!r}")
        out.append((m, k, n, mode[0] == "T", mode[1] == "T"))
    return out


def default_shapes(quick, cpu):
    """The standard set: square (powers of two and ragged), the other three
    transpose modes, training-sized products, GEMV; scaled down on CPU adapters."""
    square, training, gemv, big = (CPU_SQUARE, CPU_TRAINING, CPU_GEMV, 256) if cpu else (SQUARE, TRAINING, GEMV, 4096)
    top = max(square)
    shapes = [(s, s, s, False, False) for s in square if not (quick and s == top)]
    shapes += [(big, big, big, ta, tb) for ta, tb in ((False, True), (True, False), (True, True))]
    shapes += [(m, k, n, False, False) for m, k, n in training + gemv]
    return shapes


def warm_up(dev, torch, seconds=1.0):
    """Run large GEMMs until the GPU has left its idle clocks: the first shape
    of a process otherwise measured up to 5x slow on the H100. Not for CPU
    adapters (no idle clocks; one 2048^3 GEMM takes seconds there). Either
    side may be None."""
    if dev is not None:
        a = zeros((2048, 2048), device=dev)
        c = zeros((2048, 2048), device=dev)
        dev.flush()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        if dev is not None:
            rec = _core._Recorder(dev._dev)
            for _ in range(20):
                _core.gemm(rec, a._buf, a._buf, c._buf, 2048, 2048, 2048, False, False, 1.0, 0.0)
            dev._dev.wait(rec.submit())
        if torch is not None:
            x = torch.zeros(2048, 2048, device="cuda")
            for _ in range(20):
                x @ x
            torch.cuda.synchronize()


# Linear layers of common models (in_features, out_features) and batch rows M:
# the GEMM issue's grid. A layer y = x W^T runs three GEMMs: forward x[M, in] @
# W[out, in]^T (NT), dX = dY[M, out] @ W (NN), dW = dY^T @ x (TN).
SWEEP_LAYERS = [
    (768, 768),
    (768, 2304),
    (768, 3072),
    (3072, 768),
    (1024, 4096),
    (4096, 1024),
    (4096, 4096),
    (768, 50304),
]
SWEEP_ROWS = [1, 64, 256, 777, 1024, 4096, 8192]
CPU_SWEEP_LAYERS = [(64, 96), (96, 64)]
CPU_SWEEP_ROWS = [1, 7, 64]


def sweep_shapes(cpu):
    """(m, k, n, trans_a, trans_b, layer, mode) for every row count, layer and mode."""
    out = []
    for fin, fout in CPU_SWEEP_LAYERS if cpu else SWEEP_LAYERS:
        for rows in CPU_SWEEP_ROWS if cpu else SWEEP_ROWS:
            out.append((rows, fin, fout, False, True, (fin, fout), "forward NT"))  # x @ W^T
            out.append((rows, fout, fin, False, False, (fin, fout), "dX NN"))  # dY @ W
            if rows > 1:
                out.append((fout, rows, fin, True, False, (fin, fout), "dW TN"))  # dY^T @ x
    return out


def bench_gemm_sweep(dev, quick, torch, dtype="float32"):
    """The sweep: every shape beside cuBLAS (when available), rows with the
    layer and mode they come from; `bench/sweep_heatmap.py` draws the ratios."""
    cpu = is_cpu_adapter(dev)
    shapes = sweep_shapes(cpu)
    rows = bench_gemm(dev, quick, torch, [s[:5] for s in shapes], dtype)
    for row, (_, _, _, _, _, layer, mode) in zip(rows, shapes):
        row.update(layer=list(layer), mode=mode)
    ratios = sorted(r["time_ratio"] for r in rows if "time_ratio" in r)
    if ratios:
        print(
            f"sweep: {len(ratios)} shapes, time ratio to cuBLAS median {statistics.median(ratios):.2f}, "
            f"worst {ratios[-1]:.2f}, above 1.25: {sum(r > 1.25 for r in ratios)}",
            flush=True,
        )
    return rows


def half_gemm_errors(dev, torch, m, k, n, ta, tb):
    """Max |C - C64| / max |C64| of our float16 product and (with CUDA) torch's fp16 one, on the
    same float16 operands; C64 is their float64 product (on the CUDA device when there is one)."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((k, m) if ta else (m, k), np.float32).astype(np.float16)
    b = rng.standard_normal((n, k) if tb else (k, n), np.float32).astype(np.float16)
    ours = np.asarray(pw_gemm(a, b, ta, tb, device=dev), np.float64)
    if torch is None:
        ref = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)
        return float(np.max(np.abs(ours - ref)) / max(np.max(np.abs(ref)), 1e-300)), None
    ta16, tb16 = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    op_a, op_b = (ta16.t() if ta else ta16), (tb16.t() if tb else tb16)
    ref = torch.mm(op_a.double(), op_b.double())
    scale = max(float(ref.abs().max()), 1e-300)
    theirs = torch.mm(op_a, op_b).double()
    err_ours = float((torch.from_numpy(ours).cuda() - ref).abs().max()) / scale
    return err_ours, float((theirs - ref).abs().max()) / scale


def bench_gemm(dev, quick, torch, shapes=None, dtype="float32"):
    """GEMMs of ``dtype`` beside cuBLAS fp32 (TF32 off). float16 rows also time our float32 GEMM
    and torch's fp16 one on the shape and report both float16 products' error against float64."""
    half = np.dtype(dtype) == np.float16
    rows = []
    cpu = is_cpu_adapter(dev)
    if not cpu:
        warm_up(dev, torch, 0.5 if quick else 1.0)
    if shapes is None:
        shapes = default_shapes(quick, cpu)
    for idx, (m, k, n, ta, tb) in enumerate(shapes, 1):
        mode = ("T" if ta else "N") + ("T" if tb else "N")
        # The shape's name first: on a slow adapter its timing takes a while.
        print(f"[{idx}/{len(shapes)}] {m}x{k}x{n} {mode}: ", end="", flush=True)
        flops = 2.0 * m * n * k
        if cpu:
            ours = pywgtrain_gemm_timer(dev, m, k, n, ta, tb, CPU_ROTATE_BYTES, dtype)
            # One untimed run (kernel compilation included) tells how many
            # repetitions fit in ~0.5 s (quick: 3).
            probe = ours(1, warmup=1)
            reps = 3 if quick else max(3, min(50, int(0.5e6 / max(probe, 1.0))))
            warmup, rounds_per_side = 0, 1
        else:
            # Each shape starts from the same busy GPU: the idle gap while its
            # data is prepared otherwise lowers the clocks and short memory-bound
            # shapes read up to 2x slow depending on what ran before
            # (docs/gemm_notes.md #36).
            warm_up(dev, torch, 0.1 if quick else 0.25)
            ours = pywgtrain_gemm_timer(dev, m, k, n, ta, tb, dtype=dtype)
            reps = 5 if quick else max(10, min(200, int(2e12 / flops * 4)))
            # Both sides in alternating rounds on the same operand sets, each
            # keeping its best round: a single reading per side let one slow
            # stretch of the GPU set a shape's ratio (H100:
            # 1024x768x768 NT 56.8 us in a sweep, 48.3 alone, same plan).
            warmup, rounds_per_side = 3, 1 if quick else GPU_ROUNDS
        theirs = torch_gemm_timer(torch, m, k, n, ta, tb) if torch is not None else None
        # float16: our float32 GEMM and torch's fp16 one on the shape too, in the same rounds
        ours32 = pywgtrain_gemm_timer(dev, m, k, n, ta, tb, CPU_ROTATE_BYTES if cpu else ROTATE_BYTES) if half else None
        theirs16 = torch_gemm_timer(torch, m, k, n, ta, tb, half=True) if half and torch is not None else None
        rounds, trounds, rounds32, trounds16 = [], [], [], []
        for _ in range(rounds_per_side):
            rounds.append(ours(reps, warmup))
            if ours32 is not None:
                rounds32.append(ours32(reps, warmup))
            if theirs is not None:
                trounds.append(theirs(reps))
            if theirs16 is not None:
                trounds16.append(theirs16(reps))
        del ours, theirs, ours32, theirs16  # the operand sets
        us = min(rounds)
        row = {
            "m": m,
            "k": k,
            "n": n,
            "trans_a": ta,
            "trans_b": tb,
            "pywgtrain_us": us,
            "pywgtrain_tflops": flops / us / 1e6,
            "reps": reps,
            "pywgtrain_rounds_us": rounds,
        }
        if torch is not None:
            tus = min(trounds)
            row.update(cublas_us=tus, cublas_tflops=flops / tus / 1e6, time_ratio=us / tus, cublas_rounds_us=trounds)
        line = f"pywgtrain {'f16 ' if half else ''}{us:9.1f} us {fmt_flops(flops / us)}"
        if half:
            us32 = min(rounds32)
            err, terr = half_gemm_errors(dev, torch, m, k, n, ta, tb)
            row.update(dtype="float16", pywgtrain_f32_us=us32, pywgtrain_f32_tflops=flops / us32 / 1e6)
            row.update(speedup_vs_f32=us32 / us, max_rel_err=err)
            line += f" | f32 {us32:9.1f} us {fmt_flops(flops / us32)} ({us32 / us:.2f}x)"
        if torch is not None:
            line += f" | cuBLAS {'fp32 ' if half else ''}{row['cublas_us']:9.1f} us {fmt_flops(flops / tus)}"
            line += f" ({tus / us:.2f}x)" if half else f" | time ratio {row['time_ratio']:.2f}x"
        if half and torch is not None:
            t16 = min(trounds16)
            row.update(torch_fp16_us=t16, torch_fp16_tflops=flops / t16 / 1e6, torch_fp16_max_rel_err=terr)
            row.update(speedup_vs_cublas_fp32=tus / us, torch_fp16_rounds_us=trounds16)
            line += f" | torch fp16 {t16:9.1f} us {fmt_flops(flops / t16)}"
        if half:
            line += f" | max err/max|C|: ours {err:.1e}" + (f", torch fp16 {terr:.1e}" if terr is not None else "")
        rows.append(row)
        print(line, flush=True)
    return rows


def bench_adamw(dev, quick, torch):
    if is_cpu_adapter(dev):
        n = 1 << (18 if quick else 22)
    else:
        n = 1 << (22 if quick else 26)
        # Run alone (`bench adamw`), ours came first on an idle GPU and read 2x slow.
        warm_up(dev, torch, 0.5 if quick else 1.0)
    print(f"AdamW {n} params: ", end="", flush=True)
    rng = np.random.default_rng(0)
    p, g = tensor(rng.standard_normal(n, np.float32), dev), tensor(rng.standard_normal(n, np.float32), dev)
    m, v = zeros(n, device=dev), zeros(n, device=dev)
    dev.flush()
    reps = 20
    timer = _core._PassTimer(dev._dev, reps)
    rec = _core._Recorder(dev._dev)
    for i in range(reps):
        timer.time_next_pass(rec, i)
        _core.adamw(rec, p._buf, g._buf, m._buf, v._buf, n, 1e-3, 0.9, 0.999, 1e-8, 1e-2, i + 1, None)
    us = statistics.median(timer.read(rec, reps)) / 1e3
    # The capturable form (AdamW(capturable=True)): step counts and coefficients on the GPU
    # (adamw_prepare, one thread) and the update reading them, in one timed pass.
    steps = zeros((1, _core.ADAM_SLOT_WORDS), dtype=np.int32, device=dev)
    lrs, no_inf = tensor(np.full(1, 1e-3, np.float32), dev), zeros(1, device=dev)
    dev.flush()
    timer = _core._PassTimer(dev._dev, reps)
    rec = _core._Recorder(dev._dev)
    for i in range(reps):
        timer.time_next_pass(rec, i)
        _core.adamw_prepare(rec, steps._buf, 0, 1, no_inf._buf, 0.9, 0.999, 1e-8, 1e-2, lrs._buf, 0)
        _core.adamw_device(rec, p._buf, g._buf, m._buf, v._buf, n, 0.9, 0.999, 1e-8, 1e-2, steps._buf, 0, no_inf._buf)
    cus = statistics.median(timer.read(rec, reps)) / 1e3
    # 7 float32 streams: param, grad, exp_avg, exp_avg_sq read; param and both moments written.
    row = {"params": n, "pywgtrain_us": us, "pywgtrain_GBps": 7 * 4 * n / us / 1e3, "pywgtrain_capturable_us": cus}
    line = f"pywgtrain {us:.1f} us ({fmt_bandwidth(7 * 4 * n / us)}), capturable {cus:.1f} us"
    if torch is not None:
        tp = torch.nn.Parameter(torch.randn(n, device="cuda"))
        tp.grad = torch.randn(n, device="cuda")
        topt = torch.optim.AdamW([tp], lr=1e-3, fused=True)
        tus = _time_cuda(torch, lambda i: topt.step(), reps)
        row.update(torch_fused_us=tus, time_ratio=us / tus)
        line += f" | torch fused AdamW {tus:.1f} us | time ratio {us / tus:.2f}x"
    print(line, flush=True)
    return [row]


TRAIN_CONFIGS = [
    {"name": "MLP 784-1024-1024-10, batch 256 (GELU)", "sizes": [784, 1024, 1024, 10], "batch": 256, "act": "gelu"},
    {
        "name": "MLP 1024-4096-4096-1024, batch 512 (GELU)",
        "sizes": [1024, 4096, 4096, 1024],
        "batch": 512,
        "act": "gelu",
    },
]
CPU_TRAIN_CONFIGS = [  # the digits demo's model, and one with a wider output
    {"name": "MLP 64-256-256-10, batch 64 (GELU)", "sizes": [64, 256, 256, 10], "batch": 64, "act": "gelu"},
    {"name": "MLP 128-256-256-64, batch 64 (GELU)", "sizes": [128, 256, 256, 64], "batch": 64, "act": "gelu"},
]
GROUP = 8  # Trainer(steps_per_submit=...) of the grouped measurement


def _torch_mlp(torch, sizes, act):
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(torch.nn.GELU() if act == "gelu" else torch.nn.ReLU())
    return torch.nn.Sequential(*layers).cuda()


def bench_train(dev, quick, torch):
    rows = []
    cpu = is_cpu_adapter(dev)
    if not cpu:
        warm_up(dev, torch, 0.5 if quick else 1.0)
    steps = (5 if quick else 20) if cpu else (10 if quick else 50)
    for cfg in CPU_TRAIN_CONFIGS if cpu else TRAIN_CONFIGS:
        print(f"{cfg['name']}: ", end="", flush=True)
        sizes, batch = cfg["sizes"], cfg["batch"]
        rng = np.random.default_rng(0)
        xs = [rng.standard_normal((batch, sizes[0]), np.float32) for _ in range(4)]
        ys = [rng.integers(0, sizes[-1], batch).astype(np.int32) for _ in range(4)]
        model = nn.MLP(sizes, activation=cfg["act"], device=dev, seed=0)
        trainer = Trainer(model, optim.AdamW(model.parameters(), lr=1e-3, max_grad_norm=1.0), nn.CrossEntropyLoss())
        dx = [tensor(x, dev) for x in xs]
        dy = [tensor(y, dev) for y in ys]
        for i in range(3):
            trainer.step(dx[i % 4], dy[i % 4]).item()
        row = {"config": cfg["name"]}
        for group in (1, GROUP):
            trainer.steps_per_submit = group
            dev.synchronize()
            t0 = time.perf_counter()
            for i in range(steps):
                loss = trainer.step(dx[i % 4], dy[i % 4])
            host_us = (time.perf_counter() - t0) / steps * 1e6
            loss.item()
            dev.synchronize()
            us = (time.perf_counter() - t0) / steps * 1e6
            key = "pywgtrain" if group == 1 else "pywgtrain_grouped"
            row.update({f"{key}_us": us, f"{key}_host_us": host_us})
        row["steps_per_submit"] = GROUP
        line = (
            f"pywgtrain {row['pywgtrain_us']:.0f} us/step (host {row['pywgtrain_host_us']:.0f}), "
            f"{GROUP} steps per submission {row['pywgtrain_grouped_us']:.0f} us/step "
            f"(host {row['pywgtrain_grouped_host_us']:.0f})"
        )
        trainer.steps_per_submit = 1
        if trainer.graph is not None and "timestamp-query" in dev.features:
            row["profile"] = trainer.graph.profile(reps=3 if quick else 5)
            row["profile"]["host_us"] = profile_host(
                dev,
                trainer,
                dx[2],
                dy[2],
                xs[2],
                ys[2],  # not the captured inputs (dx[1])
                steps=steps,
            )
            prof = row["profile"]
            line += f" | GPU {prof['gpu_us']:.0f} us in {prof['dispatches']} dispatches | host/wall: " + ", ".join(
                f"{k} {v['host_us']:.0f}/{v['wall_us']:.0f}" for k, v in prof["host_us"].items()
            )
        if torch is not None:
            row.update(_torch_train_times(torch, cfg, xs, ys, steps))
            line += f" | torch eager {row['torch_eager_us']:.0f} us | torch CUDA graph {row['torch_graph_us']:.0f} us"
        rows.append(row)
        print(line, flush=True)  # after the name printed above
    return rows


def profile_host(dev, trainer, x, y, x_host, y_host, steps=50):
    """Host and wall time per step of the replay path (no waits until the end
    of each variant): bare replays (no batch, AdamW or loss rebinding, no loss
    read), then Trainer.step one step per submission and grouped."""
    graph = trainer.graph
    dev.flush()

    def bare():
        graph.replay()
        dev.flush()

    variants = {
        "replay+submit": (bare, 1),
        "Trainer.step": (lambda: trainer.step(x, y), 1),
        f"Trainer.step, {GROUP} per submission": (lambda: trainer.step(x, y), GROUP),
        f"Trainer.step, NumPy batch, {GROUP} per submission": (lambda: trainer.step(x_host, y_host), GROUP),
    }
    out = {}
    for name, (body, group) in variants.items():
        trainer.steps_per_submit = group
        dev.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            body()
        host = time.perf_counter() - t0
        dev.synchronize()
        out[name] = {"host_us": host / steps * 1e6, "wall_us": (time.perf_counter() - t0) / steps * 1e6}
    trainer.steps_per_submit = 1
    return out


def _torch_train_times(torch, cfg, xs, ys, steps):
    sizes = cfg["sizes"]
    tx = [torch.from_numpy(x).cuda() for x in xs]
    ty = [torch.from_numpy(y.astype(np.int64)).cuda() for y in ys]
    out = {}
    for mode in ("eager", "graph"):
        model = _torch_mlp(torch, sizes, cfg["act"])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=(mode == "graph"))
        lossf = torch.nn.CrossEntropyLoss()

        def step(x, y):
            opt.zero_grad(set_to_none=False)
            loss = lossf(model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            return loss

        if mode == "eager":
            for i in range(3):
                step(tx[i % 4], ty[i % 4])
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for i in range(steps):
                step(tx[i % 4], ty[i % 4])
            torch.cuda.synchronize()
        else:
            sx, sy = tx[0].clone(), ty[0].clone()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    step(sx, sy)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                step(sx, sy)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for i in range(steps):
                sx.copy_(tx[i % 4])
                sy.copy_(ty[i % 4])
                g.replay()
            torch.cuda.synchronize()
        out[f"torch_{mode}_us"] = (time.perf_counter() - t0) / steps * 1e6
    return out
