"""Host <-> device transfers (csrc/transfer.cpp): chunked through rings of
staging buffers, several chunks in flight, host copies split across threads,
small uploads through the queue's own write. Round trips at awkward sizes
around the chunk size, byte offsets, ordering against recorded work, and
failures mid-transfer that leave no staging buffer mapped."""

import numpy as np
import pytest

import pywgtrain as pw
from pywgtrain import _core

from helpers import poisoned, run_threads

CHUNK = 4096  # bytes per staging buffer on the small-chunk device: many chunks at test sizes
SLOTS = 3


def _open(**env):
    """A Device opened with `env` set; never the default device (the first one opened)."""
    pw.default_device()
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, str(value))
        return pw.Device()


@pytest.fixture(scope="module")
def small():
    """Every upload through the ring (no queue writes), 4 KiB chunks, 3 in flight."""
    return _open(
        PYWGTRAIN_TRANSFER_CHUNK_KIB=CHUNK // 1024,
        PYWGTRAIN_TRANSFER_SLOTS=SLOTS,
        PYWGTRAIN_QUEUE_WRITE_MAX_KIB=0,
        PYWGTRAIN_COPY_THREADS=1,
    )


def _random(rng, n, dtype):
    if dtype == np.int32:
        return rng.integers(-(2**31), 2**31 - 1, n, dtype=np.int32)
    return rng.standard_normal(n).astype(np.float32)


def _sizes():
    per = CHUNK // 4  # elements per chunk
    return [1, 7, 33, 129, per - 1, per, per + 1, 2 * per, SLOTS * per + 1, (2 * SLOTS + 1) * per + 5]


def test_settings_come_from_the_environment(dev, small):
    assert small.transfer_settings == {"chunk_bytes": CHUNK, "slots": SLOTS, "copy_threads": 1, "queue_write_max": 0}
    default = dev.transfer_settings
    assert default["chunk_bytes"] == 32 << 20 and default["slots"] == 4 and default["queue_write_max"] == 1 << 20
    assert 1 <= default["copy_threads"] <= 8


@pytest.mark.parametrize(
    "name,value,match",
    [
        ("PYWGTRAIN_TRANSFER_SLOTS", "0", "PYWGTRAIN_TRANSFER_SLOTS must be from 1 to 16, got 0"),
        ("PYWGTRAIN_TRANSFER_CHUNK_KIB", "2", "PYWGTRAIN_TRANSFER_CHUNK_KIB must be from 4 to"),
        ("PYWGTRAIN_COPY_THREADS", "many", "PYWGTRAIN_COPY_THREADS must be a non-negative integer, got 'many'"),
        ("PYWGTRAIN_QUEUE_WRITE_MAX_KIB", "-1", "PYWGTRAIN_QUEUE_WRITE_MAX_KIB must be a non-negative integer"),
    ],
)
def test_bad_settings_are_refused_when_the_device_opens(name, value, match):
    with pytest.raises(ValueError, match=match):
        _open(**{name: value})


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("n", _sizes())
def test_round_trip_through_the_rings(small, rng, n, dtype):
    """tensor() and numpy(), and copy_ over poisoned device memory read back
    into a poisoned host array, at sizes around the chunk and past the ring."""
    x = _random(rng, n, dtype)
    np.testing.assert_array_equal(pw.tensor(x, small).numpy(), x)
    t = poisoned(small, n) if dtype == np.float32 else pw.tensor(np.full(n, -7, np.int32), small)
    t.copy_(x)
    out = np.full(n, np.nan, np.float32).view(dtype)
    t._buf.download(out.view(np.uint8))
    np.testing.assert_array_equal(out, x)


@pytest.mark.parametrize("nbytes", [1, 3, 5, 7, CHUNK - 1, CHUNK + 1, 3 * CHUNK + 3, (SLOTS + 2) * CHUNK + 2])
def test_byte_offsets_and_ragged_tails(small, rng, nbytes):
    """Raw buffers: uploads at 4-byte offsets of any length (the tail padded
    with zeros to the copy granule), downloads at any byte offset."""
    size = nbytes + 64
    buf = _core._Buffer(small._dev, size)
    base = rng.integers(0, 256, size, dtype=np.uint8)
    buf.upload(base)
    data = rng.integers(0, 256, nbytes, dtype=np.uint8)
    for offset in (0, 4, 24):
        buf.upload(base)
        buf.upload(data, offset)
        want = base.copy()
        want[offset : offset + nbytes] = data
        pad = -nbytes % 4  # the granule's remaining bytes are written as zeros
        want[offset + nbytes : offset + nbytes + pad] = 0
        got = np.full(size, 0xEE, np.uint8)
        buf.download(got)
        np.testing.assert_array_equal(got, want)
        for start in (0, 1, 2, 3, 5, 30):
            n = min(nbytes, size - start)
            part = np.full(n, 0xEE, np.uint8)
            buf.download(part, start)
            np.testing.assert_array_equal(part, want[start : start + n])


def test_views_of_a_storage(small, rng):
    """copy_ into contiguous views at element offsets uploads at that offset;
    reading views back (aligned or not) sees exactly their elements."""
    per = CHUNK // 4
    n = 3 * per + 11
    t = poisoned(small, n)
    x = rng.standard_normal(n).astype(np.float32)
    t.copy_(x)
    for lo, hi in ((0, 1), (1, per + 2), (per - 1, 3 * per), (5, n)):
        v = t[lo:hi]
        np.testing.assert_array_equal(v.numpy(), x[lo:hi])
        y = rng.standard_normal(hi - lo).astype(np.float32)
        v.copy_(y)
        x[lo:hi] = y
        np.testing.assert_array_equal(t.numpy(), x)


def test_transfers_keep_order_with_recorded_work(small, rng):
    """An upload is seen by work recorded after it and not by work recorded
    before it; a download sees all work recorded before it."""
    n = 2 * SLOTS * CHUNK // 4 + 3
    x, z = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    t = pw.tensor(x, small)
    for _ in range(3):
        before = t * 2.0  # recorded, not yet submitted
        t.copy_(z)
        after = t + 1.0
        np.testing.assert_array_equal(before.numpy(), x * 2.0)
        np.testing.assert_array_equal(after.numpy(), z + 1.0)
        t.copy_(x)
    acc, want = pw.tensor(x, small), x
    for _ in range(4):
        acc, want = acc + 1.0, want + np.float32(1.0)  # float32 steps, rounded as the GPU's
    np.testing.assert_array_equal(acc.numpy(), want)
    with small.batch():
        doubled = t * 2.0
    np.testing.assert_array_equal(doubled.numpy(), x * 2.0)


def test_transfers_from_several_threads(small, rng):
    """Threads sharing the rings: each transfer has its ring for all its chunks."""

    n = (SLOTS + 2) * CHUNK // 4 + 1
    data = [rng.standard_normal(n).astype(np.float32) for _ in range(4)]
    bad = []

    def worker(x):
        try:
            for k in range(5):
                t = pw.tensor(x + np.float32(k), small)
                if not np.array_equal(t.numpy(), x + np.float32(k)):
                    bad.append(k)
        except Exception as e:  # a thread's exception would only be printed
            bad.append(e)

    run_threads([lambda x=x: worker(x) for x in data])
    assert not bad


def test_queue_writes_and_ring_uploads_interleave(rng):
    """Uploads up to queue_write_max go through the queue's own write, larger
    ones through the ring; overlapping writes land in the order made."""
    dev = _open(PYWGTRAIN_TRANSFER_CHUNK_KIB=4, PYWGTRAIN_TRANSFER_SLOTS=2, PYWGTRAIN_QUEUE_WRITE_MAX_KIB=8)
    n = 9 * 1024  # 36 KiB
    buf = _core._Buffer(dev._dev, 4 * n)
    want = np.full(n, np.nan, np.float32)
    buf.upload(want.view(np.uint8))
    for lo, hi in ((0, n), (100, 100 + 2048), (50, 50 + 5000), (4000, 4100), (0, 3 * 1024 + 1), (1, 2)):
        part = rng.standard_normal(hi - lo).astype(np.float32)
        buf.upload(part.view(np.uint8), 4 * lo)
        want[lo:hi] = part
    got = np.full(n, np.nan, np.float32)
    buf.download(got.view(np.uint8))
    np.testing.assert_array_equal(got, want)


def test_host_copies_split_across_threads(rng):
    """Chunks of several MiB are copied by 3 threads (parts of whole pages)."""
    dev = _open(PYWGTRAIN_TRANSFER_CHUNK_KIB=3072, PYWGTRAIN_COPY_THREADS=3, PYWGTRAIN_TRANSFER_SLOTS=2)
    assert dev.transfer_settings["copy_threads"] == 3
    n = (2 * 3072 * 1024 + 12345) // 4 + 1
    x = rng.standard_normal(n).astype(np.float32)
    t = pw.tensor(x, dev)
    np.testing.assert_array_equal(t.numpy(), x)
    np.testing.assert_array_equal(t[1:].numpy(), x[1:])


@pytest.mark.parametrize("direction", ["download", "upload"])
def test_failed_map_mid_transfer_leaves_no_half_state(small, rng, direction):
    """A staging map that fails mid-transfer raises GpuError naming the
    transfer; no staging buffer stays mapped, and the next transfers work."""
    n = (2 * SLOTS + 1) * CHUNK // 4
    x = rng.standard_normal(n).astype(np.float32)
    t = pw.tensor(x, small)
    small.synchronize()
    _core._inject_map_failure(1)
    try:
        what = {"download": "downloading", "upload": "uploading"}[direction]
        with pytest.raises(pw.GpuError, match=f"{what} {4 * n} bytes: mapping a staging buffer failed"):
            if direction == "download":
                t.numpy()
            else:
                t.copy_(x[::-1].copy())
    finally:
        _core._inject_map_failure(-1)  # disarmed, had it not fired
    assert all(state != "mapped" for _, state, _ in small._dev.staging_report())
    y = rng.standard_normal(n).astype(np.float32)
    t.copy_(y)
    np.testing.assert_array_equal(t.numpy(), y)


@pytest.mark.parametrize("direction", ["download", "upload"])
def test_device_lost_mid_transfer(rng, direction):
    dev = _open(PYWGTRAIN_TRANSFER_CHUNK_KIB=4, PYWGTRAIN_TRANSFER_SLOTS=2, PYWGTRAIN_QUEUE_WRITE_MAX_KIB=0)
    n = 6 * 1024
    x = rng.standard_normal(n).astype(np.float32)
    t = pw.tensor(x, dev)
    _core._inject_map_failure(2, lose_device=True)
    try:
        with pytest.raises(pw.DeviceLostError, match="create a new pywgtrain.Device"):
            if direction == "download":
                t.numpy()
            else:
                t.copy_(x)
    finally:
        _core._inject_map_failure(-1)
    assert dev.lost
    assert dev._dev.staging_report() == []
    with pytest.raises(pw.DeviceLostError):
        t.numpy()
    fresh = _open(PYWGTRAIN_TRANSFER_CHUNK_KIB=4)
    np.testing.assert_array_equal(pw.tensor(x, fresh).numpy(), x)


def test_mid_sizes_are_cut_into_one_chunk_per_slot(rng):
    """With the default 32 MiB chunks, 12 MiB moves as 3 chunks of 4 MiB (the
    smallest chunk), so GPU and host copies overlap."""
    dev = _open()
    x = rng.standard_normal(3 << 20).astype(np.float32)
    np.testing.assert_array_equal(pw.tensor(x, dev).numpy(), x)
    report = dev._dev.staging_report()
    assert [d for d, _, _ in report].count("download") == 3
    assert [d for d, _, _ in report].count("upload") == 3


def test_empty_cache_releases_the_staging_buffers(small, rng):
    x = rng.standard_normal(3 * CHUNK).astype(np.float32)
    np.testing.assert_array_equal(pw.tensor(x, small).numpy(), x)
    assert small._dev.staging_report()
    small.empty_cache()
    assert small._dev.staging_report() == []
    np.testing.assert_array_equal(pw.tensor(x, small).numpy(), x)


@pytest.mark.slow
def test_large_round_trip_with_default_settings(dev, rng):
    """Default chunks (32 MiB, 4 in flight): 5 chunks and a ragged tail, each way."""
    s = dev.transfer_settings
    n = (s["slots"] + 1) * s["chunk_bytes"] // 4 + 12345
    x = rng.standard_normal(n).astype(np.float32)
    t = pw.tensor(x, dev)
    np.testing.assert_array_equal(t.numpy(), x)
    y = x[::-1].copy()
    t.copy_(y)
    out = np.full(n, np.nan, np.float32)
    t._buf.download(out.view(np.uint8))
    np.testing.assert_array_equal(out, y)


# -- download destinations: out= and the host pool ------------------------------------

POOL_MIN = _core.HOST_POOL_MIN_BYTES
N_OPS = 100


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16])
@pytest.mark.parametrize("n", [1, 7, 33, 129, (2 * SLOTS + 1) * CHUNK // 4 + 5])
def test_numpy_into_out(small, rng, n, dtype):
    """numpy(out=) fills the caller's poisoned array and returns it; a strided view too."""
    # (int32 values away from float32 NaN patterns: a view's copy moves words as float32)
    x = rng.integers(-2048, 2048, n + 1).astype(dtype) if dtype != np.float32 else _random(rng, n + 1, dtype)
    t = pw.tensor(x, small)
    out = np.full(n + 1, np.nan, np.float32).astype(dtype) if dtype != np.int32 else np.full(n + 1, -1, dtype)
    assert t.numpy(out=out) is out
    np.testing.assert_array_equal(out, x)
    view_out = np.full(n, -1, dtype)
    assert t[1:].numpy(out=view_out) is view_out
    np.testing.assert_array_equal(view_out, x[1:])


def test_numpy_out_is_checked_before_anything_is_read(small, rng):
    t = pw.tensor(rng.standard_normal((3, 5)).astype(np.float32), small)
    ro = np.full((3, 5), np.nan, np.float32)
    ro.flags.writeable = False
    cases = [
        ([1.0] * 15, TypeError, "numpy\\(\\): out must be a numpy.ndarray, got list"),
        (np.full((3, 5), np.nan), TypeError, "out must have dtype float32, got float64"),
        (np.full(15, np.nan, np.float32), ValueError, r"out has shape \(15,\), expected \(3, 5\)"),
        (np.full((5, 3), np.nan, np.float32).T, ValueError, "out must be C-contiguous"),
        (ro, ValueError, "out is read-only"),
    ]
    for out, exc, match in cases:
        with pytest.raises(exc, match=match):
            t.numpy(out=out)
        if isinstance(out, np.ndarray):
            assert np.isnan(out).all()  # untouched


def test_large_arrays_come_from_the_host_pool(dev, rng):
    """numpy() results of POOL_MIN bytes and more live in pooled blocks: the
    block of a dead array serves the next download of its size class, and a
    view keeps its block out of the pool until the view is gone."""
    import gc

    dev.empty_cache()
    x = rng.standard_normal(POOL_MIN // 4 + 33).astype(np.float32)
    t = pw.tensor(x, dev)
    before = pw.host_memory_stats()
    a = t.numpy()
    np.testing.assert_array_equal(a, x)
    assert a.flags.writeable and a.flags.c_contiguous and a.shape == x.shape
    held = pw.host_memory_stats()
    size = held["in_use_bytes"] - before["in_use_bytes"]
    assert size >= x.nbytes and size % (2 << 20) == 0  # whole huge pages
    assert held["misses"] == before["misses"] + 1 and held["cached_bytes"] == 0
    address = a.ctypes.data
    view = a[100:]
    del a
    gc.collect()
    assert pw.host_memory_stats()["in_use_bytes"] == held["in_use_bytes"]  # the view holds it
    np.testing.assert_array_equal(view, x[100:])
    del view
    gc.collect()
    idle = pw.host_memory_stats()
    assert idle["in_use_bytes"] == before["in_use_bytes"] and idle["cached_bytes"] == size
    b = t.numpy()
    assert b.ctypes.data == address and pw.host_memory_stats()["hits"] == idle["hits"] + 1
    np.testing.assert_array_equal(b, x)
    small = t[:100].numpy()  # below POOL_MIN: a NumPy array of its own
    assert small.base is None and pw.host_memory_stats()["in_use_bytes"] == idle["in_use_bytes"] + size
    del b
    gc.collect()
    dev.empty_cache()
    assert pw.host_memory_stats()["cached_bytes"] == 0


def test_pooled_array_outlives_its_device(rng):
    import gc

    d = _open()
    x = rng.standard_normal(POOL_MIN // 4).astype(np.float32)
    a = pw.tensor(x, d).numpy()
    d.destroy()
    del d
    gc.collect()
    a += 1.0  # still writable memory of our own
    np.testing.assert_array_equal(a, x + np.float32(1.0))


def test_pooled_downloads_from_threads_leak_nothing(dev, rng):
    """Many pooled downloads from several threads: every value right, and
    every block back in the pool (bounded: its size classes) once the arrays
    are gone; the process's resident memory stays bounded too."""
    import gc

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    sizes = [POOL_MIN // 4, POOL_MIN // 4 + 600_000]  # two size classes
    tensors = [(pw.tensor(rng.standard_normal(n).astype(np.float32), dev)) for n in sizes]
    wants = [t.numpy().copy() for t in tensors]
    gc.collect()
    start = pw.host_memory_stats()
    start_rss = rss()
    bad = []

    def worker(seed):
        try:
            for k in range(4):
                i = (seed + k) % len(tensors)
                if not np.array_equal(tensors[i].numpy(), wants[i]):
                    bad.append((seed, k))
        except Exception as e:  # a thread's exception would only be printed
            bad.append(e)

    run_threads([lambda s=s: worker(s) for s in range(2)])
    gc.collect()
    assert not bad
    for _ in range(30):  # one after another: each reuses the block the last one gave back
        tensors[0].numpy()
    end = pw.host_memory_stats()
    assert end["in_use_bytes"] == start["in_use_bytes"]
    assert end["hits"] + end["misses"] - start["hits"] - start["misses"] == 38
    assert end["cached_bytes"] <= 2 * sum(x.nbytes + (4 << 20) for x in wants)  # two threads' worth at most
    assert rss() - start_rss < 2 * sum(x.nbytes for x in wants) + (64 << 20)
    dev.empty_cache()


def test_host_cache_limit(tmp_path):
    """PYWGTRAIN_HOST_CACHE_MIB bounds the idle bytes kept: blocks past it are unmapped."""
    import os
    import subprocess
    import sys

    code = (
        "import gc, numpy as np, pywgtrain as pw\n"
        "t = pw.tensor(np.ones(1 << 20, np.float32))\n"
        "arrays = [t.numpy() for _ in range(3)]\n"
        "del arrays; gc.collect()\n"
        "s = pw.host_memory_stats()\n"
        "assert s['limit_bytes'] == 8 << 20 and s['cached_bytes'] == 8 << 20 and s['in_use_bytes'] == 0, s\n"
        "print('ok')\n"
    )
    env = dict(os.environ, PYWGTRAIN_HOST_CACHE_MIB="8")
    # From tmp_path: run from the checkout, -c would import the sources, which have no extension.
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# -- downloads leave the device to other threads while they wait --------------------


@pytest.mark.parametrize("ring", ["whole", "chunked"])
def test_recording_proceeds_while_a_download_waits(dev, small, rng, ring):
    """Thread A reads a tensor whose download waits 1.5 s for the GPU; thread
    B meanwhile records (and submits) ops on the same device and finishes
    before A's read returns; both results are right. "whole": the read fits
    the staging ring (every chunk submitted at once, the map waits left
    unlocked); "chunked": more chunks than slots (the wait for earlier work
    is left unlocked, the chunks then run locked). The wait is stretched by
    a test hook: on lavapipe a submission blocks while earlier work runs, so
    real GPU work would stall A's own submission rather than its wait."""
    import threading

    d = dev if ring == "whole" else small
    n = 4099 if ring == "whole" else (2 * SLOTS + 1) * CHUNK // 4 + 3
    x = rng.standard_normal(n).astype(np.float32)
    t = pw.tensor(x, d)
    acc = pw.tensor(np.zeros(33, np.float32), d)
    d.synchronize()
    started, read_done = threading.Event(), threading.Event()
    result, errors = {}, []

    def reader():
        try:
            doubled = t * 2.0  # recorded work the read must see
            started.set()
            result["y"] = doubled.numpy()
            read_done.set()
        except Exception as e:  # a thread's exception would only be printed
            errors.append(e)
            started.set()

    _core._inject_download_delay(1500)
    try:
        a = threading.Thread(target=reader)
        a.start()
        started.wait()
        for _ in range(N_OPS):  # past Device.BATCH_SUBMIT_COMMANDS: submits too
            acc = acc + 1.0
        overlapped = not read_done.is_set()
        a.join()
    finally:
        _core._inject_download_delay(0)
    assert not errors, errors
    np.testing.assert_array_equal(result["y"], x * np.float32(2.0))
    np.testing.assert_array_equal(acc.numpy(), np.full(33, N_OPS, np.float32))
    assert overlapped, "the recording waited for the download"


def test_chunked_reads_are_one_snapshot(small, rng):
    """A read of more chunks than slots, while another thread keeps adding 1
    to the tensor read: every element comes from the same state (x + k)."""
    import threading

    n = (4 * SLOTS + 1) * CHUNK // 4
    x = np.zeros(n, np.float32)
    t = pw.tensor(x, small)
    stop, errors = threading.Event(), []

    def writer():
        try:
            while not stop.is_set():
                t.add_(1.0)
                small.flush()
        except Exception as e:  # a thread's exception would only be printed
            errors.append(e)

    w = threading.Thread(target=writer)
    w.start()
    try:
        reads = [t.numpy() for _ in range(10)]
    finally:
        stop.set()
        w.join()
    assert not errors, errors
    for r in reads:
        assert r.min() == r.max(), (r.min(), r.max())
