"""Resource hygiene: long create/use/free loops keep host memory and the wgpu
resource report flat."""

import ctypes
import gc
import resource

import numpy as np
import pytest

import pywgtrain as pw
from pywgtrain import _core


def rss_mb():
    """Resident memory after handing freed heap pages back to the OS: glibc
    otherwise keeps them after GC-ordered frees, which reads as growth
    without any object being alive."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cycle(dev, i, a, b):
    t = pw.tensor(a, dev)  # buffer create + upload
    c = pw.gemm(t, b)  # recorder, bind groups, pipeline lookup
    rec = _core._Recorder(dev._dev)  # an explicit recorder, used and freed
    rec.fill_zero(c._buf, 0, 4)
    rec.submit()
    if i % 100 == 0:
        c.numpy()  # download through the staging buffer


def _report(dev):
    """wgpu's live objects, bind groups less those the bind-group cache keeps (bounded by its
    size; which groups it holds depends on what ran before in this process)."""
    rep = dev.resource_report()
    rep["bind_groups"] -= dev.memory_stats()["bind_groups_cached"]
    return rep


def test_ten_thousand_cycles_are_flat(dev):
    a = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    b = pw.tensor(a, dev)
    for i in range(500):  # warm caches, pools and allocator
        cycle(dev, i, a, b)
    dev.synchronize()
    gc.collect()
    rss0, rep0 = rss_mb(), _report(dev)
    for i in range(10_000):
        cycle(dev, i, a, b)
    dev.synchronize()
    gc.collect()
    rss1, rep1 = rss_mb(), _report(dev)
    print(f"RSS {rss0:.1f} -> {rss1:.1f} MB; report before {rep0}; after {rep1}")
    assert rss1 - rss0 < 20, f"RSS grew {rss1 - rss0:.1f} MB over 10,000 cycles"
    for kind in ("buffers", "bind_groups", "compute_pipelines", "command_buffers"):
        assert rep1[kind] <= rep0[kind] + 8, f"{kind}: {rep0[kind]} -> {rep1[kind]}"


def test_pipelines_compiled_once(dev):
    a = np.ones((5, 5), np.float32)
    pw.gemm(a, a)
    before = dev.resource_report()["compute_pipelines"]
    for _ in range(50):
        pw.gemm(a, a)
    assert dev.resource_report()["compute_pipelines"] == before


def test_device_cycles_release_pipelines_and_memory(request):
    """Devices (with their pipelines, layouts, staging and workspace) created,
    used and dropped repeatedly leave host memory flat."""
    if "nvidia" in pw.default_device().name.lower():
        # Measured on the H100: ~1.1 MB of RSS per cycle that compiles
        # pipelines, ~0.1 MB per bare device cycle; attribution (driver shader
        # caches vs wgpu) is open, see docs/reliability.md.
        request.applymarker(
            pytest.mark.xfail(reason="NVIDIA driver: RSS grows ~1.1 MB per device+pipeline cycle", strict=False)
        )
    a = np.ones((130, 70), np.float32)

    def cycle():
        d = pw.Device()
        pw.gemm(pw.tensor(a, d), pw.tensor(np.ascontiguousarray(a.T), d)).numpy()  # compiles a pipeline
        pw.clip_grad_norm_([pw.tensor(a, d)], 1.0)  # reduce + scale pipelines
        del d

    for _ in range(5):
        cycle()
    gc.collect()
    rss0 = rss_mb()
    for _ in range(60):
        cycle()
    gc.collect()
    rss1 = rss_mb()
    print(f"RSS over 60 device cycles: {rss0:.1f} -> {rss1:.1f} MB")
    assert rss1 - rss0 < 30, f"RSS grew {rss1 - rss0:.1f} MB over 60 device cycles"
