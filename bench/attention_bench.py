"""Fused causal attention timings (wall clock over a batch of repeats, one
submission each): forward and forward + backward, float32 and float16 kernels
side by side, TFLOP/s counted as the usual 2 (forward) and 5 (backward)
T x T x D matrix products halved by the causal mask, beside torch's
scaled_dot_product_attention in float32 and float16 (CUDA, TF32 off) when
PyTorch with CUDA is importable. --json FILE writes the rows. --profile: GPU
time per kernel (attn_forward, attn_delta, attn_dkdv, attn_dq; each dispatch
in a timed pass of its own, medians of 5) of one captured forward + backward
at the GPT-2 small (B*H = 96, T = 1024) and nanoGPT-char (B*H = 384, T = 256)
shapes, in float32 and float16. --full: no causal mask (every key seen; TFLOP/s
count the whole products), ours and torch's alike.
Usage: python bench/attention_bench.py [--quick] [--full] [--json FILE] | --profile [--quick] [--full]"""

import json
import sys
import time

import numpy as np

import pywgtrain as pw
import pywgtrain.nn.functional as F
from pywgtrain.benchmarks.common import _torch_cuda

SHAPES = [
    (16, 12, 256, 64),
    (8, 12, 1024, 64),
    (4, 16, 2048, 64),
    (2, 16, 4096, 128),
    (4, 8, 2048, 128),
    (8, 12, 1024, 32),
]
QUICK = [(1, 2, 33, 16)]
CAUSAL = "--full" not in sys.argv
MASKED = 0.5 if CAUSAL else 1.0  # share of the T x T products computed
DTYPES = (np.float32, np.float16)


def timed(fn, dev, reps):
    fn().numpy()  # warm-up (pipelines compiled)
    t0 = time.perf_counter()
    with dev.batch():
        for _ in range(reps):
            r = fn()
    r.numpy()
    return (time.perf_counter() - t0) / reps


def ours_times(dev, rng, shape, dtype, reps):
    """(forward, forward + backward) seconds of F.scaled_dot_product_attention on ``dtype`` tensors."""
    q, k, v, g = (
        pw.tensor(rng.standard_normal(shape, dtype=np.float32).astype(dtype), dev, requires_grad=True) for _ in range(4)
    )
    g.requires_grad = False

    def fwd():
        with pw.no_grad():
            return F.scaled_dot_product_attention(q, k, v, is_causal=CAUSAL)

    def fwd_bwd():
        q.grad = k.grad = v.grad = None
        F.scaled_dot_product_attention(q, k, v, is_causal=CAUSAL).backward(g)
        return v.grad

    return timed(fwd, dev, reps), timed(fwd_bwd, dev, reps)


def torch_times(torch, b, h, t, d, dtype, reps):
    """(forward, forward + backward) seconds of torch's SDPA on CUDA ``dtype`` tensors."""
    q, k, v = (torch.randn(b, h, t, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
    g = torch.randn(b, h, t, d, device="cuda", dtype=dtype)

    def run(bwd):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=CAUSAL)
        if bwd:
            out.backward(g)

    res = []
    for bwd in (False, True):
        for _ in range(3):
            run(bwd)
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(reps):
            run(bwd)
        e.record()
        torch.cuda.synchronize()
        res.append(s.elapsed_time(e) / 1e3 / reps)
    return res


PROFILE_SHAPES = [(8, 12, 1024, 64), (64, 6, 256, 64)]


def profile_kernels():
    from pywgtrain import _core

    dev = pw.default_device()
    print(f"adapter: {dev.name}")
    rng = np.random.default_rng(0)
    shapes = QUICK if "--quick" in sys.argv else PROFILE_SHAPES
    for (b, h, t, d), dt in ((shape, dt) for shape in shapes for dt in DTYPES):
        half = dt is np.float16
        q, k, v, g = (pw.tensor(rng.standard_normal((b, h, t, d), dtype=np.float32).astype(dt), dev) for _ in range(4))
        out, dq, dk, dv = (pw.tensor(np.zeros((b, h, t, d), dt), dev) for _ in range(4))
        lse, delta = (pw.tensor(np.zeros(b * h * t, np.float32), dev) for _ in range(2))
        view = (0, h * t * d, t * d, d)
        scale = 1 / np.sqrt(d)
        graph = pw.Graph()
        with pw.graph(graph), dev._recording() as rec:
            _core.attention_forward(
                rec, q._buf, view, k._buf, view, v._buf, view, out._buf, view, lse._buf, b, h, t, d, scale, 0, half,
                causal=CAUSAL,
            )  # fmt: skip
            _core.attention_backward(
                rec,
                q._buf,
                view,
                k._buf,
                view,
                v._buf,
                view,
                out._buf,
                view,
                g._buf,
                view,
                lse._buf,
                delta._buf,
                dq._buf,
                view,
                dk._buf,
                view,
                dv._buf,
                view,
                b,
                h,
                t,
                d,
                scale,
                0.0,
                0,
                half,
                causal=CAUSAL,
            )
        for _ in range(3):  # warm-up: clocks up
            graph.replay()
        dq.numpy()
        prof = graph.profile(reps=5)
        per = {kk["kernel"].split(":")[1].split(";")[0]: kk["us"] / 1e3 for kk in prof["kernels"]}
        fwd = per.get("attn_forward", 0.0)
        bwd = sum(per.get(n, 0.0) for n in ("attn_delta", "attn_dkdv", "attn_dq"))
        flop = 2 * 2 * b * h * t * t * d * MASKED
        print(
            f"B={b} H={h} T={t} D={d} {np.dtype(dt).name}: "
            + ", ".join(f"{n} {ms:.3f} ms" for n, ms in per.items())
            + f" | forward {fwd:.3f} ms ({flop / fwd / 1e9:.1f} TFLOP/s), backward {bwd:.3f} ms "
            f"({2.5 * flop / bwd / 1e9:.1f} TFLOP/s), whole pass {prof['gpu_us'] / 1e3:.3f} ms",
            flush=True,
        )


def main():
    if "--profile" in sys.argv:
        return profile_kernels()
    quick = "--quick" in sys.argv
    out = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
    reps = 2 if quick else 10
    dev = pw.default_device()
    torch = _torch_cuda()
    print(f"adapter: {dev.name}; torch CUDA: {'yes' if torch else 'no'} (TF32 off); causal: {CAUSAL}")
    print("ms per call (TFLOP/s); fwd: forward, f+b: forward + backward; torch: CUDA SDPA")
    cols = ["f32 fwd", "f16 fwd", "torch32 fwd", "torch16 fwd", "f32 f+b", "f16 f+b", "torch32 f+b", "torch16 f+b"]
    print(f"{'B H T D':<18}" + "".join(f"{c:>16}" for c in cols))
    rng = np.random.default_rng(0)
    rows = []
    for b, h, t, d in QUICK if quick else SHAPES:
        flop = 2 * 2 * b * h * t * t * d * MASKED  # forward: Q K^T and P V
        ours = {dt: ours_times(dev, rng, (b, h, t, d), dt, reps) for dt in DTYPES}
        theirs = {}
        if torch is not None:
            theirs = {
                dt: torch_times(torch, b, h, t, d, tt, reps) for dt, tt in zip(DTYPES, (torch.float32, torch.float16))
            }
        cells, row = [], dict(b=b, h=h, t=t, d=d)
        for i, (part, work) in enumerate((("fwd", flop), ("fwd_bwd", 3.5 * flop))):
            for who, times in (("ours", ours), ("torch", theirs)):
                for dt in DTYPES:
                    sec = times[dt][i] if dt in times else None
                    name = f"{who}_{np.dtype(dt).name}_{part}_ms"
                    row[name] = None if sec is None else sec * 1e3
                    cells.append(f"{'-':>16}" if sec is None else f"{sec * 1e3:9.3f} ({work / sec / 1e12:4.1f})")
        # column order: f32, f16, torch f32, torch f16 per part
        print(f"{f'{b} {h} {t} {d}':<18}" + "".join(f"{c:>16}" for c in cells), flush=True)
        rows.append(row)
    if out:
        with open(out, "w") as f:
            json.dump(dict(adapter=dev.name, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
