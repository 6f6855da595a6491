"""Where the GEMV's time goes (docs/gemm_notes.md #34): the same GEMVs (NN and NT) timed
one per compute pass (as `bench gemm` does) and 20 back to back in one pass,
beside cuBLAS (one call per event pair, and 20 between one pair) and PyTorch's
64 MB read (sum) and copy. On the GPU machine, after installing the package:

    source .gpu/prelude.sh && python3 bench/gemv_probe.py
"""

import statistics

import numpy as np

from pywgtrain import _core
from pywgtrain.benchmarks.common import _torch_cuda
from pywgtrain.benchmarks.gemm import time_pywgtrain_gemm, time_torch_gemm, warm_up
from pywgtrain.device import Device
from pywgtrain.tensor import tensor, zeros

BATCH = 20


def pywgtrain_batched(dev, k, n, tb, reps=10, one_output=False):
    """one_output: every GEMV writes the same y, so each waits for the one before
    (as in training); otherwise four outputs rotate and neighbours may overlap."""
    rng = np.random.default_rng(1)
    y0 = zeros((1, n), device=dev)
    sets = [
        (
            tensor(rng.standard_normal((1, k), np.float32), dev),
            tensor(rng.standard_normal((n, k) if tb else (k, n), np.float32), dev),
            y0 if one_output else zeros((1, n), device=dev),
        )
        for _ in range(4)
    ]
    dev.flush()  # the clears above run before this recording
    timer = _core._PassTimer(dev._dev, reps)
    rec = _core._Recorder(dev._dev)
    for i in range(reps):
        timer.time_next_pass(rec, i)
        for j in range(BATCH):
            x, b, y = sets[j % len(sets)]
            _core.gemm(rec, x._buf, b._buf, y._buf, 1, n, k, False, tb, 1.0, 0.0)
    return statistics.median(timer.read(rec, reps)) / 1e3 / BATCH


def torch_batched(torch, k, n, tb, reps=10):
    sets = [
        (
            torch.randn(1, k, device="cuda"),
            torch.randn(n, k, device="cuda").t() if tb else torch.randn(k, n, device="cuda"),
            torch.empty(1, n, device="cuda"),
        )
        for _ in range(4)
    ]
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for j in range(BATCH):
            x, b, y = sets[j % len(sets)]
            torch.mm(x, b, out=y)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3 / BATCH)
    return statistics.median(times)


def torch_event_us(torch, fn, reps=50):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3)
    return statistics.median(times)


def main():
    dev = Device()
    torch = _torch_cuda()
    warm_up(dev, torch)
    for tb in (False, True):
        for k, n in ((4, 4), (1024, 4096), (4096, 4096), (8192, 8192)):
            mb = 4 * k * n / 2**20
            line = (
                f"1x{k}x{n} {'NT' if tb else 'NN'} ({mb:.1f} MB): pywgtrain per pass "
                f"{time_pywgtrain_gemm(dev, 1, k, n, False, tb, 50):7.1f} us, "
                f"{BATCH} in one pass {pywgtrain_batched(dev, k, n, tb):7.1f} us each "
                f"({pywgtrain_batched(dev, k, n, tb, one_output=True):.1f} into one output)"
            )
            if torch is not None:
                line += (
                    f" | cuBLAS per call {time_torch_gemm(torch, 1, k, n, False, tb, 50):7.1f} us, "
                    f"{BATCH} between events {torch_batched(torch, k, n, tb):7.1f} us each"
                )
            print(line, flush=True)
    if torch is not None:
        src = torch.randn(1 << 24, device="cuda")
        dst = torch.empty_like(src)
        read_us = torch_event_us(torch, lambda: src.sum())
        copy_us = torch_event_us(torch, lambda: dst.copy_(src))
        print(
            f"PyTorch 64 MB: sum {read_us:.1f} us ({64 * 2**20 / read_us / 1e6:.2f} TB/s read), "
            f"copy {copy_us:.1f} us ({2 * 64 * 2**20 / copy_us / 1e6:.2f} TB/s read+write)"
        )


if __name__ == "__main__":
    main()
