"""Tensor ops with torch's names and semantics, composed from the kernels: min / argmax /
argmin (NaN and ties), isnan / isinf / isfinite, masked_fill (and in place through a view),
tril / triu, repeat, arange, the *_like and new_* constructors; values and gradients against
torch in float64."""

import numpy as np
import pytest

import pywgtrain as pw

from helpers import rand, same_as_torch, t64

torch = pytest.importorskip("torch")


def with_specials(rng, *shape):
    x = rand(rng, *shape)
    x.reshape(-1)[[1, 5]] = x.reshape(-1)[0]  # ties with the first element
    return x


@pytest.mark.parametrize("dim,keepdim", [(None, False), (0, False), (1, True), (-1, False)])
def test_min_argmax_argmin_like_torch(dev, rng, dim, keepdim):
    x = with_specials(rng, 4, 7)
    tx, rx = pw.tensor(x, dev, requires_grad=True), t64(x, grad=True)
    if dim is None:
        got, want = pw.min(tx), torch.min(rx)
    else:
        (got, gi), (want, wi) = pw.min(tx, dim, keepdim), torch.min(rx, dim, keepdim)
        np.testing.assert_array_equal(gi.numpy(), wi.numpy())
    same_as_torch(got.numpy(), want)
    got.sum().backward()
    want.sum().backward()
    same_as_torch(tx.grad.numpy(), rx.grad)
    for ours, theirs in ((pw.argmax, torch.argmax), (pw.argmin, torch.argmin)):
        kw = {} if dim is None else {"dim": dim, "keepdim": keepdim}
        np.testing.assert_array_equal(ours(pw.tensor(x, dev), **kw).numpy(), theirs(t64(x), **kw).numpy())
    y = x.copy()
    y[2, 3] = np.nan  # NaN wins in argmax and argmin, as torch
    for ours, theirs in ((pw.argmax, torch.argmax), (pw.argmin, torch.argmin)):
        np.testing.assert_array_equal(ours(pw.tensor(y, dev)).numpy(), theirs(t64(y)).numpy())
    assert pw.tensor(x, dev).argmax(keepdim=True).shape == (1, 1)


def test_isnan_isinf_isfinite(dev):
    x = np.array([0.0, -1.5, np.nan, np.inf, -np.inf, 3e38], np.float32)
    t = pw.tensor(x, dev)
    for name in ("isnan", "isinf", "isfinite"):
        np.testing.assert_array_equal(getattr(t, name)().numpy(), getattr(np, name)(x).astype(np.float32))


def test_masked_fill_like_torch(dev, rng):
    x = rand(rng, 3, 5)
    mask = rng.random((1, 5)) < 0.5  # broadcast along rows
    tx, rx = pw.tensor(x, dev, requires_grad=True), t64(x, grad=True)
    got, want = tx.masked_fill(mask, -2.5), rx.masked_fill(torch.from_numpy(mask), -2.5)
    same_as_torch(got.numpy(), want)
    g = rand(rng, 3, 5)
    got.backward(pw.tensor(g, dev))
    want.backward(t64(g))
    same_as_torch(tx.grad.numpy(), rx.grad)
    fmask = pw.tensor(mask.astype(np.float32), dev)  # a float mask: nonzero is true
    same_as_torch(
        pw.masked_fill(pw.tensor(x, dev), fmask, 7.0).numpy(), want.detach().masked_fill(torch.from_numpy(mask), 7.0)
    )
    base = pw.tensor(x.copy(), dev)
    with pw.no_grad():
        base[1:].masked_fill_(mask, 0.0)  # through a view: the base changes
    ref = x.copy()
    ref[1:][np.broadcast_to(mask, (2, 5))] = 0.0
    np.testing.assert_array_equal(base.numpy(), ref)
    with pytest.raises(ValueError, match="does not broadcast"):
        pw.masked_fill(pw.tensor(x, dev), np.zeros((2, 3, 5), bool), 0.0)


@pytest.mark.parametrize("diagonal", [0, 1, -2])
def test_tril_triu_like_torch(dev, rng, diagonal):
    x = rand(rng, 2, 4, 6)
    x[0, 3, 0] = np.nan  # outside triu's triangle: 0, as torch
    for name in ("tril", "triu"):
        tx, rx = pw.tensor(x, dev, requires_grad=True), t64(x, grad=True)
        got, want = getattr(pw, name)(tx, diagonal), getattr(torch, name)(rx, diagonal)
        same_as_torch(got.numpy(), want)
        g = rand(rng, 2, 4, 6)
        got.backward(pw.tensor(g, dev))
        want.backward(t64(g))
        same_as_torch(tx.grad.numpy(), rx.grad)


@pytest.mark.parametrize("sizes", [(2, 3), (1, 1), (2, 1, 3)])
def test_repeat_like_torch(dev, rng, sizes):
    x = rand(rng, 2, 3)
    tx, rx = pw.tensor(x, dev, requires_grad=True), t64(x, grad=True)
    got, want = tx.repeat(*sizes), rx.repeat(*sizes)
    same_as_torch(got.numpy(), want)
    g = rand(rng, *want.shape)
    got.backward(pw.tensor(g, dev))
    want.backward(t64(g))
    same_as_torch(tx.grad.numpy(), rx.grad)
    with pytest.raises(ValueError, match="at least as many"):
        tx.repeat(2)


def test_arange_and_constructors_like_torch(dev):
    for args in ((5,), (2, 9), (1, 10, 3), (0.5, 2.0, 0.25), (5, 0, -2)):
        got, want = pw.arange(*args, device=dev), torch.arange(*args)
        np.testing.assert_allclose(got.numpy(), want.numpy())
        assert got.dtype == (np.int32 if want.dtype == torch.int64 else np.float32)
    with pytest.raises(ValueError, match="step"):
        pw.arange(0, 3, 0)
    x = pw.tensor(np.ones((2, 3), np.float16), dev)
    assert pw.zeros_like(x).dtype == np.float16 and not pw.zeros_like(x).numpy().any()
    assert pw.full_like(x, 2.5).dtype == np.float16 and (pw.full_like(x, 2.5).numpy() == 2.5).all()
    assert (pw.ones_like(x).numpy() == 1).all()
    assert x.new_zeros(4, 2).shape == (4, 2) and x.new_zeros((4, 2)).dtype == np.float16
    assert (x.new_ones(3).numpy() == 1).all() and (x.new_full((2,), -1.0).numpy() == -1).all()
    y = pw.tensor(np.ones(3, np.float32), dev)
    assert y.expand_as(pw.empty((2, 3), device=dev)).shape == (2, 3)
    assert y.type_as(x).dtype == np.float16


@pytest.mark.parametrize(
    "shape,pads,value", [((3, 5), (1, 2), 0.0), ((2, 3, 4), (2, 0, 1, 1), -1.5), ((2, 6), (-1, 2, 0, 1), 3.0)]
)
def test_pad_like_torch(dev, rng, shape, pads, value):
    """Constant padding of the last dimensions (negative sizes crop), values and gradient."""
    x = rand(rng, *shape)
    tx, rx = pw.tensor(x, dev, requires_grad=True), t64(x, grad=True)
    got = pw.nn.functional.pad(tx, pads, value=value)
    want = torch.nn.functional.pad(rx, pads, value=value)
    same_as_torch(got.numpy(), want)
    g = rand(rng, *want.shape)
    got.backward(pw.tensor(g, dev))
    want.backward(t64(g))
    same_as_torch(tx.grad.numpy(), rx.grad)
    with pytest.raises(NotImplementedError, match="constant"):
        pw.nn.functional.pad(tx, pads, mode="reflect")


@pytest.mark.parametrize("p,dim", [(2.0, 1), (1.0, -1), (3.0, 0)])
def test_normalize_like_torch(dev, rng, p, dim):
    x = rand(rng, 4, 6)
    x[1] = 0.0  # a zero row (and column): eps keeps it finite, its gradient is torch's
    x[:, 2] = 0.0
    tx, rx = pw.tensor(x, dev, requires_grad=True), t64(x, grad=True)
    got, want = pw.nn.functional.normalize(tx, p, dim), torch.nn.functional.normalize(rx, p, dim)
    same_as_torch(got.numpy(), want, 1e-5, 1e-6)
    g = rand(rng, 4, 6)
    got.backward(pw.tensor(g, dev))
    want.backward(t64(g))
    same_as_torch(tx.grad.numpy(), rx.grad, 1e-4, 1e-5)


def test_flatten_unflatten_modules(dev, rng):
    x = pw.tensor(rand(rng, 2, 3, 4, 5), dev)
    assert pw.nn.Flatten()(x).shape == (2, 60)
    assert pw.nn.Flatten(0, 2)(x).shape == (24, 5)
    y = pw.nn.Unflatten(1, (3, 20))(pw.nn.Flatten()(x))
    assert y.shape == (2, 3, 20)
    np.testing.assert_array_equal(y.numpy(), x.numpy().reshape(2, 3, 20))


def test_where_takes_a_boolean_numpy_condition(dev, rng):
    x, y = rand(rng, 2, 5), rand(rng, 5)
    cond = rng.random((2, 5)) < 0.5
    got = pw.where(cond, pw.tensor(x, dev), pw.tensor(y, dev)).numpy()
    np.testing.assert_array_equal(
        got, torch.where(torch.from_numpy(cond), torch.from_numpy(x), torch.from_numpy(y)).numpy()
    )
