"""Fused causal attention timings (wall clock over a batch of repeats, one
submission each): forward and forward + backward, TFLOP/s counted as the
usual 2 (forward) and 5 (backward) T x T x D matrix products halved by the
causal mask, beside torch's scaled_dot_product_attention (float32, CUDA)
when PyTorch with CUDA is importable. --profile: GPU time per kernel
(attn_forward, attn_delta, attn_dkdv, attn_dq; each dispatch in a timed pass
of its own, medians of 5) of one captured forward + backward at the GPT-2
small (B*H = 96, T = 1024) and nanoGPT-char (B*H = 384, T = 256) shapes.
Usage: python bench/attention_bench.py [--quick | --profile]"""

import sys
import time

import numpy as np

import pywgtrain as pw
import pywgtrain.nn.functional as F

SHAPES = [
    (16, 12, 256, 64),
    (8, 12, 1024, 64),
    (4, 16, 2048, 64),
    (2, 16, 4096, 128),
    (4, 8, 2048, 128),
    (8, 12, 1024, 32),
]
QUICK = [(1, 2, 256, 64)]


def timed(fn, dev, reps):
    fn().numpy()  # warm-up (pipelines compiled)
    t0 = time.perf_counter()
    with dev.batch():
        for _ in range(reps):
            r = fn()
    r.numpy()
    return (time.perf_counter() - t0) / reps


def torch_times(b, h, t, d, reps):
    try:
        import torch

        if not torch.cuda.is_available():
            return None
    except ImportError:
        return None
    q, k, v = (torch.randn(b, h, t, d, device="cuda", requires_grad=True) for _ in range(3))
    g = torch.randn(b, h, t, d, device="cuda")

    def run(bwd):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
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
    from pywgtrain.benchmarks.common import profile_step

    dev = pw.default_device()
    print(f"adapter: {dev.name}")
    rng = np.random.default_rng(0)
    for b, h, t, d in PROFILE_SHAPES:
        q, k, v, g = (pw.tensor(rng.standard_normal((b, h, t, d), dtype=np.float32), dev) for _ in range(4))
        out, dq, dk, dv = (pw.tensor(np.zeros((b, h, t, d), np.float32), dev) for _ in range(4))
        lse, delta = (pw.tensor(np.zeros(b * h * t, np.float32), dev) for _ in range(2))
        view = (0, h * t * d, t * d, d)
        scale = 1 / np.sqrt(d)
        rec = _core._Recorder(dev._dev)
        rec.begin_capture()
        _core.attention_forward(
            rec, q._buf, view, k._buf, view, v._buf, view, out._buf, view, lse._buf, b, h, t, d, scale
        )
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
        )
        graph = rec.end_capture()
        rec.submit()
        for _ in range(3):  # warm-up: clocks up
            r = _core._Recorder(dev._dev)
            r.replay(graph)
            r.submit()
        dq.numpy()
        prof = profile_step(dev, graph, reps=5)
        per = {kk["kernel"].split(":")[1].split(";")[0]: kk["us"] / 1e3 for kk in prof["kernels"]}
        fwd = per.get("attn_forward", 0.0)
        bwd = sum(per.get(n, 0.0) for n in ("attn_delta", "attn_dkdv", "attn_dq"))
        flop = 2 * 2 * b * h * t * t * d / 2
        print(
            f"B={b} H={h} T={t} D={d}: "
            + ", ".join(f"{n} {ms:.3f} ms" for n, ms in per.items())
            + f" | forward {fwd:.3f} ms ({flop / fwd / 1e9:.1f} TFLOP/s), backward {bwd:.3f} ms "
            f"({2.5 * flop / bwd / 1e9:.1f} TFLOP/s), whole pass {prof['gpu_us'] / 1e3:.3f} ms",
            flush=True,
        )


def main():
    if "--profile" in sys.argv:
        return profile_kernels()
    quick = "--quick" in sys.argv
    dev = pw.default_device()
    print(f"adapter: {dev.name}")
    rng = np.random.default_rng(0)
    for b, h, t, d in QUICK if quick else SHAPES:
        reps = 3 if quick else 10
        q, k, v, g = (
            pw.tensor(rng.standard_normal((b, h, t, d), dtype=np.float32), dev, requires_grad=True) for _ in range(4)
        )
        g.requires_grad = False

        def fwd():
            with pw.no_grad():
                return F.scaled_dot_product_attention(q, k, v)

        def fwd_bwd():
            q.grad = k.grad = v.grad = None
            F.scaled_dot_product_attention(q, k, v).backward(g)
            return v.grad

        tf, tfb = timed(fwd, dev, reps), timed(fwd_bwd, dev, reps)
        flop = 2 * 2 * b * h * t * t * d / 2  # forward: Q K^T and P V, causal half
        line = (
            f"B={b} H={h} T={t} D={d}: forward {tf * 1e3:.3f} ms ({flop / tf / 1e12:.2f} TFLOP/s), "
            f"forward+backward {tfb * 1e3:.3f} ms ({3.5 * flop / tfb / 1e12:.2f} TFLOP/s)"
        )
        ref = None if quick else torch_times(b, h, t, d, reps)
        if ref:
            line += f" | torch fp32: forward {ref[0] * 1e3:.3f} ms, forward+backward {ref[1] * 1e3:.3f} ms"
        print(line, flush=True)


if __name__ == "__main__":
    main()
