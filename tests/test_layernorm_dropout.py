"""Fused LayerNorm (layernorm.wgsl) against float64 torch. Raw kernels write
into NaN-poisoned outputs so unwritten elements show."""
import re

import numpy as np
import pytest

import pywgtrain as pw
from pywgtrain import _core
from pywgtrain.nn import functional as F
from conftest import poisoned, rand

torch = pytest.importorskip("torch")
tF = torch.nn.functional

SIZES = [1, 7, 33, 129, 384, 768, 1000, 4099]


def T(dev, a):
    return pw.tensor(np.ascontiguousarray(a), dev)


def run(dev, fn, *args):
    with dev._recording() as rec:
        fn(rec, *args)


def close(actual, expected, rtol=1e-4, atol=1e-5):
    """float32 vs float64: atol scales with the reference's magnitude, at least 1
    (sums that are 0 in exact arithmetic come out as rounding noise in both)."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert np.all(np.isfinite(actual)), "non-finite values in the result (unwritten or poisoned elements)"
    scale = max(float(np.max(np.abs(expected))), 1.0)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol * scale)


def binding_floats(dev):
    return dev.limits["max_storage_buffer_binding_size"] // 4


# ================================================================ LayerNorm

def torch_ln(x, w, b, dy, eps=1e-5):
    """float64 torch: y, mean, rstd, dx, dw, db."""
    xt = torch.from_numpy(x.astype(np.float64)).requires_grad_()
    wt = None if w is None else torch.from_numpy(w.astype(np.float64)).requires_grad_()
    bt = None if b is None else torch.from_numpy(b.astype(np.float64)).requires_grad_()
    y = tF.layer_norm(xt, (x.shape[-1],), wt, bt, eps)
    y.backward(torch.from_numpy(dy.astype(np.float64)))
    x64 = x.astype(np.float64)
    mean = x64.mean(-1)
    rstd = 1.0 / np.sqrt(x64.var(-1) + eps)
    grad = lambda t: None if t is None else t.grad.numpy()  # noqa: E731
    return y.detach().numpy(), mean, rstd, xt.grad.numpy(), grad(wt), grad(bt)


def raw_ln(dev, x, w, b, dy, eps=1e-5, grads=("dx", "dw", "db")):
    """The raw kernels into NaN-poisoned outputs: y, mean, rstd, dx, dw, db (None where not asked)."""
    rows, cols = x.shape
    tx, tdy = T(dev, x), T(dev, dy)
    tw = None if w is None else T(dev, w)
    tb = None if b is None else T(dev, b)
    y, mean, rstd = poisoned(dev, (rows, cols)), poisoned(dev, rows), poisoned(dev, rows)
    run(dev, _core.layer_norm_forward, tx._buf, None if tw is None else tw._buf, None if tb is None else tb._buf,
        y._buf, mean._buf, rstd._buf, rows, cols, eps)
    dx = poisoned(dev, (rows, cols)) if "dx" in grads else None
    dw = poisoned(dev, cols) if "dw" in grads else None
    db = poisoned(dev, cols) if "db" in grads else None
    buf = lambda t: None if t is None else t._buf  # noqa: E731
    run(dev, _core.layer_norm_backward, tx._buf, buf(tw), mean._buf, rstd._buf, tdy._buf, buf(dx), buf(dw), buf(db),
        rows, cols, 0.0, 0.0, 0.0)
    read = lambda t: None if t is None else t.numpy()  # noqa: E731
    return y.numpy(), mean.numpy(), rstd.numpy(), read(dx), read(dw), read(db)


def check_ln(got, ref, skip=()):
    names = ("y", "mean", "rstd", "dx", "dw", "db")
    for name, a, e in zip(names, got, ref):
        if name in skip or a is None or e is None:
            continue
        try:
            if name == "mean":
                close(a, e, rtol=1e-6, atol=1e-6)
            else:
                close(a, e)
        except AssertionError as err:
            raise AssertionError(f"{name}: {err}") from None


@pytest.mark.parametrize("rows", SIZES)
@pytest.mark.parametrize("cols", SIZES)
def test_layer_norm_affine(dev, rng, rows, cols):
    x, dy = rand(rng, rows, cols), rand(rng, rows, cols)
    w, b = rand(rng, cols), rand(rng, cols)
    check_ln(raw_ln(dev, x, w, b, dy), torch_ln(x, w, b, dy))


@pytest.mark.parametrize("rows,cols", [(1, 1), (7, 33), (129, 7), (33, 384), (1000, 768), (4099, 129), (7, 4099)])
def test_layer_norm_no_affine(dev, rng, rows, cols):
    x, dy = rand(rng, rows, cols), rand(rng, rows, cols)
    got = raw_ln(dev, x, None, None, dy, grads=("dx",))
    check_ln(got, torch_ln(x, None, None, dy))


def test_layer_norm_wide_rows(dev, rng):
    """300,007 columns: 1,172 strided trips per thread and pass (well inside lavapipe's loop limit)."""
    rows, cols = 3, 300_007
    x, dy, w, b = rand(rng, rows, cols), rand(rng, rows, cols), rand(rng, cols), rand(rng, cols)
    check_ln(raw_ln(dev, x, w, b, dy), torch_ln(x, w, b, dy))


@pytest.mark.parametrize("which", ["weight_only", "bias_only"])
def test_layer_norm_weight_or_bias_only(dev, rng, which):
    rows, cols = 33, 129
    x, dy = rand(rng, rows, cols), rand(rng, rows, cols)
    w = rand(rng, cols) if which == "weight_only" else None
    b = rand(rng, cols) if which == "bias_only" else None
    grads = ("dx", "dw") if w is not None else ("dx", "db")
    check_ln(raw_ln(dev, x, w, b, dy, grads=grads), torch_ln(x, w, b, dy))


@pytest.mark.parametrize("grads", [("dx",), ("dw",), ("db",), ("dw", "db")])
def test_layer_norm_backward_subsets(dev, rng, grads):
    """Any subset of dx, dweight, dbias (a frozen input, frozen parameters)."""
    rows, cols = 129, 33
    x, dy, w, b = rand(rng, rows, cols), rand(rng, rows, cols), rand(rng, cols), rand(rng, cols)
    got = raw_ln(dev, x, w, b, dy, grads=grads)
    assert [g is not None for g in got[3:]] == [n in grads for n in ("dx", "dw", "db")]
    check_ln(got, torch_ln(x, w, b, dy))


@pytest.mark.parametrize("offset", [1e4, 1e6])
@pytest.mark.parametrize("cols", [33, 768, 4099])
def test_layer_norm_large_mean(dev, rng, offset, cols):
    """Rows far from zero (|mean| >> std): statistics around a shift and the backward's recentring
    keep float32 accuracy relative to the spread, not to the mean (E[x^2] - E[x]^2 would lose it all)."""
    rows = 65
    x = (offset + rng.standard_normal((rows, cols))).astype(np.float32)
    dy, w, b = rand(rng, rows, cols), rand(rng, cols), rand(rng, cols)
    got, ref = raw_ln(dev, x, w, b, dy), torch_ln(x, w, b, dy)
    check_ln(got, ref, skip=("mean",))
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-7)  # the saved mean: float32 rounding of the true one


def test_layer_norm_constant_rows(dev, rng):
    """Zero variance: rstd = 1/sqrt(eps), xhat = 0: y = bias and dweight = 0 exactly, dx = rstd * (g - mean(g))."""
    rows, cols = 5, 129
    x = np.repeat(rng.standard_normal((rows, 1)).astype(np.float32) * 100, cols, 1)
    dy, w, b = rand(rng, rows, cols), rand(rng, cols), rand(rng, cols)
    y, mean, rstd, dx, dw, db = raw_ln(dev, x, w, b, dy, eps=1e-5)
    np.testing.assert_array_equal(y, np.broadcast_to(b, (rows, cols)))
    np.testing.assert_array_equal(dw, 0)
    np.testing.assert_allclose(rstd, 1 / np.sqrt(1e-5), rtol=1e-6)
    close(dx, torch_ln(x, w, b, dy)[3])


def test_layer_norm_eps(dev, rng):
    rows, cols = 7, 33
    x, dy = rand(rng, rows, cols) * 0.01, rand(rng, rows, cols)
    check_ln(raw_ln(dev, x, None, None, dy, eps=0.1, grads=("dx",)), torch_ln(x, None, None, dy, eps=0.1))


def test_layer_norm_backward_accumulates(dev, rng):
    """beta = 1 adds to what dx / dweight / dbias hold; each has its own beta."""
    rows, cols = 1000, 384
    x, dy, w, b = rand(rng, rows, cols), rand(rng, rows, cols), rand(rng, cols), rand(rng, cols)
    _, _, _, rdx, rdw, rdb = torch_ln(x, w, b, dy)
    base_x, base_w, base_b = rand(rng, rows, cols), rand(rng, cols), rand(rng, cols)
    tx, tw, tb = T(dev, x), T(dev, w), T(dev, b)
    y, mean, rstd = poisoned(dev, (rows, cols)), poisoned(dev, rows), poisoned(dev, rows)
    run(dev, _core.layer_norm_forward, tx._buf, tw._buf, tb._buf, y._buf, mean._buf, rstd._buf, rows, cols, 1e-5)
    for betas in [(1.0, 1.0, 1.0), (1.0, 0.0, 1.0), (0.0, 1.0, 0.0)]:
        dx, dw = T(dev, base_x), T(dev, base_w)
        db = T(dev, base_b) if betas[2] else poisoned(dev, cols)
        if not betas[1]:
            dw = poisoned(dev, cols)
        if not betas[0]:
            dx = poisoned(dev, (rows, cols))
        run(dev, _core.layer_norm_backward, tx._buf, tw._buf, mean._buf, rstd._buf, T(dev, dy)._buf, dx._buf,
            dw._buf, db._buf, rows, cols, *betas)
        for got, ref, base, beta in ((dx, rdx, base_x, betas[0]), (dw, rdw, base_w, betas[1]),
                                     (db, rdb, base_b, betas[2])):
            close(got.numpy(), ref + beta * base)


def test_layer_norm_parameter_grads_deterministic(dev, rng):
    """The weight and bias gradients are reduced in a fixed order: bit-identical reruns."""
    rows, cols = 4099, 129
    x, dy, w = rand(rng, rows, cols), rand(rng, rows, cols), rand(rng, cols)
    first = raw_ln(dev, x, w, None, dy, grads=("dw",))[4]
    for _ in range(2):
        np.testing.assert_array_equal(raw_ln(dev, x, w, None, dy, grads=("dw",))[4], first)


def test_layer_norm_autograd(dev, rng):
    """F.layer_norm on a 3-d input through autograd: x, weight, bias gradients against torch, and a second
    backward accumulating into the leaves' .grad."""
    shape, cols = (3, 5, 768), 768
    x, dy, w, b = rand(rng, *shape), rand(rng, *shape), rand(rng, cols), rand(rng, cols)
    tx, tw, tb = (pw.tensor(a, dev, requires_grad=True) for a in (x, w, b))
    for k in (1, 2):
        out = F.layer_norm(tx, (cols,), tw, tb)
        out.backward(dy)
        y, _, _, rdx, rdw, rdb = torch_ln(x.reshape(-1, cols), w, b, dy.reshape(-1, cols))
        close(out.numpy(), y.reshape(shape))
        close(tx.grad.numpy(), k * rdx.reshape(shape))
        close(tw.grad.numpy(), k * rdw)
        close(tb.grad.numpy(), k * rdb)
    # only the parameters require grad
    tx2 = pw.tensor(x, dev)
    tw.grad = tb.grad = None
    (F.layer_norm(tx2, cols, tw, tb) * pw.tensor(dy, dev)).sum().backward()
    close(tw.grad.numpy(), rdw)
    close(tb.grad.numpy(), rdb)


def test_layer_norm_module(dev, rng):
    """nn.LayerNorm: parameters named weight / bias, ones / zeros as torch, trained values against torch."""
    cols = 33
    m = pw.nn.LayerNorm(cols, device=dev)
    tm = torch.nn.LayerNorm(cols, dtype=torch.float64)
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in tm.named_parameters()] == ["weight", "bias"]
    np.testing.assert_array_equal(m.weight.numpy(), np.ones(cols, np.float32))
    np.testing.assert_array_equal(m.bias.numpy(), np.zeros(cols, np.float32))
    w, b = rand(rng, cols), rand(rng, cols)
    m.load_state_dict({"weight": w, "bias": b})
    tm.load_state_dict({"weight": torch.from_numpy(w.astype(np.float64)), "bias": torch.from_numpy(b.astype(np.float64))})
    x, dy = rand(rng, 4, 7, cols), rand(rng, 4, 7, cols)
    out = m(pw.tensor(x, dev))
    out.backward(dy)
    tout = tm(torch.from_numpy(x.astype(np.float64)))
    tout.backward(torch.from_numpy(dy.astype(np.float64)))
    close(out.numpy(), tout.detach().numpy())
    close(m.weight.grad.numpy(), tm.weight.grad.numpy())
    close(m.bias.grad.numpy(), tm.bias.grad.numpy())
    assert repr(m) == "LayerNorm((33,), eps=1e-05, elementwise_affine=True)"
    assert list(pw.nn.LayerNorm(8, elementwise_affine=False, device=dev).named_parameters()) == []
    assert [n for n, _ in pw.nn.LayerNorm([8], bias=False, device=dev).named_parameters()] == ["weight"]
    np.testing.assert_allclose(pw.nn.LayerNorm(cols, elementwise_affine=False, eps=0.5, device=dev)(x).numpy(),
                               tF.layer_norm(torch.from_numpy(x.astype(np.float64)), (cols,), eps=0.5).numpy(),
                               rtol=1e-5, atol=1e-5)


def test_layer_norm_in_a_captured_graph(dev, rng):
    """Forward and backward are dispatches only: a step graph replays them on a new input."""
    rows, cols = 33, 129
    x0, x1, dy, w = rand(rng, rows, cols), rand(rng, rows, cols), rand(rng, rows, cols), rand(rng, cols)
    tx, tw, tdy = T(dev, x0), T(dev, w), T(dev, dy)
    y, mean, rstd, dx, dw = (poisoned(dev, s) for s in ((rows, cols), rows, rows, (rows, cols), cols))
    rec = _core._Recorder(dev._dev)
    rec.begin_capture()
    _core.layer_norm_forward(rec, tx._buf, tw._buf, None, y._buf, mean._buf, rstd._buf, rows, cols, 1e-5)
    _core.layer_norm_backward(rec, tx._buf, tw._buf, mean._buf, rstd._buf, tdy._buf, dx._buf, dw._buf, None, rows,
                              cols, 0.0, 0.0, 0.0)
    graph = rec.end_capture()
    rec.submit()
    assert len(graph) == 3
    rec.replay(graph, inputs=[(tx._buf, x1)])
    rec.submit()
    ry, _, _, rdx, rdw, _ = torch_ln(x1, w, None, dy)
    close(y.numpy(), ry)
    close(dx.numpy(), rdx)
    close(dw.numpy(), rdw)


def test_layer_norm_errors(dev):
    x = pw.zeros((3, 4), np.float32, dev)
    w4 = pw.zeros(4, np.float32, dev)
    small = pw.zeros(3, np.float32, dev)
    cases = [
        (lambda: F.layer_norm(x, 3), ValueError, "normalized_shape=[3] expects an input of shape [*, 3], got shape [3, 4]"),
        (lambda: F.layer_norm(x, (3, 4)), ValueError, "only normalization over the last dimension is supported"),
        (lambda: F.layer_norm(x, 4, weight=small), ValueError, "weight has shape (3,), expected normalized_shape (4,)"),
        (lambda: F.layer_norm(x, 4, bias=pw.zeros((1, 4), np.float32, dev)), ValueError, "bias has shape (1, 4)"),
        (lambda: F.layer_norm(np.zeros((3, 4)), 4), TypeError, "input must have dtype float32, got float64"),
        (lambda: F.layer_norm(pw.zeros((3, 4), np.int32, dev), 4), TypeError, "input must be float32, got int32"),
        (lambda: F.layer_norm(x, 4, weight=np.ones(4, np.float64)), TypeError, "weight must have dtype float32"),
        (lambda: F.layer_norm(x, 4, eps=-1.0), ValueError, "eps must be a finite number >= 0"),
        (lambda: F.layer_norm(x, "4"), TypeError, "normalized_shape must hold ints"),
        (lambda: pw.nn.LayerNorm((3, 4)), ValueError, "normalized_shape must be one int >= 1"),
    ]
    for fn, exc, msg in cases:
        with pytest.raises(exc, match=re.escape(msg)):
            fn()
    y, m = pw.zeros((3, 4), np.float32, dev), pw.zeros(3, np.float32, dev)
    raw = [
        (_core.layer_norm_forward, (x._buf, None, None, small._buf, m._buf, m._buf, 3, 4, 1e-5), "output y holds 3"),
        (_core.layer_norm_forward, (x._buf, small._buf, None, y._buf, m._buf, small._buf, 3, 4, 1e-5),
         "layer_norm weight holds 3"),
        (_core.layer_norm_forward, (x._buf, None, None, x._buf, m._buf, small._buf, 3, 4, 1e-5),
         "y shares a GPU buffer with x"),
        (_core.layer_norm_forward, (x._buf, None, None, y._buf, m._buf, small._buf, 0, 4, 1e-5), "must be >= 1"),
        (_core.layer_norm_forward, (x._buf, None, None, y._buf, m._buf, small._buf, 3, 4, -1.0), "eps"),
        (_core.layer_norm_forward, (x._buf, None, None, y._buf, m._buf, small._buf, 1, 2**21 + 1, 1e-5),
         "rows of 2097153 elements exceed the supported 2097152"),
        (_core.layer_norm_backward, (x._buf, None, m._buf, small._buf, y._buf, None, None, None, 3, 4, 0, 0, 0),
         "no gradient requested"),
        (_core.layer_norm_backward, (x._buf, None, m._buf, small._buf, y._buf, None, w4._buf, None, 3, 4, 0, 0, 0),
         "dweight needs the weight"),
        (_core.layer_norm_backward, (x._buf, None, m._buf, small._buf, y._buf, y._buf, None, None, 3, 4, 0, 0, 0),
         "dx shares a GPU buffer with dy"),
        (_core.layer_norm_backward, (x._buf, None, m._buf, small._buf, y._buf, w4._buf, None, None, 3, 4, 0, 0, 0),
         "dx holds 4"),
    ]
    for fn, args, msg in raw:
        with pytest.raises(ValueError, match=re.escape(msg)):
            run(dev, fn, *args)


@pytest.mark.slow
def test_layer_norm_past_binding_limit(dev, rng):
    """x, y, dy, dx larger than one storage binding: row blocks, dweight / dbias accumulated across them."""
    cols = 768
    rows = binding_floats(dev) // cols + 33
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    dy = rng.standard_normal((rows, cols), dtype=np.float32)
    w, b = rand(rng, cols), rand(rng, cols)
    y, mean, rstd, dx, dw, db = raw_ln(dev, x, w, b, dy)
    # float64 reference in row chunks (memory)
    rdw, rdb = np.zeros(cols), np.zeros(cols)
    for r0 in range(0, rows, 8192):
        xs, gs = x[r0:r0 + 8192].astype(np.float64), dy[r0:r0 + 8192].astype(np.float64)
        mu = xs.mean(1, keepdims=True)
        rs = 1 / np.sqrt(xs.var(1, keepdims=True) + 1e-5)
        xh = (xs - mu) * rs
        g = gs * w
        rdx = rs * (g - g.mean(1, keepdims=True) - xh * (g * xh).mean(1, keepdims=True))
        close(y[r0:r0 + 8192], xh * w + b)
        close(mean[r0:r0 + 8192], mu[:, 0], rtol=1e-6, atol=1e-6)
        close(rstd[r0:r0 + 8192], rs[:, 0])
        close(dx[r0:r0 + 8192], rdx)
        rdw += (gs * xh).sum(0)
        rdb += gs.sum(0)
    close(dw, rdw)
    close(db, rdb)

