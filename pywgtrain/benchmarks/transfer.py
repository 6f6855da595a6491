"""``pywgtrain bench transfer``: host <-> device copies in GB/s, up
(``pywgtrain.tensor(ndarray)`` until the data has landed) and down three
ways: ``Tensor.numpy()`` as users call it (a new array: from 4 MiB on, a
pooled block, reused once the previous result is gone), ``numpy(out=a)``
into one reused array, and ``numpy(out=np.empty(...))`` into a fresh array
each time (pages the kernel faults in and zeroes during the copy: what
``numpy()`` did before the pool), beside PyTorch with
CUDA when present: ``torch.from_numpy(x).to('cuda')`` / ``.cpu()`` (pageable
memory) and ``copy_`` between a pinned host tensor and the device
(``non_blocking``, then synchronize). Wall-clock medians after a warm-up:
the host's side is what is measured. The device's transfer settings (chunk
size, staging buffers in flight, copy threads: ``Device.transfer_settings``,
set through ``PYWGTRAIN_TRANSFER_*`` / ``PYWGTRAIN_COPY_THREADS``) are printed
and saved with the results, so runs with other settings can be compared."""

import re
import statistics
import time

import numpy as np

from ..tensor import tensor
from .common import fmt_bandwidth, is_cpu_adapter

MIB = 1 << 20
GPU_SIZES = [MIB << k for k in (0, 2, 4, 6, 8, 10)]  # 1 MiB .. 1 GiB
GPU_QUICK_SIZES = [MIB, 64 * MIB, 1024 * MIB]
CPU_SIZES = [MIB, 4 * MIB, 16 * MIB]  # lavapipe: every copy runs on the CPU anyway
CPU_QUICK_SIZES = [MIB, 4 * MIB]
_UNITS = {"": MIB, "K": 1 << 10, "M": MIB, "G": 1 << 30}


def parse_sizes(text):
    """'64K,1M,1G,16' -> byte counts (K, M, G: KiB, MiB, GiB; no suffix: MiB),
    each a whole number of 4-byte elements and at least 4 bytes."""
    sizes = []
    for item in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", item, re.I)
        if not m:
            raise ValueError(f"bad transfer size {item.strip()!r}: expected a number with an optional K, M or G suffix")
        nbytes = int(m.group(1)) * _UNITS[m.group(2).upper()]
        if nbytes < 4 or nbytes % 4:
            raise ValueError(f"bad transfer size {item.strip()!r}: must be a positive multiple of 4 bytes")
        sizes.append(nbytes)
    return sizes


def fmt_size(nbytes):
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def _median_us(fn, reps, warmup=1):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def _ours(dev, x, reps):
    """(upload us, download us, download into a reused array us, download into
    a fresh array us); checks the round trip once. An upload is
    timed until a read of a one-element tensor after it returns, less that
    read's own time: synchronize() alone would not wait for a small upload,
    whose queue write runs ahead of the next submission, not before."""
    holder = {}
    probe = tensor(np.zeros(1, np.float32), dev)

    def up():
        holder.pop("t", None)  # its block goes back to the cache: the next upload reuses it
        holder["t"] = tensor(x, dev)
        probe.numpy()

    probe_us = _median_us(probe.numpy, max(reps, 10))
    up_us = max(_median_us(up, reps) - probe_us, 1e-3)
    t = holder["t"]
    if not np.array_equal(t.numpy(), x):
        raise RuntimeError(f"transfer benchmark: the round trip of {x.nbytes} bytes changed the data")
    down_us = _median_us(t.numpy, reps)
    reused = np.empty_like(x)
    out_us = _median_us(lambda: t.numpy(out=reused), reps)
    if not np.array_equal(reused, x):
        raise RuntimeError(f"transfer benchmark: numpy(out=) of {x.nbytes} bytes changed the data")
    fresh_us = _median_us(lambda: t.numpy(out=np.empty_like(x)), reps)
    return up_us, down_us, out_us, fresh_us


def _torch(torch, x, reps):
    """PyTorch: (pageable up, pageable down, pinned up, pinned down) in us."""
    host = torch.from_numpy(x)
    dev_t = host.to("cuda")
    pinned = torch.empty(host.shape, dtype=host.dtype, pin_memory=True)
    pinned.copy_(host)

    def pageable_up():
        host.to("cuda")
        torch.cuda.synchronize()

    def pinned_up():
        dev_t.copy_(pinned, non_blocking=True)
        torch.cuda.synchronize()

    def pinned_down():
        pinned.copy_(dev_t, non_blocking=True)
        torch.cuda.synchronize()

    return (
        _median_us(pageable_up, reps),
        _median_us(dev_t.cpu, reps),
        _median_us(pinned_up, reps),
        _median_us(pinned_down, reps),
    )


TORCH_COLUMNS = ("torch_pageable_up", "torch_pageable_down", "torch_pinned_up", "torch_pinned_down")


def bench_transfer(dev, quick, torch, sizes=None):
    cpu = is_cpu_adapter(dev)
    if sizes is None:
        sizes = (CPU_QUICK_SIZES if quick else CPU_SIZES) if cpu else (GPU_QUICK_SIZES if quick else GPU_SIZES)
    settings = dev.transfer_settings
    print(
        "transfer settings: "
        + ", ".join(f"{k} {fmt_size(v) if k.endswith(('bytes', 'max')) else v}" for k, v in settings.items()),
        flush=True,
    )
    rng = np.random.default_rng(0)
    rows = []
    for i, nbytes in enumerate(sizes):
        print(f"[{i + 1}/{len(sizes)}] {fmt_size(nbytes)}: ", end="", flush=True)
        x = rng.standard_normal(nbytes // 4, dtype=np.float32)
        reps = 3 if quick or cpu else int(min(30, max(5, (4 << 30) // nbytes)))
        up_us, down_us, out_us, fresh_us = _ours(dev, x, reps)
        row = {
            "bytes": nbytes,
            "reps": reps,
            "up_us": up_us,
            "down_us": down_us,
            "down_out_us": out_us,
            "down_fresh_us": fresh_us,
        }
        line = (
            f"pywgtrain up {fmt_bandwidth(nbytes / up_us)}, down {fmt_bandwidth(nbytes / down_us)} "
            f"(out= {fmt_bandwidth(nbytes / out_us)}, fresh array {fmt_bandwidth(nbytes / fresh_us)})"
        )
        if torch is not None:
            times = _torch(torch, x, reps)
            row.update({f"{k}_us": t for k, t in zip(TORCH_COLUMNS, times)})
            line += "; torch pageable up {}, down {}; pinned up {}, down {}".format(
                *(fmt_bandwidth(nbytes / t) for t in times)
            )
        print(line, flush=True)
        rows.append(row)
    _table(rows, torch is not None)
    return {"settings": settings, "rows": rows}


def _table(rows, with_torch):
    cols = ["up", "down", "down_out", "down_fresh"] + (list(TORCH_COLUMNS) if with_torch else [])
    names = ["pywgtrain up", "pywgtrain down", "down out=", "down fresh"] + (
        ["torch pageable up", "torch pageable down", "torch pinned up", "torch pinned down"] if with_torch else []
    )
    width = max(len(n) for n in names) + 2
    print("\n" + "size".rjust(9) + "".join(n.rjust(width) for n in names) + "   (GB/s)")
    for r in rows:
        cells = "".join(f"{r['bytes'] / r[c + '_us'] / 1e3:{width}.2f}" for c in cols)
        print(fmt_size(r["bytes"]).rjust(9) + cells)
