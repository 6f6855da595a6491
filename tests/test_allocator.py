"""The caching allocator (csrc/buffer_cache.hpp): memory a tensor let go is
reused, but never while recorded, unsubmitted work may still read it, and
never while a captured step graph binds it; its statistics, empty_cache(), and
the retry after the driver refuses. conftest.py poisons reused memory with NaN
(PYWGTRAIN_POISON_CACHED), so a reuse too early shows as wrong values."""

import gc
import threading

import numpy as np
import pytest

import pywgtrain as pw
from pywgtrain import _core
from pywgtrain.train import Trainer

from helpers import eager_step, run_threads


def _stats(dev):
    dev.synchronize()
    return dev.memory_stats()


@pytest.fixture
def no_gc():
    """Byte counts compared exactly: no collection of earlier tests' garbage
    (tensors, graphs) may free memory in between."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


def test_memory_let_go_is_reused(dev, rng):
    shape = (37, 129)
    x = pw.tensor(rng.standard_normal(shape).astype(np.float32), dev)
    del x
    before = _stats(dev)
    data = rng.standard_normal(shape).astype(np.float32)
    y = pw.tensor(data, dev)
    after = dev.memory_stats()
    assert after["cache_hits"] == before["cache_hits"] + 1
    assert after["driver_allocations"] == before["driver_allocations"]
    np.testing.assert_array_equal(y.numpy(), data)


def test_block_sizes_are_size_classes(dev, no_gc):
    """Blocks are multiples of 512 bytes up to 1 MiB and of an eighth of the
    power of two below the size above it: a request may use a block at most
    12.5% larger (1 MiB and 512 bytes below them)."""
    before = _stats(dev)["allocated_bytes"]
    for n, block in [(1, 512), (129, 1024), (262_145, 1_048_576 + 131_072), (300_000, 1_048_576 + 262_144)]:
        t = pw.empty((n,), device=dev)
        assert dev.memory_stats()["allocated_bytes"] - before == block, n
        del t
        dev.synchronize()


def test_memory_read_by_unsubmitted_work_waits(dev, rng):
    """Inside a batch, x's read is recorded and not submitted when x goes: a
    same-sized upload must not land in x's memory before that read runs."""
    a = rng.standard_normal((64, 33)).astype(np.float32)
    other = rng.standard_normal((64, 33)).astype(np.float32)
    with dev.batch():
        x = pw.tensor(a, dev)
        y = x * 2.0
        del x
        z = pw.tensor(other, dev)
        w = z + 1.0
    np.testing.assert_array_equal(y.numpy(), a * 2.0)
    np.testing.assert_array_equal(w.numpy(), other + 1.0)


def test_memory_read_by_another_threads_batch_waits(dev, rng):
    """Thread A records a read of x and lets x go; thread B meanwhile uploads a
    same-sized tensor and submits before A does."""
    a = rng.standard_normal((48, 48)).astype(np.float32)
    other = rng.standard_normal((48, 48)).astype(np.float32)
    recorded, uploaded = threading.Event(), threading.Event()
    out = {}

    def thread_a():
        with dev.batch():
            x = pw.tensor(a, dev)
            out["y"] = x.exp()
            del x
            recorded.set()
            uploaded.wait(30)
        out["y_host"] = out["y"].numpy()

    def thread_b():
        recorded.wait(30)
        z = pw.tensor(other, dev)
        out["z_host"] = (z * 1.0).numpy()
        uploaded.set()

    run_threads([thread_a, thread_b], timeout=60)
    np.testing.assert_allclose(out["y_host"], np.exp(a.astype(np.float64)), rtol=1e-6)
    np.testing.assert_array_equal(out["z_host"], other)


def test_program_churn_matches_numpy(dev):
    """Random programs that drop tensors mid-batch and read some back midway:
    every value against NumPy in float64."""
    rng = np.random.default_rng(5)
    shapes = [(1,), (7,), (33, 5), (129,), (16, 16)]
    for _ in range(30):
        live = {}
        with dev.batch():
            for _ in range(40):
                shape = shapes[rng.integers(len(shapes))]
                key = rng.integers(6)
                kind = rng.integers(4)
                if kind == 0 or key not in live or live[key][1].shape != shape:
                    data = rng.standard_normal(shape).astype(np.float32)
                    live[key] = (pw.tensor(data, dev), data.astype(np.float64))
                elif kind == 1:
                    t, ref = live[key]
                    live[key] = (t * 3.0 + 1.0, ref * 3.0 + 1.0)
                elif kind == 2:
                    t, ref = live.pop(key)
                    del t  # its memory goes back (after this batch's work is queued)
                else:
                    t, ref = live[key]
                    np.testing.assert_allclose(t.numpy(), ref, rtol=1e-5, atol=1e-5)
        for t, ref in live.values():
            np.testing.assert_allclose(t.numpy(), ref, rtol=1e-5, atol=1e-5)


class _Net(pw.nn.Module):
    def __init__(self, dev):
        super().__init__()
        rng = np.random.default_rng(0)
        self.a = pw.nn.Linear(6, 16, device=dev, rng=rng, activation="relu")
        self.b = pw.nn.Linear(16, 3, device=dev, rng=rng)

    def forward(self, x):
        return self.b(self.a(x))


def _train_with_churn(dev, trainer):
    """Losses of 8 steps, allocating tensors of known values after each; those tensors."""
    data = np.random.default_rng(1)
    batches = [(data.standard_normal((8, 6)).astype(np.float32), data.integers(0, 3, 8)) for _ in range(8)]
    model = _Net(dev)
    opt = pw.optim.AdamW(model.parameters(), lr=1e-2)
    loss_fn = pw.nn.CrossEntropyLoss()
    tr = Trainer(model, opt, loss_fn) if trainer else None
    kept, losses = [], []
    for i, (x, y) in enumerate(batches):
        if tr is not None:
            losses.append(tr.step(x, y).item())
        else:
            losses.append(eager_step(dev, model, opt, loss_fn, x, y).item())
        for shape in [(8, 16), (8, 3), (8, 6), (16, 6), (3, 16), (16,), (3,), (1,)]:
            kept.append((pw.full(shape, float(i), device=dev), float(i)))
    return losses, kept


def test_captured_graph_memory_is_never_handed_out(dev):
    """After capture the graph's intermediates have no tensors left, but it
    still binds them: tensors allocated between replays (of the activations'
    sizes, holding known values) must keep their values, and training must
    match the eager loop's."""
    eager, _ = _train_with_churn(dev, trainer=False)
    replayed, kept = _train_with_churn(dev, trainer=True)
    for t, value in kept:
        np.testing.assert_array_equal(t.numpy(), np.full(t.shape, value, np.float32))
    np.testing.assert_allclose(replayed, eager, rtol=1e-5)


def test_graph_memory_is_counted_and_cached_when_the_graph_goes(dev, no_gc):
    data = np.random.default_rng(2)
    x, y = data.standard_normal((8, 6)).astype(np.float32), data.integers(0, 3, 8)
    gc.collect()
    before = _stats(dev)
    model = _Net(dev)
    tr = Trainer(model, pw.optim.AdamW(model.parameters(), lr=1e-2), pw.nn.CrossEntropyLoss())
    for _ in range(3):  # eager, capture, replay
        tr.step(x, y).item()
    held = _stats(dev)
    assert held["graph_bytes"] > before["graph_bytes"]  # the graph's intermediates, which no tensor uses now
    cached = held["cached_bytes"]
    del tr
    gc.collect()
    after = _stats(dev)
    assert after["graph_bytes"] == before["graph_bytes"]
    assert after["cached_bytes"] >= cached + held["graph_bytes"] - before["graph_bytes"]  # and its own tensors


def test_stats_and_empty_cache(dev, rng, no_gc):
    start = _stats(dev)
    assert start["reserved_bytes"] == start["allocated_bytes"] + start["cached_bytes"] + start["graph_bytes"]
    ts = [pw.tensor(rng.standard_normal((1000, 70 + i)).astype(np.float32), dev) for i in range(4)]
    held = _stats(dev)
    assert held["allocated_bytes"] >= start["allocated_bytes"] + sum(t.nbytes for t in ts)
    assert held["peak_allocated_bytes"] >= held["allocated_bytes"]
    del ts
    freed = _stats(dev)
    assert freed["allocated_bytes"] == start["allocated_bytes"]
    assert freed["cached_bytes"] >= held["allocated_bytes"] - start["allocated_bytes"]
    buffers = dev.resource_report()["buffers"]
    released = dev.empty_cache()
    assert released == freed["cached_bytes"]
    after = dev.memory_stats()
    assert after["cached_bytes"] == 0
    assert after["reserved_bytes"] == after["allocated_bytes"] + after["graph_bytes"]
    assert dev.resource_report()["buffers"] < buffers
    dev.memory_stats(reset_peak=True)
    assert dev.memory_stats()["peak_reserved_bytes"] == after["reserved_bytes"]


def test_driver_refusal_empties_the_cache_and_retries(dev, rng):
    t = pw.empty((5000,), device=dev)
    del t
    assert _stats(dev)["cached_bytes"] > 0
    data = rng.standard_normal(7777).astype(np.float32)  # a size class nothing cached has
    _core._inject_allocation_failures("<driver>", 0, 1)
    try:
        x = pw.tensor(data, dev)
    finally:
        _core._inject_allocation_failures("", 0, 0)
    assert dev.memory_stats()["cached_bytes"] == 0
    np.testing.assert_array_equal(x.numpy(), data)


def test_driver_refusal_with_nothing_cached_raises(dev, no_gc):
    dev.synchronize()
    dev.empty_cache()
    before = dev.memory_stats()
    _core._inject_allocation_failures("<driver>", 0, 2)
    try:
        with pytest.raises(pw.OutOfMemoryError, match="injected driver failure"):
            pw.empty((6007,), device=dev)
    finally:
        _core._inject_allocation_failures("", 0, 0)
    assert dev.memory_stats()["allocated_bytes"] == before["allocated_bytes"]
