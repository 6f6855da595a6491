"""Fused LayerNorm (layernorm.wgsl) against float64 torch, and dropout with the
GPU counter-based RNG (dropout.wgsl, pywgtrain.random): masks bit for bit
against a NumPy Philox-4x32-10, statistics, forward/backward agreement, and
determinism under seeding, state restore and step-graph replay. Raw kernels
write into NaN-poisoned outputs so unwritten elements show."""

import re

import numpy as np
import pytest

import pywgtrain as pw
from pywgtrain import _core
from pywgtrain.nn import functional as F
from pywgtrain.train import Trainer
from helpers import poisoned, rand

torch = pytest.importorskip("torch")
tF = torch.nn.functional

SIZES = [1, 7, 33, 129, 384, 768, 1000, 4099]


def T(dev, a):
    return pw.tensor(np.ascontiguousarray(a), dev)


def run(dev, fn, *args):
    with dev._recording() as rec:
        fn(rec, *args)


def close(actual, expected, rtol=1e-4, atol=1e-5, min_scale=1.0):
    """float32 vs float64: atol scales with the reference's magnitude, at least
    ``min_scale`` (sums that are 0 in exact arithmetic come out as rounding noise in both)."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert np.all(np.isfinite(actual)), "non-finite values in the result (unwritten or poisoned elements)"
    scale = max(float(np.max(np.abs(expected))), min_scale)
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
    run(
        dev,
        _core.layer_norm_forward,
        tx._buf,
        None if tw is None else tw._buf,
        None if tb is None else tb._buf,
        y._buf,
        mean._buf,
        rstd._buf,
        rows,
        cols,
        eps,
    )
    dx = poisoned(dev, (rows, cols)) if "dx" in grads else None
    dw = poisoned(dev, cols) if "dw" in grads else None
    db = poisoned(dev, cols) if "db" in grads else None
    buf = lambda t: None if t is None else t._buf  # noqa: E731
    run(
        dev,
        _core.layer_norm_backward,
        tx._buf,
        buf(tw),
        mean._buf,
        rstd._buf,
        tdy._buf,
        buf(dx),
        buf(dw),
        buf(db),
        rows,
        cols,
        0.0,
        0.0,
        0.0,
    )
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
            elif name == "dx":
                # dx = rstd * (terms that cancel): their float32 rounding is
                # amplified by rstd, up to 1/sqrt(eps) = 316 for constant rows
                # (one column), where dx is 0 exactly. A compiler that fuses
                # dy * w - mean into one FMA (the H100's) leaves the product's
                # rounding, up to ulp(|dy * w| ~ 16) / 2 * 316 = 3e-4; seen
                # there: 1.1e-5, and 1.5e-4 at 4099 rows of one column.
                close(a, e, min_scale=max(1.0, float(np.max(ref[2])) / 3))
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


@pytest.mark.parametrize("rows,cols", [(20001, 384), (3, 4096), (300, 4097), (2049, 17)])
def test_layer_norm_backward_paths(dev, rng, rows, cols):
    """Both backward kernels: rows up to 16 * 256 wide keep their columns in registers (several rows
    per slot and several hundred workgroups at 20001 x 384, every thread busy at 4096), wider ones
    take the strided kernel (4097)."""
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
        run(
            dev,
            _core.layer_norm_backward,
            tx._buf,
            tw._buf,
            mean._buf,
            rstd._buf,
            T(dev, dy)._buf,
            dx._buf,
            dw._buf,
            db._buf,
            rows,
            cols,
            *betas,
        )
        for got, ref, base, beta in (
            (dx, rdx, base_x, betas[0]),
            (dw, rdw, base_w, betas[1]),
            (db, rdb, base_b, betas[2]),
        ):
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
    tm.load_state_dict(
        {"weight": torch.from_numpy(w.astype(np.float64)), "bias": torch.from_numpy(b.astype(np.float64))}
    )
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
    np.testing.assert_allclose(
        pw.nn.LayerNorm(cols, elementwise_affine=False, eps=0.5, device=dev)(x).numpy(),
        tF.layer_norm(torch.from_numpy(x.astype(np.float64)), (cols,), eps=0.5).numpy(),
        rtol=1e-5,
        atol=1e-5,
    )


def test_layer_norm_in_a_captured_graph(dev, rng):
    """Forward and backward are dispatches only: a step graph replays them on a new input."""
    rows, cols = 33, 129
    x0, x1, dy, w = rand(rng, rows, cols), rand(rng, rows, cols), rand(rng, rows, cols), rand(rng, cols)
    tx, tw, tdy = T(dev, x0), T(dev, w), T(dev, dy)
    y, mean, rstd, dx, dw = (poisoned(dev, s) for s in ((rows, cols), rows, rows, (rows, cols), cols))
    rec = _core._Recorder(dev._dev)
    rec.begin_capture()
    _core.layer_norm_forward(rec, tx._buf, tw._buf, None, y._buf, mean._buf, rstd._buf, rows, cols, 1e-5)
    _core.layer_norm_backward(
        rec, tx._buf, tw._buf, mean._buf, rstd._buf, tdy._buf, dx._buf, dw._buf, None, rows, cols, 0.0, 0.0, 0.0
    )
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
        (
            lambda: F.layer_norm(x, 3),
            ValueError,
            "normalized_shape=[3] expects an input of shape [*, 3], got shape [3, 4]",
        ),
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
        (
            _core.layer_norm_forward,
            (x._buf, small._buf, None, y._buf, m._buf, small._buf, 3, 4, 1e-5),
            "layer_norm weight holds 3",
        ),
        (
            _core.layer_norm_forward,
            (x._buf, None, None, x._buf, m._buf, small._buf, 3, 4, 1e-5),
            "y shares a GPU buffer with x",
        ),
        (_core.layer_norm_forward, (x._buf, None, None, y._buf, m._buf, small._buf, 0, 4, 1e-5), "must be >= 1"),
        (_core.layer_norm_forward, (x._buf, None, None, y._buf, m._buf, small._buf, 3, 4, -1.0), "eps"),
        (
            _core.layer_norm_forward,
            (x._buf, None, None, y._buf, m._buf, small._buf, 1, 2**21 + 1, 1e-5),
            "rows of 2097153 elements exceed the supported 2097152",
        ),
        (
            _core.layer_norm_backward,
            (x._buf, None, m._buf, small._buf, y._buf, None, None, None, 3, 4, 0, 0, 0),
            "no gradient requested",
        ),
        (
            _core.layer_norm_backward,
            (x._buf, None, m._buf, small._buf, y._buf, None, w4._buf, None, 3, 4, 0, 0, 0),
            "dweight needs the weight",
        ),
        (
            _core.layer_norm_backward,
            (x._buf, None, m._buf, small._buf, y._buf, y._buf, None, None, 3, 4, 0, 0, 0),
            "dx shares a GPU buffer with dy",
        ),
        (
            _core.layer_norm_backward,
            (x._buf, None, m._buf, small._buf, y._buf, w4._buf, None, None, 3, 4, 0, 0, 0),
            "dx holds 4",
        ),
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
        xs, gs = x[r0 : r0 + 8192].astype(np.float64), dy[r0 : r0 + 8192].astype(np.float64)
        mu = xs.mean(1, keepdims=True)
        rs = 1 / np.sqrt(xs.var(1, keepdims=True) + 1e-5)
        xh = (xs - mu) * rs
        g = gs * w
        rdx = rs * (g - g.mean(1, keepdims=True) - xh * (g * xh).mean(1, keepdims=True))
        close(y[r0 : r0 + 8192], xh * w + b)
        close(mean[r0 : r0 + 8192], mu[:, 0], rtol=1e-6, atol=1e-6)
        close(rstd[r0 : r0 + 8192], rs[:, 0])
        close(dx[r0 : r0 + 8192], rdx)
        rdw += (gs * xh).sum(0)
        rdb += gs.sum(0)
    close(dw, rdw)
    close(db, rdb)


# ================================================================ dropout

MASK32 = 0xFFFFFFFF


def philox4x32_10(ctr, key):
    """Philox-4x32-10 over arrays: ctr = 4 arrays of words, key = 2 ints; returns 4 uint64 arrays of words."""
    c0, c1, c2, c3 = (np.asarray(c, np.uint64) for c in ctr)
    k0, k1 = int(key[0]), int(key[1])
    m = np.uint64(MASK32)
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c0  # < 2^64: both factors < 2^32
        p1 = np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = (
            (p1 >> np.uint64(32)) ^ c1 ^ np.uint64(k0),
            p1 & m,
            (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1),
            p0 & m,
        )
        k0, k1 = (k0 + 0x9E3779B9) & MASK32, (k1 + 0xBB67AE85) & MASK32
    return c0, c1, c2, c3


def keep_mask(seed, counter, p, idx):
    """Elements idx of the mask a dropout call with this (seed, counter) key draws (dropout.wgsl)."""
    idx = np.asarray(idx, np.uint64)
    g = idx >> np.uint64(2)
    words = philox4x32_10(
        (g & np.uint64(MASK32), g >> np.uint64(32), np.uint64(counter & MASK32), np.uint64(counter >> 32)),
        (seed & MASK32, seed >> 32),
    )
    word = np.choose((idx & np.uint64(3)).astype(np.int64), words)
    return word >= _core.dropout_threshold(p)


def test_philox_reference_known_answers():
    """The NumPy reference reproduces Random123's known-answer vectors for philox4x32-10."""
    cases = [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((MASK32,) * 4, (MASK32, MASK32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        (
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
            (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        ),
    ]
    for ctr, key, expected in cases:
        assert tuple(int(w[0]) for w in philox4x32_10([[c] for c in ctr], key)) == expected


def scale_of(p):
    return np.float32(1.0 / (1.0 - p))


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_mask_is_philox_and_statistics(dev, rng, p):
    """Over 2^20 elements: the mask equals the reference bit for bit, the kept fraction is within
    5 sigma of 1 - p, kept elements are x * float32(1 / (1 - p)) exactly, dropped ones 0."""
    n = 1 << 20
    x = rng.uniform(0.5, 2.0, n).astype(np.float32)
    seed = int(rng.integers(0, 2**63))
    pw.manual_seed(seed, dev)
    y = F.dropout(T(dev, x), p).numpy()
    keep = keep_mask(seed, 0, p, np.arange(n))
    np.testing.assert_array_equal(y != 0, keep)
    np.testing.assert_array_equal(y[keep], x[keep] * scale_of(p))
    np.testing.assert_array_equal(y[~keep], 0)
    sigma = np.sqrt(p * (1 - p) / n)
    assert abs(keep.mean() - (1 - p)) < 5 * sigma, (keep.mean(), 1 - p)
    assert pw.get_rng_state(dev).tolist() == [seed & MASK32, seed >> 32, 1, 0]


def test_dropout_backward_uses_the_forward_mask(dev, rng):
    """dx = dy * mask / (1 - p) with the forward's mask (recomputed from its key, nothing stored),
    even with other dropout calls between forward and backward; beta = 1 accumulates."""
    n, p = 100_003, 0.3
    x = rng.uniform(0.5, 2.0, n).astype(np.float32)
    dy = rand(rng, n)
    tx = pw.tensor(x, dev, requires_grad=True)
    y = F.dropout(tx, p)
    F.dropout(T(dev, x), p)  # advances the state between forward and backward
    y.backward(dy)
    keep = y.numpy() != 0
    np.testing.assert_array_equal(tx.grad.numpy(), np.where(keep, dy * scale_of(p), np.float32(0)))
    y2 = F.dropout(tx, p)
    y2.backward(dy)  # accumulates into .grad
    keep2 = y2.numpy() != 0
    expected = np.where(keep, dy * scale_of(p), np.float32(0)) + np.where(keep2, dy * scale_of(p), np.float32(0))
    np.testing.assert_array_equal(tx.grad.numpy(), expected)


def test_dropout_seeding(dev, rng):
    """Same seed: same masks; successive calls: different masks; another seed: different masks."""
    x = T(dev, np.ones(4099, np.float32))
    pw.manual_seed(1234, dev)
    a1, a2 = F.dropout(x, 0.5).numpy(), F.dropout(x, 0.5).numpy()
    pw.manual_seed(1234)  # every device
    b1, b2 = F.dropout(x, 0.5).numpy(), F.dropout(x, 0.5).numpy()
    np.testing.assert_array_equal(a1, b1)
    np.testing.assert_array_equal(a2, b2)
    assert (a1 != a2).mean() > 0.4
    pw.manual_seed(1235, dev)
    assert (F.dropout(x, 0.5).numpy() != a1).mean() > 0.4
    assert pw.random.initial_seed(dev) == 1235
    pw.manual_seed(-1, dev)  # torch's range: negatives wrap to 64 bits
    assert pw.get_rng_state(dev).tolist() == [MASK32, MASK32, 0, 0]


def test_rng_state_save_restore(dev, rng):
    """get_rng_state / set_rng_state reproduce later masks bit for bit (a resumed run)."""
    x = T(dev, rand(rng, 33, 129))
    pw.manual_seed(99, dev)
    F.dropout(x, 0.2)
    state = pw.get_rng_state(dev)
    assert state.dtype == np.uint32 and state.tolist() == [99, 0, 1, 0]
    later = [F.dropout(x, 0.2).numpy() for _ in range(3)]
    pw.manual_seed(5, dev)
    F.dropout(x, 0.2)
    pw.set_rng_state(state, dev)
    for want in later:
        np.testing.assert_array_equal(F.dropout(x, 0.2).numpy(), want)
    # a 64-bit counter: the carry into the high word
    pw.set_rng_state(np.array([7, 0, MASK32, 0], np.uint32), dev)
    F.dropout(x, 0.2)
    assert pw.get_rng_state(dev).tolist() == [7, 0, 0, 1]
    with pytest.raises(ValueError, match="4 integers"):
        pw.set_rng_state(np.zeros(3, np.uint32), dev)
    with pytest.raises(ValueError, match=re.escape("[0, 2**32)")):
        pw.set_rng_state(np.array([-1, 0, 0, 0]), dev)


def dropout_step(tx, w, p):
    """A small differentiable step: loss = sum(dropout(x) * w); fills tx.grad."""
    loss = (F.dropout(tx, p) * w).sum()
    loss.backward()
    return loss


def test_dropout_replayed_graph_draws_new_masks(dev, rng):
    """A captured step with dropout forward and backward, replayed: each replay draws a new mask
    (the counter advances on the GPU) and equals an eager run from the same seed, bit for bit."""
    rows, cols, p, steps = 33, 129, 0.4, 4
    x, wv = rand(rng, rows, cols), rand(rng, rows, cols)
    w = T(dev, wv)

    pw.manual_seed(2024, dev)
    eager = []
    for _ in range(steps):
        tx = pw.tensor(x, dev, requires_grad=True)
        loss = dropout_step(tx, w, p)
        eager.append((loss.numpy(), tx.grad.numpy()))

    pw.manual_seed(2024, dev)
    tx = pw.tensor(x, dev, requires_grad=True)
    with dev.batch() as rec:
        rec.begin_capture()
        loss = dropout_step(tx, w, p)
        graph = rec.end_capture()
    replayed = [(loss.numpy(), tx.grad.numpy())]
    for _ in range(steps - 1):
        rec = _core._Recorder(dev._dev)
        rec.replay(graph)
        rec.submit()
        replayed.append((loss.numpy(), tx.grad.numpy()))
    for (el, eg), (rl, rg) in zip(eager, replayed):
        np.testing.assert_array_equal(rl, el)
        np.testing.assert_array_equal(rg, eg)
    masks = [g != 0 for _, g in replayed]
    for i in range(steps - 1):
        assert (masks[i] != masks[i + 1]).mean() > 0.3
    assert pw.get_rng_state(dev).tolist()[2] == steps


def test_dropout_trainer_capture_matches_eager(dev, rng):
    """Trainer (captured and replayed steps, 3 per submission) and an uncaptured Trainer from the same seed
    and initial weights give identical losses and weights: dropout draws the same masks either way."""
    x = rand(rng, 32, 16)
    y = rng.integers(0, 4, 32)

    def train(capture):
        pw.manual_seed(77, dev)
        model = pw.nn.Sequential(
            pw.nn.Linear(16, 32, device=dev, seed=3),
            pw.nn.ReLU(),
            pw.nn.Dropout(0.25),
            pw.nn.LayerNorm(32, device=dev),
            pw.nn.Linear(32, 4, device=dev, seed=4),
        )
        opt = pw.optim.AdamW(model.parameters(), lr=1e-2)
        trainer = Trainer(model, opt, pw.nn.CrossEntropyLoss(), capture=capture, steps_per_submit=3)
        losses = [trainer.step(x, y) for _ in range(7)]
        return [loss.item() for loss in losses], model.state_dict()

    replayed, w1 = train(True)
    eager, w2 = train(False)
    assert replayed == eager
    for k in w1:
        np.testing.assert_array_equal(w1[k], w2[k])
    assert len(set(replayed)) == len(replayed)


def test_dropout_identity_zero_and_errors(dev, rng):
    x = T(dev, rand(rng, 7, 33))
    assert F.dropout(x, 0.5, training=False) is x
    assert F.dropout(x, 0.0) is x
    tx = pw.tensor(rand(rng, 7, 33), dev, requires_grad=True)
    out = F.dropout(tx, 1.0)
    np.testing.assert_array_equal(out.numpy(), 0)
    out.backward(np.ones((7, 33), np.float32))
    np.testing.assert_array_equal(tx.grad.numpy(), 0)
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="dropout probability has to be between 0 and 1"):
            F.dropout(x, bad)
    with pytest.raises(TypeError, match="p must be a real number"):
        F.dropout(x, "0.5")
    with pytest.raises(TypeError, match="must have dtype float32"):
        F.dropout(np.ones(3), 0.5)
    with pytest.raises(ValueError, match="inplace=True is not supported"):
        F.dropout(x, 0.5, inplace=True)
    key = pw.zeros(4, np.int32, dev)
    with pytest.raises(ValueError, match=re.escape("p must lie in [0, 1)")):
        run(dev, _core.dropout, x._buf, key._buf, T(dev, np.zeros(231, np.float32))._buf, 231, 1.0, 0.0)
    with pytest.raises(ValueError, match="y shares a GPU buffer with x"):
        run(dev, _core.dropout, x._buf, key._buf, x._buf, 231, 0.5, 0.0)
    with pytest.raises(ValueError, match="key shares a GPU buffer with state"):
        run(dev, _core.rng_take, key._buf, key._buf)
    with pytest.raises(ValueError, match="needs 16"):
        run(dev, _core.rng_take, pw.zeros(2, np.int32, dev)._buf, key._buf)


def test_dropout_module(dev, rng):
    m = pw.nn.Dropout(0.5)
    x = T(dev, np.ones((64, 64), np.float32))
    y = m(x).numpy()
    assert set(np.unique(y)) == {0.0, 2.0}
    m.eval()
    assert m(x) is x
    m.train()
    assert (m(x).numpy() == 0).any()
    assert repr(m) == "Dropout(p=0.5, inplace=False)"
    with pytest.raises(ValueError, match="between 0 and 1"):
        pw.nn.Dropout(1.2)
    seq = pw.nn.Sequential(pw.nn.Linear(64, 8, device=dev, seed=0), pw.nn.Dropout(0.5))
    seq.eval()
    np.testing.assert_array_equal(seq(x).numpy(), seq[0](x).numpy())


@pytest.mark.slow
def test_dropout_past_binding_limit(dev, rng):
    """More elements than one binding holds: pieces keep the mask a function of the element index
    (the piece boundary falls inside a Philox group of 4 on some devices; checked around it)."""
    n = binding_floats(dev) + 4099
    p = 0.5
    x = np.ones(n, np.float32)
    pw.manual_seed(31337, dev)
    y = F.dropout(T(dev, x), p).numpy()
    piece = binding_floats(dev) // 32 * 32  # at or below the first piece boundary
    idx = np.concatenate([np.arange(0, 4099), np.arange(piece - 70_000, n)])
    np.testing.assert_array_equal(y[idx] != 0, keep_mask(31337, 0, p, idx))
    np.testing.assert_array_equal(np.unique(y), [0.0, 2.0])
    sigma = np.sqrt(p * (1 - p) / n)
    assert abs((y != 0).mean() - (1 - p)) < 5 * sigma


def test_trainer_checkpoint_resumes_dropout_masks(dev, rng, tmp_path):
    """Trainer.save keeps the device's RNG state; a run resumed with Trainer.load draws the same
    masks as the uninterrupted one: identical losses and weights."""
    x = rand(rng, 16, 8)
    y = rng.integers(0, 3, 16)

    def make():
        model = pw.nn.Sequential(
            pw.nn.Linear(8, 16, device=dev, seed=1), pw.nn.Dropout(0.5), pw.nn.Linear(16, 3, device=dev, seed=2)
        )
        opt = pw.optim.AdamW(model.parameters(), lr=1e-2)
        return Trainer(model, opt, pw.nn.CrossEntropyLoss())

    pw.manual_seed(11, dev)
    a = make()
    for _ in range(3):
        a.step(x, y)
    a.save(tmp_path / "run.npz")
    straight = [a.step(x, y).item() for _ in range(4)]
    pw.manual_seed(12345, dev)  # whatever happened in between
    b = make()
    b.load(tmp_path / "run.npz")
    resumed = [b.step(x, y).item() for _ in range(4)]
    assert resumed == straight
    for k, v in a.model.state_dict().items():
        np.testing.assert_array_equal(b.model.state_dict()[k], v)
