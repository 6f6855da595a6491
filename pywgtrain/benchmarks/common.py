"""What the benchmarks share: the CPU-adapter test, the PyTorch CUDA
baseline and its event timing, units for printing, a captured step's
per-kernel profile, and the output-path check (which the CLI's demos use too:
cli/ sits above benchmarks/, never the other way round)."""

import os
import statistics
import time


def is_cpu_adapter(dev):
    """lavapipe, WARP, SwiftShader...: the benchmarks scale down there."""
    return dev.info.get("adapter_type") == "cpu"


def fmt_flops(flops_per_us):
    """A FLOP rate in the unit that reads well: TFLOP/s on GPUs, GFLOP/s or MFLOP/s on CPU adapters."""
    tflops = flops_per_us / 1e6
    if tflops >= 1.0:
        return f"{tflops:6.2f} TFLOP/s"
    if tflops >= 1e-3:
        return f"{tflops * 1e3:6.2f} GFLOP/s"
    return f"{tflops * 1e6:6.1f} MFLOP/s"


def fmt_bandwidth(bytes_per_us):
    """Bytes per microsecond as GB/s, or MB/s below 1 GB/s (not "0 GB/s")."""
    gbps = bytes_per_us / 1e3
    if gbps >= 100:
        return f"{gbps:.0f} GB/s"
    if gbps >= 1:
        return f"{gbps:.1f} GB/s"
    return f"{gbps * 1e3:.1f} MB/s"


def _torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def _time_cuda(torch, fn, reps, warmup=3):
    """Median GPU time of fn(i) in microseconds: each call between its own
    pair of events, the calls issued back to back and synchronized once at
    the end, as time_pywgtrain_gemm's timed passes run. Synchronizing after
    every call left the GPU idle in between and read cuBLAS slow (H100, TF32
    off: 1024^3 75 vs 63 us, 1024x768x50304 NT 1613-1644 vs 1585-1592 us;
    docs/gemm_notes.md #59)."""
    for _ in range(warmup):
        fn(0)
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for i, (s, e) in enumerate(events):
        s.record()
        fn(i)
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in events)


def time_steps(fn, steps, sync, warmup=0):
    """Wall-clock ms per call of fn(i) over ``steps`` calls back to back, synchronized
    (``sync()``) before and after; ``warmup`` untimed calls first."""
    for i in range(warmup):
        fn(i)
    sync()
    t0 = time.perf_counter()
    for i in range(steps):
        fn(i)
    sync()
    return (time.perf_counter() - t0) / steps * 1e3


def gpu_adapters():
    """Indices into ``list_adapters()`` of the GPUs, once each: the adapters that are not CPU
    adapters, on the backend of the first of them (a GPU listed by two backends counts once)."""
    from ..device import list_adapters

    gpus = [a for a in list_adapters() if a.get("adapter_type") != "cpu"]
    return [a["index"] for a in gpus if a["backend"] == gpus[0]["backend"]]


def rank_adapter(local_rank):
    """The adapter of a data-parallel process with this ``LOCAL_RANK``: the local_rank-th GPU, or
    None (the default adapter, shared) when there are fewer GPUs than processes, as on a CPU
    adapter, where several processes share it."""
    gpus = gpu_adapters()
    return gpus[local_rank] if local_rank < len(gpus) else None


def check_output_path(path, option):
    """Raise ValueError unless a file can be written at ``path``: not a
    directory, its directory exists and is writable, and an existing file is
    writable. Run before training, so a typo does not cost a whole run."""
    if not path:
        return
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ValueError(f"{option} {path!r} is a directory; give a file path")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ValueError(f"{option} {path!r}: directory {directory!r} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {path!r}: directory {directory!r} is not writable")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise ValueError(f"{option} {path!r} exists and is not writable")
