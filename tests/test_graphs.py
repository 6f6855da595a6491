"""pywgtrain.Graph / pywgtrain.graph: capture once, replay with tensors rebound."""

import numpy as np
import pytest

import pywgtrain as pw
import pywgtrain.nn.functional as F


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def mlp_step(x, w1, b1, w2):
    """A forward and backward: the loss and the leaves' gradients."""
    h = F.gelu(F.linear(x, w1, b1))
    loss = ((h @ w2) ** 2).mean()
    loss.backward()
    return loss


def leaves(dev, rng):
    return [pw.tensor(rand(rng, *s), dev, requires_grad=True) for s in ((24, 12), (24,), (24, 5))]


def test_replay_with_rebound_inputs_equals_eager(dev, rng):
    w1, b1, w2 = leaves(dev, rng)
    static_x = pw.tensor(rand(rng, 7, 12), dev)
    g = pw.Graph()
    with pw.graph(g, dev):
        static_loss = mlp_step(static_x, w1, b1, w2)
    assert len(g) > 3
    captured_grads = [p.grad for p in (w1, b1, w2)]  # the replays write these (a fresh backward's)
    for _ in range(3):
        x = rand(rng, 7, 12)
        for p in (w1, b1, w2):
            p.grad = None
        want = mlp_step(pw.tensor(x, dev), w1, b1, w2).item()
        want_grads = [p.grad.numpy() for p in (w1, b1, w2)]
        loss = pw.empty((), device=dev)
        g.replay({static_x: x, static_loss: loss})
        assert loss.item() == want
        for got, ref in zip(captured_grads, want_grads):
            np.testing.assert_array_equal(got.numpy(), ref)


def test_replay_reads_static_inputs_written_in_place(dev, rng):
    """torch.cuda.graphs' pattern: copy new data into the captured input, replay, read the captured output."""
    static_x = pw.tensor(rand(rng, 5, 3), dev)
    g = pw.Graph()
    with pw.graph(g, dev):
        out = (static_x * 2.0).exp().sum(1)
    for _ in range(2):
        x = rand(rng, 5, 3)
        static_x.copy_(x)
        g.replay()
        np.testing.assert_allclose(out.numpy(), np.exp(2.0 * x.astype(np.float64)).sum(1), rtol=1e-5)


def test_replay_in_a_batch_keeps_order(dev, rng):
    a = pw.tensor(rand(rng, 9), dev)
    g = pw.Graph()
    with pw.graph(g, dev):
        b = a + 1.0
    with dev.batch():
        a.copy_(pw.tensor(np.zeros(9, np.float32), dev))  # recorded before the replay
        g.replay()
        c = b * 3.0  # recorded after it
    np.testing.assert_array_equal(c.numpy(), np.full(9, 3.0, np.float32))


def test_dropout_draws_new_masks_on_every_replay(dev, rng):
    x = pw.tensor(np.ones((64, 64), np.float32), dev)
    g = pw.Graph()
    with pw.graph(g, dev):
        y = F.dropout(x, 0.5, training=True)
    first = y.numpy()
    g.replay()
    second = y.numpy()
    assert set(np.unique(first)) <= {0.0, 2.0} and set(np.unique(second)) <= {0.0, 2.0}
    assert (first != second).any()


def test_host_read_inside_capture_raises_after_running_the_block(dev, rng):
    x = rand(rng, 4)
    t = pw.tensor(x, dev)
    g = pw.Graph()
    with pytest.raises(pw.CaptureError, match="test_graphs.py") as info:
        with pw.graph(g, dev):
            s = (t * 2.0).sum()
            s.item()
            u = t + 1.0
    assert "test_graphs.py" in info.value.where
    np.testing.assert_allclose(u.numpy(), x + 1.0)  # the block ran in order
    with pytest.raises(RuntimeError, match="nothing captured"):
        g.replay()


def test_an_error_in_the_block_discards_it_and_keeps_the_graph(dev, rng):
    t = pw.tensor(rand(rng, 4), dev)
    g = pw.Graph()
    with pw.graph(g, dev):
        out = t + 1.0
    n = len(g)
    with pytest.raises(ValueError, match="boom"):
        with pw.graph(g, dev):
            lost = t * 5.0
            raise ValueError("boom")
    assert len(g) == n
    with pytest.raises(RuntimeError, match="never ran"):
        lost.numpy()
    g.replay()
    np.testing.assert_allclose(out.numpy(), t.numpy() + 1.0)


def test_bad_arguments_are_refused(dev, rng):
    t = pw.tensor(rand(rng, 4, 6), dev)
    g = pw.Graph()
    with pytest.raises(TypeError, match="pywgtrain.Graph"):
        with pw.graph("g", dev):
            pass
    with dev.batch():
        with pytest.raises(RuntimeError, match="inside a Device.batch"):
            with pw.graph(g, dev):
                pass
    with pw.graph(g, dev):
        out = t * 2.0
    with pytest.raises(TypeError, match="keys must be captured Tensors"):
        g.replay({"x": t})
    with pytest.raises(TypeError, match="Tensors or NumPy arrays"):
        g.replay({t: [1.0]})
    with pytest.raises(ValueError, match=r"shape \(6, 4\) and dtype float32 for a captured tensor of shape \(4, 6\)"):
        g.replay({t: rand(rng, 6, 4)})
    with pytest.raises(ValueError, match="dtype float64"):
        g.replay({t: rand(rng, 4, 6).astype(np.float64)})
    with pytest.raises(ValueError, match="strided view"):
        g.replay({t: pw.tensor(rand(rng, 6, 4), dev).T})
    with pytest.raises(ValueError, match="C-contiguous"):
        g.replay({t: np.asfortranarray(rand(rng, 4, 6))})
    other = pw.Device()
    with pytest.raises(ValueError, match="lives on"):
        g.replay({t: pw.tensor(rand(rng, 4, 6), other)})
    new_out = pw.empty((4, 6), device=dev)
    x = rand(rng, 4, 6)
    g.replay({t: x, out: new_out})  # after the refusals the graph still works
    np.testing.assert_array_equal(new_out.numpy(), 2.0 * x)


def test_profile_times_every_captured_kernel(dev, rng):
    if "timestamp-query" not in dev.features:
        pytest.skip("the adapter has no timestamp queries")
    x = pw.tensor(rand(rng, 64, 32), dev)
    w = pw.tensor(rand(rng, 16, 32), dev)
    g = pw.Graph()
    with pytest.raises(RuntimeError, match="nothing captured"):
        g.profile()
    with pw.graph(g, dev):
        F.linear(x, w, None, "relu").sum()
    names = g.kernel_names()
    assert len(names) == len(g) >= 2
    prof = g.profile(reps=2)
    assert prof["dispatches"] == len(g)
    assert prof["gpu_us"] > 0 and prof["sum_of_dispatches_us"] > 0
    assert sorted(k["kernel"] for k in prof["kernels"]) == sorted(set(names))
    assert sum(k["count"] for k in prof["kernels"]) == len(names)


def test_zero_of_every_dtype_is_captured_and_replayed(dev, rng):
    """zero_() records a fill kernel for float32, float16 (odd sizes too) and int32, so a captured
    graph holds it and each replay zeroes again."""
    ts = [
        pw.tensor(rand(rng, 7), dev),
        pw.tensor(rand(rng, 33).astype(np.float16), dev),
        pw.tensor(rng.integers(1, 100, 9).astype(np.int32), dev),
    ]
    g = pw.Graph()
    with pw.graph(g, dev):
        for t in ts:
            t.zero_()
    for _ in range(2):
        for t in ts:
            t.copy_(np.full(t.shape, 5, t.dtype))
        g.replay()
        for t in ts:
            got = t.numpy()
            assert got.dtype == t.dtype and np.all(got == 0) and not np.signbit(got.astype(np.float64)).any()
