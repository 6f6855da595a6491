"""Where a stream of ten small operations spends the host's time: the wall
clock of each call of ten streamed ``x + y`` or ``pw.gemm`` (M x N x K, mode),
then the flush and the wait of ``synchronize()``, medians over rounds; which
calls submitted a chunk shows as the slow ones (the stream submits chunks of
1, 2, 4, ... commands after a flush). Beside it, the same calls recorded
inside ``dev.batch()`` with no submission at all (recording alone), and ten
``torch.mm`` launched and synchronized (TF32 off) where PyTorch has CUDA.
CPU adapters run a 16 x 96 x 96 product and 5 rounds: a check that it runs.

    python bench/stream_timeline.py      # on the GPU machine after the prelude
"""

import statistics
import time

import numpy as np

import pywgtrain as pw
from pywgtrain.benchmarks.common import _torch_cuda, is_cpu_adapter
from pywgtrain.benchmarks.gemm import warm_up

CALLS = 10
GPU_SHAPES = [(64, 768, 768, "NN"), (256, 768, 768, "NN"), (64, 3072, 768, "TN")]


def timeline(dev, label, op, rounds):
    for _ in range(10):
        for _ in range(CALLS):
            op()
        dev.synchronize()
    per = [[] for _ in range(CALLS + 2)]
    submits = []
    for _ in range(rounds):
        s0 = dev._stream.submits
        ts = [time.perf_counter()]
        for _ in range(CALLS):
            op()
            ts.append(time.perf_counter())
        submits.append(dev._stream.submits - s0)
        dev.flush()
        ts.append(time.perf_counter())
        dev._dev.wait(0)
        ts.append(time.perf_counter())
        for i in range(CALLS + 2):
            per[i].append((ts[i + 1] - ts[i]) * 1e6)
    med = [statistics.median(p) for p in per]
    calls = " ".join(f"{x:.1f}" for x in med[:CALLS])
    print(
        f"{label}: calls {calls} | flush {med[CALLS]:.1f} wait {med[CALLS + 1]:.1f} | total {sum(med):.1f} us, "
        f"{statistics.median(submits):.0f} submissions during the calls",
        flush=True,
    )


def recorded_only(dev, label, op, rounds, n=100):
    cap = pw.Device.BATCH_SUBMIT_COMMANDS
    pw.Device.BATCH_SUBMIT_COMMANDS = 1 << 20  # no submission inside the timed loop
    try:
        ts = []
        for _ in range(max(rounds // 10, 3)):
            dev.synchronize()
            with dev.batch():
                t0 = time.perf_counter()
                for _ in range(n):
                    op()
                ts.append((time.perf_counter() - t0) / n * 1e6)
            dev.synchronize()
    finally:
        pw.Device.BATCH_SUBMIT_COMMANDS = cap
    print(f"{label}: recorded in a batch, no submission {statistics.median(ts):.2f} us/call", flush=True)


def main():
    dev = pw.default_device()
    torch = _torch_cuda()
    cpu = is_cpu_adapter(dev)
    rounds = 5 if cpu else 200
    if torch is not None and not cpu:
        warm_up(dev, torch)
    rng = np.random.default_rng(0)
    x = pw.tensor(rng.standard_normal(768).astype(np.float32), dev)
    recorded_only(dev, "x + y", lambda: x + x, rounds)
    timeline(dev, "x + y", lambda: x + x, rounds)
    for m, n, k, mode in [(16, 96, 96, "NN")] if cpu else GPU_SHAPES:
        ta, tb = mode[0] == "T", mode[1] == "T"
        a = pw.tensor(rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32), dev)
        b = pw.tensor(rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32), dev)

        def op(a=a, b=b, ta=ta, tb=tb):
            return pw.gemm(a, b, trans_a=ta, trans_b=tb)

        label = f"{m}x{n}x{k} {mode}"
        recorded_only(dev, label, op, rounds)
        timeline(dev, label, op, rounds)
        if torch is not None and not cpu:
            at, bt = torch.randn(a.shape, device="cuda"), torch.randn(b.shape, device="cuda")
            launch, total = [], []
            for _ in range(rounds):
                t0 = time.perf_counter()
                for _ in range(CALLS):
                    torch.mm(at.T if ta else at, bt.T if tb else bt)
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                launch.append((t1 - t0) * 1e6 / CALLS)
                total.append((time.perf_counter() - t0) * 1e6)
            print(
                f"  torch.mm: launch {statistics.median(launch):.1f} us/call, "
                f"ten then synchronize {statistics.median(total):.1f} us",
                flush=True,
            )


if __name__ == "__main__":
    main()
