"""Rough edges of issue 34, each held to PyTorch's behaviour (torch CPU, float64)
or to a clear error: pow with a scalar or negative base, matmul with 1-D
operands, GPT.generate on tiny contexts and its seeding, the default device,
and the short-row softmax / log_softmax / cross-entropy kernels (forward and
backward against float64 NumPy, outputs poisoned with NaN)."""

import numpy as np
import pytest

import pywgtrain as pw
import pywgtrain.device as pw_device
import pywgtrain.functions as F
from pywgtrain import _core
from pywgtrain.models import GPT, GPTConfig

from helpers import poisoned, rand, same_as_torch, t64

torch = pytest.importorskip("torch")


# -- pow -----------------------------------------------------------------------------
EXPONENTS = np.array([2.0, 0.0, 1.0, 3.0, -1.0, -2.0, 0.5, 1.5, -0.5, 4.0], np.float32)


def _same_with_grads(dev, y, ref, x, ref_x):
    """y against torch's ref, then x's gradient for the same upstream gradient."""
    same_as_torch(y.numpy(), ref)
    g = np.linspace(0.5, 1.5, y.numel()).astype(np.float32).reshape(y.shape)
    y.backward(pw.tensor(g, dev))
    ref.backward(t64(g))
    same_as_torch(x.grad.numpy(), ref_x.grad)


@pytest.mark.parametrize("base", [0.0, -2.0, 2.0, 1.0, -1.0, 0.5])
def test_scalar_base_tensor_exponent(dev, base):
    t = pw.tensor(EXPONENTS, dev, requires_grad=True)
    y = base**t
    ref_t = t64(EXPONENTS, grad=True)
    ref = base**ref_t
    _same_with_grads(dev, y, ref, t, ref_t)
    same_as_torch(pw.pow(base, t).numpy(), torch.pow(base, ref_t))


def test_issue_examples(dev):
    t = pw.tensor(np.array([2.0], np.float32), dev)
    assert (0.0**t).numpy().tolist() == [0.0]
    assert ((-2.0) ** t).numpy().tolist() == [4.0]


@pytest.mark.parametrize("exponent", [2, 3, -1, -2, 0, 1, 0.5, 2.5, -1.5])
def test_negative_base_scalar_exponent(dev, exponent):
    x = np.array([-3.0, -2.0, -0.5, 0.0, 0.5, 2.0], np.float32)
    tx = pw.tensor(x, dev, requires_grad=True)
    y = tx**exponent
    ref_x = t64(x, grad=True)
    ref = ref_x**exponent
    _same_with_grads(dev, y, ref, tx, ref_x)


def test_tensor_tensor_pow_negative_bases(dev):
    a = np.array([-2.0, -2.0, -1.5, 0.0, 0.0, 0.0, 3.0, -3.0], np.float32)
    b = np.array([2.0, 3.0, 0.5, 2.0, 0.0, -1.0, 1.5, -2.0], np.float32)
    ta, tb = pw.tensor(a, dev, requires_grad=True), pw.tensor(b, dev, requires_grad=True)
    y = ta**tb
    ra, rb = t64(a, grad=True), t64(b, grad=True)
    ref = ra**rb
    same_as_torch(y.numpy(), ref)
    y.sum().backward()
    ref.sum().backward()
    same_as_torch(ta.grad.numpy(), ra.grad)
    same_as_torch(tb.grad.numpy(), rb.grad)


# -- matmul with vectors ---------------------------------------------------------------
MATMUL_SHAPES = [
    ((5,), (5,)),
    ((1,), (1,)),
    ((5,), (5, 3)),
    ((4, 5), (5,)),
    ((2, 4, 5), (5,)),
    ((5,), (2, 5, 3)),
    ((3, 1, 4, 5), (2, 5, 6)),
    ((2, 3, 4, 5), (5,)),
    ((7,), (2, 1, 7, 2)),
]


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES)
def test_matmul_like_torch(dev, rng, sa, sb):
    a, b = rand(rng, *sa), rand(rng, *sb)
    ta, tb = pw.tensor(a, dev, requires_grad=True), pw.tensor(b, dev, requires_grad=True)
    y = ta @ tb
    ra, rb = t64(a, grad=True), t64(b, grad=True)
    ref = ra @ rb
    assert y.shape == tuple(ref.shape)
    same_as_torch(y.numpy(), ref, rtol=1e-5, atol=1e-5)
    g = rand(rng, *ref.shape)
    y.backward(pw.tensor(g, dev)) if ref.dim() else y.backward()
    ref.backward(t64(g) if ref.dim() else None)
    same_as_torch(ta.grad.numpy(), ra.grad, rtol=1e-5, atol=1e-5)
    same_as_torch(tb.grad.numpy(), rb.grad, rtol=1e-5, atol=1e-5)
    same_as_torch(pw.matmul(a, b).numpy(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sa,sb", [((5,), (4,)), ((5,), (4, 3)), ((3, 4), (5,)), ((2, 3, 4), (3,))])
def test_matmul_mismatch_is_a_clear_error(dev, sa, sb):
    a, b = pw.zeros(sa, device=dev), pw.zeros(sb, device=dev)
    with pytest.raises(ValueError, match="matmul: shapes .* inner dimensions"):
        a @ b
    with pytest.raises(ValueError, match="at least one dimension"):
        pw.zeros((), device=dev) @ b


# -- GPT.generate --------------------------------------------------------------------------
def _greedy_reference(model, ids, n, block):
    ref = ids.copy()
    for _ in range(n):
        ref = np.concatenate([ref, model(ref[:, -block:]).numpy()[:, -1].argmax(-1)[:, None]], 1)
    return ref


def test_generate_block_size_one(dev, rng):
    model = GPT(GPTConfig(vocab_size=20, block_size=1, n_layer=1, n_head=2, n_embd=8), device=dev, seed=2)
    ids = rng.integers(0, 20, (2, 1))
    out = model.generate(ids, 5, temperature=0.0)
    assert out.shape == (2, 6)
    np.testing.assert_array_equal(out, _greedy_reference(model, ids, 5, 1))
    assert model.generate(ids, 4, temperature=1.0, top_k=3, seed=0).shape == (2, 5)


def test_generate_crops_a_long_prompt(dev, rng):
    model = GPT(GPTConfig(vocab_size=30, block_size=4, n_layer=1, n_head=2, n_embd=8), device=dev, seed=3)
    ids = rng.integers(0, 30, (2, 7))
    out = model.generate(ids, 1, temperature=0.0)
    np.testing.assert_array_equal(out, _greedy_reference(model, ids, 1, 4))
    assert model.generate(ids, 6, temperature=0.0).shape == (2, 13)


def test_generate_seed_none_follows_manual_seed(dev, rng, monkeypatch):
    monkeypatch.setattr(pw.random, "_seed_for_new", pw.random._seed_for_new)
    saved = pw.get_rng_state(dev)
    try:
        model = GPT(GPTConfig(vocab_size=50, block_size=8, n_layer=1, n_head=2, n_embd=8), device=dev, seed=4)
        ids = rng.integers(0, 50, (3, 2))
        pw.manual_seed(1234)
        a = model.generate(ids, 12, temperature=2.0)
        b = model.generate(ids, 12, temperature=2.0)  # the generator moved on
        pw.manual_seed(1234)
        np.testing.assert_array_equal(model.generate(ids, 12, temperature=2.0), a)
        np.testing.assert_array_equal(model.generate(ids, 12, temperature=2.0), b)
        assert not np.array_equal(a, b)
        # an explicit seed stays independent of the global state
        np.testing.assert_array_equal(model.generate(ids, 5, seed=7), model.generate(ids, 5, seed=7))
    finally:
        pw.set_rng_state(saved, dev)


# -- the default device ---------------------------------------------------------------------
def test_first_device_becomes_the_default(dev, monkeypatch):
    monkeypatch.setattr(pw_device, "_default", None)
    monkeypatch.setattr(pw_device, "_candidate", None)
    d = pw.Device()
    later = pw.Device()  # a second Device of the same adapter is a device of its own
    assert pw.default_device() is d
    assert pw.tensor(np.ones(3, np.float32)).device is d
    assert (pw.tensor(np.ones(3, np.float32)) + 1).device is d
    assert pw.default_device() is not later
    with pytest.raises(ValueError, match="lives on"):
        pw.tensor(np.ones(3, np.float32)) + pw.tensor(np.ones(3, np.float32), later)


def test_unreferenced_device_is_not_kept_as_default(dev, monkeypatch):
    monkeypatch.setattr(pw_device, "_default", None)
    monkeypatch.setattr(pw_device, "_candidate", None)
    pw.Device()  # dropped at once: nothing keeps it open
    import gc

    gc.collect()
    d = pw.default_device()
    assert d is pw.default_device() and not d.lost


def test_a_device_opened_after_the_default_is_not_the_default(dev):
    assert pw.default_device() is dev
    other = pw.Device()
    assert pw.default_device() is dev and other is not dev


# -- short-row softmax, log_softmax and cross-entropy ----------------------------------------
# Rows up to 64 columns (1024 on CPU adapters) run a thread per row, longer ones a workgroup per row.
ROWS = [1, 7, 33, 129]
COLS = [1, 3, 8, 33, 64, 65, 300, 1024, 1025, 2000]


def _softmax64(x, log):
    z = x.astype(np.float64) - x.max(-1, keepdims=True)
    lse = np.log(np.exp(z).sum(-1, keepdims=True))
    return z - lse if log else np.exp(z - lse)


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("cols", COLS)
@pytest.mark.parametrize("rows", ROWS)
def test_softmax_kernels_poisoned(dev, rng, rows, cols, log):
    x = (3 * rand(rng, rows, cols)).astype(np.float32)
    y = poisoned(dev, (rows, cols))
    with dev.batch() as rec:
        _core.softmax(rec, pw.tensor(x, dev)._buf, y._buf, rows, cols, log)
    ref = _softmax64(x, log)
    # log_softmax: z - log(sum): float32 rounding of terms of |ref|'s size
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-5, atol=1e-6 * max(1.0, np.abs(ref).max()))
    dy = rand(rng, rows, cols)
    yv = ref.astype(np.float32)
    s = dy.astype(np.float64).sum(-1, keepdims=True)
    ref_dx = (
        dy - np.exp(yv.astype(np.float64)) * s
        if log
        else yv * (dy - (dy * yv.astype(np.float64)).sum(-1, keepdims=True))
    )
    for beta in (0.0, 1.0):
        dx = poisoned(dev, (rows, cols)) if beta == 0.0 else pw.tensor(np.ones((rows, cols), np.float32), dev)
        with dev.batch() as rec:
            _core.softmax_backward(
                rec, pw.tensor(yv, dev)._buf, pw.tensor(dy, dev)._buf, dx._buf, rows, cols, log, beta
            )
        np.testing.assert_allclose(dx.numpy(), ref_dx + beta, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(s).max()))


@pytest.mark.parametrize("cols", [1, 3, 8, 33, 65, 1025])
def test_softmax_autograd_like_torch(dev, rng, cols):
    x = rand(rng, 3, 5, cols)
    for name in ("softmax", "log_softmax"):
        tx = pw.tensor(x, dev, requires_grad=True)
        y = getattr(tx, name)(-1)
        rx = t64(x, grad=True)
        ref = getattr(torch, name)(rx, -1)
        same_as_torch(y.numpy(), ref, rtol=1e-5, atol=1e-6)
        g = rand(rng, *x.shape)
        y.backward(pw.tensor(g, dev))
        ref.backward(t64(g))
        same_as_torch(tx.grad.numpy(), rx.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(7,), (2, 5), (3, 4, 5), (2, 3, 4, 5)])
def test_softmax_without_dim_as_torch(dev, rng, shape):
    """F.softmax(x) / nn.Softmax() without dim: torch's deprecated implicit choice (dim 0 for
    1-D and 3-D inputs, else 1) with its warning, not the last dimension."""
    x = rand(rng, *shape)
    import torch.nn.functional as TF

    for name in ("softmax", "log_softmax"):
        with pytest.warns(UserWarning, match="Implicit dimension choice"):
            got = getattr(F, name)(pw.tensor(x, dev)).numpy()
        with pytest.warns(UserWarning, match="Implicit dimension choice"):
            want = getattr(TF, name)(t64(x))
        same_as_torch(got, want, rtol=1e-5, atol=1e-6)
    with pytest.warns(UserWarning):
        got = pw.nn.Softmax()(pw.tensor(x, dev)).numpy()
    with pytest.warns(UserWarning):
        same_as_torch(got, torch.nn.Softmax()(t64(x)), rtol=1e-5, atol=1e-6)


def test_short_softmax_special_values(dev):
    x = np.array(
        [[0.0, -np.inf, 1.0], [np.nan, 0.0, 1.0], [1e30, 1e30, -1e30], [-np.inf] * 3, [80.0, 90.0, 100.0]], np.float32
    )
    rx = t64(x)
    for name in ("softmax", "log_softmax"):
        same_as_torch(
            getattr(F, name)(pw.tensor(x, dev), -1).numpy(), getattr(torch, name)(rx, -1), rtol=1e-5, atol=1e-6
        )


@pytest.mark.parametrize("cols", [5, 100, 1500])
def test_softmax_special_values_long_rows(dev, rng, cols):
    """The one-pass max and sum of exponentials of softmax / log_softmax
    (lse.wgsl) against torch on rows with the max first, last or rising,
    values far apart, -inf, +inf and NaN (torch's NaN rows), forward and
    backward; 5 columns take the thread-per-row kernel, the others (on GPUs;
    lavapipe's short rows reach 1024) a workgroup per row."""
    x = (3 * rand(rng, 9, cols)).astype(np.float32)
    x[0, 0] = 50.0
    x[1, -1] = 50.0
    x[2] = np.linspace(-90.0, 90.0, cols, dtype=np.float32)
    x[3, cols // 2] = 1e30
    x[4, 1] = -np.inf
    x[5] = -np.inf
    x[6, cols // 3] = np.inf
    x[7, 2] = np.nan
    x[8] = -1e30
    g = rand(rng, 9, cols)
    for name in ("softmax", "log_softmax"):
        tx, rx = pw.tensor(x, dev, requires_grad=True), t64(x, grad=True)
        y, ref = getattr(F, name)(tx, -1), getattr(torch, name)(rx, -1)
        same_as_torch(y.numpy(), ref, rtol=1e-5, atol=1e-6)
        y.backward(pw.tensor(g, dev))
        ref.backward(t64(g))
        same_as_torch(tx.grad.numpy(), rx.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("cols", COLS)
@pytest.mark.parametrize("rows", ROWS)
def test_cross_entropy_like_torch(dev, rng, rows, cols, reduction):
    x = (3 * rand(rng, rows, cols)).astype(np.float32)
    labels = rng.integers(0, cols, rows).astype(np.int64)
    labels[rng.random(rows) < 0.25] = -100
    labels[0] = min(cols - 1, 2)  # at least one counted row
    tx = pw.tensor(x, dev, requires_grad=True)
    loss = F.cross_entropy(tx, labels, reduction=reduction)
    rx = t64(x, grad=True)
    ref = torch.nn.functional.cross_entropy(rx, torch.tensor(labels), reduction=reduction)
    same_as_torch(loss.numpy(), ref, rtol=1e-5, atol=1e-5)
    g = rand(rng, *ref.shape)
    loss.backward(pw.tensor(g, dev)) if ref.dim() else loss.backward()
    ref.backward(t64(g) if ref.dim() else None)
    same_as_torch(tx.grad.numpy(), rx.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cols", [7, 1500, 5000])
def test_cross_entropy_special_values_like_torch(dev, rng, cols):
    """The one-pass log-sum-exp (a running max, its sum rescaled when the max
    rises) against torch: the max first, last or in the middle of a row, values
    far apart (a row of -1e30: the loss is log(cols), not 0), and inf / NaN
    logits, which give torch's NaN; gradients too. Short rows (7) take
    the thread-per-row kernel, the others the workgroup-per-row one."""
    rows = 10
    x = (4 * rand(rng, rows, cols)).astype(np.float32)
    x[0, 0] = 60.0  # the max first: every later term is rescaled into it
    x[1, -1] = 60.0  # the max last: the whole sum is rescaled once
    x[2, cols // 2] = 1e30  # dominates: the other terms vanish
    x[3] = np.linspace(-80.0, 80.0, cols, dtype=np.float32)  # rising: the max moves every step
    x[4, cols // 3] = np.inf
    x[5, -1] = -np.inf
    x[6] = -np.inf
    x[7, 1] = np.nan
    x[8] = -1e30
    labels = rng.integers(0, cols, rows).astype(np.int64)
    labels[5] = 0
    tx, rx = pw.tensor(x, dev, requires_grad=True), t64(x, grad=True)
    loss = F.cross_entropy(tx, labels, reduction="none")
    ref = torch.nn.functional.cross_entropy(rx, torch.tensor(labels), reduction="none")
    same_as_torch(loss.numpy(), ref, rtol=1e-5, atol=1e-5)
    g = rand(rng, rows)
    loss.backward(pw.tensor(g, dev))
    ref.backward(t64(g))
    same_as_torch(tx.grad.numpy(), rx.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cols", [1, 8, 64, 65, 1024, 1025])
def test_cross_entropy_kernels_poisoned(dev, rng, cols):
    rows = 129
    x = rand(rng, rows, cols)
    labels = rng.integers(0, cols, rows).astype(np.int32)
    labels[5] = -100  # ignored
    labels[6] = cols  # out of range: NaN loss for that row
    z = x.astype(np.float64)
    mx = z.max(-1)
    log_sum = np.log(np.exp(z - mx[:, None]).sum(-1))
    lse = log_sum + mx
    stats_t = poisoned(dev, (rows, 2))
    loss_t, valid_t = (poisoned(dev, (rows,)) for _ in range(2))
    out, scale = poisoned(dev, (1,)), poisoned(dev, (1,))
    tl = pw.tensor(labels, dev)
    with dev.batch() as rec:
        _core.cross_entropy_forward(
            rec, pw.tensor(x, dev)._buf, tl._buf, stats_t._buf, loss_t._buf, valid_t._buf, out._buf, scale._buf,
            rows, cols, -100, True,
        )  # fmt: skip
    np.testing.assert_array_equal(stats_t.numpy()[:, 0], mx.astype(np.float32))
    np.testing.assert_allclose(stats_t.numpy()[:, 1], log_sum, rtol=1e-6, atol=1e-6)
    picked = lse - z[np.arange(rows), np.clip(labels, 0, cols - 1)]
    want = np.where(labels == -100, 0.0, picked)
    got = loss_t.numpy()
    assert np.isnan(got[6]) and np.isnan(out.numpy()[0])
    keep = np.arange(rows) != 6
    np.testing.assert_allclose(got[keep], want[keep], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(valid_t.numpy(), (labels != -100).astype(np.float32))
    assert scale.numpy()[0] == pytest.approx(1.0 / (rows - 1))
    upstream = rand(rng, rows)
    dlogits = poisoned(dev, (rows, cols))
    with dev.batch() as rec:
        _core.cross_entropy_backward(
            rec, pw.tensor(x, dev)._buf, tl._buf, pw.tensor(np.stack([mx, log_sum], 1).astype(np.float32), dev)._buf,
            pw.tensor(upstream, dev)._buf, scale._buf, dlogits._buf, rows, cols, -100, True, 0.0,
        )  # fmt: skip
    p = np.exp(z - lse[:, None])
    onehot = np.zeros_like(p)
    ok = (labels >= 0) & (labels < cols)
    onehot[np.arange(rows)[ok], labels[ok]] = 1.0
    ref = (p - onehot) * np.where(labels == -100, 0.0, upstream)[:, None]
    np.testing.assert_allclose(dlogits.numpy(), ref, rtol=1e-5, atol=1e-6)
