"""float16 operands of the element-wise, reduction, normalization and loss ops: float32 math
inside, the result in torch's dtype (float16 when every floating operand is float16 or a Python
scalar, float32 when one is float32), gradients in the operand's dtype. References: float64
NumPy / torch CPU on the float16 inputs, rounded once."""

import numpy as np
import pytest
import torch

import pywgtrain as pw
from helpers import assert_close

SIZES = (1, 7, 33, 129)
TF = torch.nn.functional


def half(rng, *shape, positive=False):
    x = rng.standard_normal(shape)
    return (np.abs(x) + 0.1 if positive else x).astype(np.float16)


def t64(x):
    return torch.from_numpy(np.asarray(x, np.float64))


def assert_half(got, ref, magnitude=None):
    """got (float16) vs the float64 reference: one rounding to float16 plus float32 error; NaN
    and infinities where the reference has them."""
    got = got.numpy() if isinstance(got, pw.Tensor) else np.asarray(got)
    ref = ref.numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref, np.float64)
    assert got.dtype == np.float16 and got.shape == ref.shape, (got.dtype, got.shape, ref.shape)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(got), nan)
    with np.errstate(over="ignore"):
        ref16 = ref.astype(np.float16)
    inf = np.isinf(ref16)  # also where rounding to float16 overflows
    np.testing.assert_array_equal(got[inf], ref16[inf])
    ok = ~(nan | inf)
    scale = magnitude if magnitude is not None else (np.max(np.abs(ref[ok])) if ok.any() else 1.0)
    np.testing.assert_allclose(got[ok].astype(np.float64), ref[ok], rtol=2.0**-10, atol=max(1e-6 * scale, 2.0**-24))


UNARY = {
    "neg": torch.neg,
    "abs": torch.abs,
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "relu": torch.relu,
    "silu": TF.silu,
    "gelu": TF.gelu,
    "square": torch.square,
}
POSITIVE = ("log", "sqrt", "rsqrt")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_half(dev, rng, name, n):
    x = half(rng, 3, n, positive=name in POSITIVE)
    got = getattr(pw.tensor(x, dev), name)() if name != "gelu" else pw.gelu(pw.tensor(x, dev))
    assert_half(got, UNARY[name](t64(x)))


def test_unary_half_specials_and_scalars(dev):
    x = np.array([0.0, -0.0, 1.0, -1.0, 65504.0, -65504.0, np.inf, -np.inf, np.nan, 6e-8, 11.0], np.float16)
    tx = pw.tensor(x, dev)
    for got, ref in (
        (tx.exp(), torch.exp(t64(x))),  # 11 -> 59874 and 65504 -> inf: overflow on the rounding, as torch
        (tx * 2.0, t64(x) * 2.0),  # a Python scalar keeps float16
        (1.0 - tx, 1.0 - t64(x)),
        (tx / 3.0, t64(x) / 3.0),
        (tx.clamp(-1.0, 2.0), t64(x).clamp(-1.0, 2.0)),
        (tx.pow(2.0), t64(x).pow(2.0)),
        (tx.tanh(), t64(x).tanh()),
    ):
        assert_half(got, ref)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "maximum", "minimum", "pow"])
def test_binary_half_and_promotion(dev, rng, name, n):
    a, b = half(rng, 3, n, positive=name == "pow"), half(rng, n)
    fn, tfn = getattr(pw, name), getattr(torch, name)
    assert_half(fn(pw.tensor(a, dev), pw.tensor(b, dev)), tfn(t64(a), t64(b)))  # broadcast
    # float16 with float32: float32, as torch's promotion
    b32 = b.astype(np.float32) * np.float32(1.0 + 2.0**-15)  # not representable in float16
    got = fn(pw.tensor(a, dev), pw.tensor(b32, dev))
    assert got.dtype == np.float32
    assert_close(got.numpy(), tfn(t64(a), t64(b32)).numpy(), rtol=1e-6)
    assert tfn(torch.from_numpy(a), torch.from_numpy(b32)).dtype == torch.float32  # torch agrees


@pytest.mark.parametrize("n", SIZES)
def test_reductions_half(dev, rng, n):
    x = half(rng, 3, n) * np.float16(8)
    tx, r = pw.tensor(x, dev), t64(x)
    mag = float(np.abs(x.astype(np.float64)).sum())
    assert_half(tx.sum(), r.sum(), mag)
    assert_half(tx.sum(1), r.sum(1), mag)
    assert_half(tx.sum(0, keepdim=True), r.sum(0, keepdim=True), mag)
    assert_half(tx.mean(1), r.mean(1), mag / n)
    assert_half(tx.max(), r.max())
    values, indices = tx.max(1)
    assert_half(values, r.max(1).values)
    np.testing.assert_array_equal(indices.numpy(), r.max(1).indices.numpy())
    if n > 1:
        assert_half(tx.var(1), r.var(1), mag)
        assert_half(tx.std(1), r.std(1))
    assert_half(pw.softmax(tx, -1), torch.softmax(r, -1))
    assert_half(pw.log_softmax(tx, 0), torch.log_softmax(r, 0), mag)


def test_reductions_half_nan_and_inf(dev):
    x = np.array([[1.0, np.nan, 3.0], [np.inf, 2.0, -1.0], [-np.inf, np.inf, 0.0]], np.float16)
    tx, r = pw.tensor(x, dev), t64(x)
    assert_half(tx.sum(1), r.sum(1))
    assert_half(tx.max(1).values, r.max(1).values)
    assert_half(tx.max(), r.max())
    assert_half(pw.softmax(tx, 1), torch.softmax(r, 1))


@pytest.mark.parametrize("n", SIZES)
def test_layer_norm_cross_entropy_embedding_dropout_half(dev, rng, n):
    x, w, b = half(rng, 5, n), half(rng, n), half(rng, n)
    got = pw.layer_norm(pw.tensor(x, dev), (n,), pw.tensor(w, dev), pw.tensor(b, dev))
    assert_half(got, TF.layer_norm(t64(x), (n,), t64(w), t64(b)))
    labels = rng.integers(0, n, 5).astype(np.int32)
    loss = pw.cross_entropy(pw.tensor(x, dev), labels)  # float16 logits: a float16 loss, as torch on CUDA
    assert_half(loss, TF.cross_entropy(t64(x), torch.from_numpy(labels).long()))
    table = half(rng, 9, n)
    ids = rng.integers(0, 9, 13).astype(np.int32)
    assert_half(pw.embedding(ids, pw.tensor(table, dev)), table[ids].astype(np.float64))
    y = pw.dropout(pw.tensor(x, dev), 0.5).numpy()
    assert y.dtype == np.float16
    kept = y != 0
    np.testing.assert_array_equal(y[kept], (x.astype(np.float32) * 2).astype(np.float16)[kept])


def test_gradients_half_match_torch(dev, rng):
    """A chain of float16 ops: gradients come back float16, close to torch's float64 ones."""
    x, w, v = half(rng, 7, 33), half(rng, 33), half(rng, 7, 1)
    tx, tw, tv = (pw.tensor(a, dev, requires_grad=True) for a in (x, w, v))
    rx, rw, rv = (t64(a).requires_grad_() for a in (x, w, v))

    def chain(F, a, b, c, act):
        h = act(a * b + c)
        return (F.softmax(h, -1) * h).sum() + (h - c).exp().mean() + h.max(1)[0].sum()

    chain(pw, tx, tw, tv, pw.gelu).backward()
    chain(torch, rx, rw, rv, TF.gelu).backward()
    for got, ref in ((tx, rx), (tw, rw), (tv, rv)):
        assert got.grad.dtype == np.float16
        g, r = got.grad.numpy().astype(np.float64), ref.grad.numpy()
        np.testing.assert_allclose(g, r, rtol=1e-2, atol=1e-2 * np.max(np.abs(r)))


def test_half_matmul_with_autograd_and_batched(dev, rng):
    a, b = half(rng, 33, 129), half(rng, 129, 7)
    ta, tb = pw.tensor(a, dev, requires_grad=True), pw.tensor(b, dev, requires_grad=True)
    ra, rb = t64(a).requires_grad_(), t64(b).requires_grad_()
    out = ta @ tb
    ref = ra @ rb
    assert_half(out, ref.detach(), magnitude=float((np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))).max()))
    g = half(rng, 33, 7)
    (out * pw.tensor(g, dev)).sum().backward()
    (ref * t64(g)).sum().backward()
    for got, r in ((ta, ra), (tb, rb)):
        assert got.grad.dtype == np.float16
        np.testing.assert_allclose(got.grad.numpy(), r.grad.numpy(), rtol=1e-2, atol=1e-2 * r.grad.abs().max().item())
    # batched float16 operands compute in float32 and round once
    x, y = half(rng, 3, 7, 33), half(rng, 3, 33, 5)
    assert_half(pw.bmm(pw.tensor(x, dev), pw.tensor(y, dev)), t64(x) @ t64(y), magnitude=33.0)
    with pytest.raises(TypeError, match="other must be float16 like input, got float32"):
        pw.tensor(a, dev) @ pw.tensor(b.astype(np.float32), dev)
    with pytest.raises(TypeError, match="weight must be float16 like input, got float32"):
        pw.linear(pw.tensor(a, dev), pw.tensor(np.ascontiguousarray(b.T, np.float32), dev))


def test_reshape_of_half_that_requires_grad(dev, rng):
    """Allowed (its backward only reshapes the gradient), unlike the region views (test_f16)."""
    x = half(rng, 6)
    g = pw.tensor(x, dev, requires_grad=True)
    (g.reshape(2, 3) * pw.tensor(np.arange(6, dtype=np.float16).reshape(2, 3), dev)).sum().backward()
    assert g.grad.dtype == np.float16
    np.testing.assert_array_equal(g.grad.numpy(), np.arange(6, dtype=np.float16))


@pytest.mark.slow
def test_half_sum_past_one_binding(dev, rng):
    """A float16 tensor whose float32 copy spans more than one storage binding."""
    n = dev.limits["max_storage_buffer_binding_size"] // 4 + 4099
    x = rng.standard_normal(n).astype(np.float16)
    tx = pw.tensor(x, dev)
    assert_half(tx.sum(), x.astype(np.float64).sum(), float(np.abs(x.astype(np.float64)).sum()))
    y = (tx * 2.0).numpy()
    np.testing.assert_array_equal(y, x * np.float16(2))
