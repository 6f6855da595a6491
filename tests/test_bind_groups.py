"""The bind-group cache (csrc/bind_group_cache.hpp): dispatches that bind the
same memory share a group (uniform blocks at a dynamic offset), and one that
binds anything else gets its own; freed, reused and released memory, graphs,
threads, the bound. conftest.py poisons reused memory with NaN, so a stale
group binding the wrong memory shows as wrong values."""

import numpy as np

import pywgtrain as pw

from helpers import rand, switched_device, run_threads


def _groups(dev):
    s = dev.memory_stats()
    return s["bind_group_hits"], s["bind_group_misses"], s["bind_groups_cached"]


def test_same_kernel_on_the_same_memory_hits(rng):
    dev = pw.Device()  # its own: blocks cached by earlier tests would change which block comes back
    a, b = rand(rng, 7, 33), rand(rng, 7, 33)
    x, y = pw.tensor(a, dev), pw.tensor(b, dev)
    # The output block of a result let go comes back: from then on every dispatch hits.
    for _ in range(2):
        (x + y).numpy()
    h0, m0, _ = _groups(dev)
    for _ in range(4):
        np.testing.assert_array_equal((x + y).numpy(), a + b)
    h1, m1, _ = _groups(dev)
    assert (h1 - h0, m1 - m0) == (4, 0)


def test_uniform_blocks_change_within_one_group(rng):
    dev = pw.Device()  # its own: blocks cached by earlier tests would change which block comes back
    """Same buffers, different scalars: one group, each dispatch its own block."""
    a = rand(rng, 129)
    x = pw.tensor(a, dev)
    for _ in range(2):
        (x + 0.0).numpy()
    h0, m0, _ = _groups(dev)
    for s in (1.0, -2.5, 7.0, 0.25):
        np.testing.assert_array_equal((x + s).numpy(), a + np.float32(s))
    h1, m1, _ = _groups(dev)
    assert (h1 - h0, m1 - m0) == (4, 0)
    with dev.batch():  # several blocks of one recording, each at its own offset
        outs = [x * s for s in (1.0, 2.0, 3.0)]
    for s, t in zip((1.0, 2.0, 3.0), outs):
        np.testing.assert_array_equal(t.numpy(), a * np.float32(s))


def test_other_buffers_and_offsets_miss_and_compute_right(dev, rng):
    a = rand(rng, 33, 64)
    base = pw.tensor(a, dev)
    y = pw.tensor(rand(rng, 64), dev)
    (base[0] + y).numpy()
    _, m0, _ = _groups(dev)
    rows = [base[i] + y for i in (1, 7, 32)]  # the same kernel on views at other offsets
    _, m1, _ = _groups(dev)
    assert m1 - m0 >= 3
    for i, t in zip((1, 7, 32), rows):
        np.testing.assert_array_equal(t.numpy(), a[i] + y.numpy())
    others = [pw.tensor(rand(rng, 64), dev) for _ in range(3)]
    for o in others:
        np.testing.assert_array_equal((base[1] + o).numpy(), a[1] + o.numpy())


def test_memory_freed_and_reused_by_a_new_tensor(monkeypatch, rng):
    """A new tensor in a freed block is that block: the group that bound it is right for it."""
    dev = switched_device(monkeypatch)  # an allocator of its own: which block comes back is known
    a, b, c = rand(rng, 7, 129), rand(rng, 7, 129), rand(rng, 7, 129)
    y = pw.tensor(b, dev)
    x = pw.tensor(a, dev)
    z = x + y
    np.testing.assert_array_equal(z.numpy(), a + b)
    del x
    before = dev.memory_stats()
    x2 = pw.tensor(c, dev)  # takes the block x let go
    del z  # and the result the block z let go: the same three buffers
    z2 = x2 + y
    after = dev.memory_stats()
    assert after["cache_hits"] == before["cache_hits"] + 2
    assert (after["bind_group_hits"], after["bind_group_misses"]) == (
        before["bind_group_hits"] + 1,
        before["bind_group_misses"],
    )
    np.testing.assert_array_equal(z2.numpy(), c + b)


def test_empty_cache_drops_the_groups_of_released_memory(monkeypatch, rng):
    dev = switched_device(monkeypatch)
    a, b = rand(rng, 5, 1000), rand(rng, 5, 1000)
    y = pw.tensor(b, dev)
    x = pw.tensor(a, dev)
    np.testing.assert_array_equal((x + y).numpy(), a + b)
    del x
    dev.synchronize()
    _, _, cached = _groups(dev)
    assert dev.empty_cache() > 0
    _, _, after = _groups(dev)
    assert after < cached
    x = pw.tensor(b, dev)  # new memory, maybe at a released handle's address
    np.testing.assert_array_equal((x + y).numpy(), b + b)


def test_graph_replays_rebind_through_the_cache(rng):
    dev = pw.Device()  # its own: blocks cached by earlier tests would change which block comes back
    static_x = pw.tensor(rand(rng, 9, 33), dev)
    w = pw.tensor(rand(rng, 9, 33), dev)
    g = pw.Graph()
    with pw.graph(g, dev):
        out = (static_x * w + 1.0).sum(1)
    xs = [rand(rng, 9, 33) for _ in range(4)]
    sources = [pw.tensor(x, dev) for x in xs[:2]]
    for i, x in enumerate(xs):
        g.replay({static_x: sources[i % 2]})
        ref = (x.astype(np.float64) * w.numpy() + 1.0).sum(1) if i < 2 else None
        if ref is not None:
            np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)
    h0, m0, _ = _groups(dev)
    for i in range(4):  # rebound to tensors seen before: no new groups
        g.replay({static_x: sources[i % 2]})
        ref = (xs[i % 2].astype(np.float64) * w.numpy() + 1.0).sum(1)
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)
    h1, m1, _ = _groups(dev)
    assert m1 == m0 and h1 > h0
    g.replay()  # the captured groups, static_x's own data
    ref = (static_x.numpy().astype(np.float64) * w.numpy() + 1.0).sum(1)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)


def test_threads_share_the_cache(dev, rng):
    data = [(rand(rng, 33, 7), rand(rng, 33, 7)) for _ in range(4)]
    errors = []

    def work(a, b):
        try:
            x, y = pw.tensor(a, dev), pw.tensor(b, dev)
            for s in range(20):
                np.testing.assert_array_equal((x * y + float(s)).numpy(), a * b + np.float32(s))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    run_threads([lambda d=d: work(*d) for d in data])
    assert not errors, errors


def test_the_cache_is_bounded_and_can_be_off(monkeypatch, rng):
    small = switched_device(monkeypatch, PYWGTRAIN_BIND_GROUP_CACHE="3")
    a = rand(rng, 7)
    xs = [pw.tensor(a + i, small) for i in range(8)]
    y = pw.tensor(a, small)
    outs = [x + y for x in xs]  # eight distinct groups
    assert _groups(small)[2] == 3
    for i, t in enumerate(outs):
        np.testing.assert_array_equal(t.numpy(), (a + i) + a)
    off = switched_device(monkeypatch, PYWGTRAIN_BIND_GROUP_CACHE="0")
    x = pw.tensor(a, off)
    for _ in range(3):
        np.testing.assert_array_equal((x + x).numpy(), a + a)
    hits, misses, cached = _groups(off)
    assert (hits, cached) == (0, 0) and misses >= 3
