"""Tensor kernels under the autograd (csrc/tensor_ops.hpp) called directly
through pywgtrain._core: forward against float64 NumPy, backward against
float64 torch autograd (ties of maximum / minimum included: torch splits
them in halves). Outputs start as NaN so unwritten elements
show; sizes avoid multiples of every workgroup size."""

import re
from pathlib import Path

import numpy as np
import pytest

import pywgtrain as pw
from pywgtrain import _core
from pywgtrain._opcodes import BINARY, REDUCE, UNARY
from helpers import assert_close, poisoned, rand

torch = pytest.importorskip("torch")

SIZES = [1, 7, 33, 129, 257, 1000, 4099]
HEADER = Path(__file__).resolve().parents[1] / "csrc" / "tensor_ops.hpp"


def T(dev, a):
    return pw.tensor(np.ascontiguousarray(a), dev)


def assert_accumulated(actual, expected, base, rtol=1e-5, atol_scale=1e-5):
    """beta = 1: actual = expected + base, with atol scaled by the summands (their sum may cancel)."""
    actual = np.asarray(actual)
    assert np.all(np.isfinite(actual)), "non-finite values in the result"
    scale = max(float(np.max(np.abs(expected))), float(np.max(np.abs(base))), 1e-30)
    np.testing.assert_allclose(actual, expected + base, rtol=rtol, atol=atol_scale * scale)


def run(dev, fn, *args):
    with dev._recording() as rec:
        fn(rec, *args)


def contiguous(shape):
    s, step = [], 1
    for d in reversed(shape):
        s.insert(0, step)
        step *= d
    return s


def bcast_strides(shape, out_shape):
    """Element strides of a contiguous array of `shape` read at `out_shape` (NumPy broadcasting)."""
    shape = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    return [0 if n == 1 and m != 1 else s for n, m, s in zip(shape, out_shape, contiguous(shape))]


# ---------------------------------------------------------------- op numbers


def test_op_tables_come_from_one_place():
    """The op codes are shader_contract.hpp's tables: dense, named as the ops
    functions.py calls, and the shaders switch on their names, never on numbers."""
    for table in (UNARY, BINARY, REDUCE):
        assert sorted(table.values()) == list(range(len(table)))
    assert {"copy", "exp", "relu", "clamp", "sqrt_std"} <= set(UNARY)
    assert {"add", "maximum", "eq_nan"} <= set(BINARY) and set(REDUCE) == {"sum", "max"}
    for stem in ("elementwise", "axis"):
        src = (HEADER.parent.parent / "shaders" / f"{stem}.wgsl").read_text()
        assert not re.search(r"\bcase\s+\d", src) and not re.search(r"\bOP\s*[=!]=\s*\d", src), stem


# ---------------------------------------------------------------- unary

A_B = {
    "pow_scalar": (2.5, 0.0),
    "clamp": (-0.5, 0.75),
    "add_scalar": (1.25, 0.0),
    "mul_scalar": (-3.0, 0.0),
    "rsub_scalar": (2.0, 0.0),
    "rdiv_scalar": (1.5, 0.0),
    "softplus": (1.5, 2.0),  # beta, threshold: both pieces hit
}
POSITIVE = {"log", "sqrt", "rsqrt", "pow_scalar", "rdiv_scalar", "sqrt_std"}


def unary_input(rng, name, n):
    x = rng.standard_normal(n) * 2
    if name in POSITIVE:
        x = np.abs(x) + 0.1
    if name in ("abs", "relu", "clamp", "copy") and n >= 7:
        x[:3] = 0.0  # kinks at 0 (abs, relu) and at the clamp bounds
        x[3:5] = A_B.get(name, (0.0, 0.0))
    return x.astype(np.float32)


def torch_unary(name, x, a, b):
    F = torch.nn.functional
    return {
        "copy": lambda: x * 1.0,
        "neg": lambda: -x,
        "abs": lambda: x.abs(),
        "exp": lambda: x.exp(),
        "log": lambda: x.log(),
        "sqrt": lambda: x.sqrt(),
        "rsqrt": lambda: x.rsqrt(),
        "tanh": lambda: x.tanh(),
        "sigmoid": lambda: x.sigmoid(),
        "relu": lambda: F.relu(x),
        "gelu_erf": lambda: F.gelu(x),
        "gelu_tanh": lambda: F.gelu(x, approximate="tanh"),
        "silu": lambda: F.silu(x),
        "pow_scalar": lambda: x**a,
        "clamp": lambda: x.clamp(a, b),
        "add_scalar": lambda: x + a,
        "mul_scalar": lambda: x * a,
        "rsub_scalar": lambda: a - x,
        "rdiv_scalar": lambda: a / x,
        "sqrt_std": lambda: x.sqrt(),  # (std's gradient differs at 0 only: tests/test_nan_semantics.py)
        "softplus": lambda: F.softplus(x, a, b),
    }[name]()


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_forward(dev, rng, name, n):
    x = unary_input(rng, name, n)
    a, b = A_B.get(name, (0.0, 0.0))
    y = poisoned(dev, n)
    run(dev, _core.unary, UNARY[name], T(dev, x)._buf, y._buf, n, a, b, 0.0)
    expected = torch_unary(name, torch.from_numpy(x.astype(np.float64)), a, b).numpy()
    assert_close(y.numpy(), expected, rtol=2e-6 if name == "tanh" else 1e-5)


def test_gelu_far_tails(dev):
    """Both GELU forms keep relative precision where 1 + erf / 1 + tanh would cancel (f32 exp of
    arguments near -20 limits it to ~1e-4 at the far end)."""
    x = -np.linspace(2.0, 6.5, 37).astype(np.float32)  # GELU down to ~1e-10; 1 + tanh(u) would keep ~1e-3
    xt = torch.from_numpy(x.astype(np.float64)).requires_grad_()
    for name, approx in (("gelu_erf", "none"), ("gelu_tanh", "tanh")):
        y = poisoned(dev, x.size)
        run(dev, _core.unary, UNARY[name], T(dev, x)._buf, y._buf, x.size, 0.0, 0.0, 0.0)
        ref = torch.nn.functional.gelu(xt, approximate=approx)
        np.testing.assert_allclose(y.numpy(), ref.detach().numpy(), rtol=1e-4, atol=1e-37)
        xt.grad = None
        ref.sum().backward()
        dx = poisoned(dev, x.size)
        run(
            dev,
            _core.unary_backward,
            UNARY[name],
            T(dev, x)._buf,
            y._buf,
            T(dev, np.ones_like(x))._buf,
            dx._buf,
            x.size,
            0.0,
            0.0,
            0.0,
        )
        np.testing.assert_allclose(dx.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-37)


def test_unary_accumulates_and_small_tanh(dev, rng):
    n = 129
    x = rand(rng, n)
    y0 = rand(rng, n)
    y = T(dev, y0)
    run(dev, _core.unary, UNARY["exp"], T(dev, x)._buf, y._buf, n, 0.0, 0.0, 1.0)
    assert_accumulated(y.numpy(), np.exp(x.astype(np.float64)), y0)
    # tanh keeps its relative precision near 0 and saturates cleanly for large |x|
    x = np.concatenate([np.logspace(-8, 0, 60), -np.logspace(-8, 0, 60), [20, -20, 90, -90, 1e30, -1e30]]).astype(
        np.float32
    )
    y = poisoned(dev, x.size)
    run(dev, _core.unary, UNARY["tanh"], T(dev, x)._buf, y._buf, x.size, 0.0, 0.0, 0.0)
    np.testing.assert_allclose(y.numpy(), np.tanh(x.astype(np.float64)), rtol=1e-6, atol=0)


def test_pow_scalar_negative_base(dev):
    x = np.array([-2.0, -0.5, 0.0, 1.5, -3.0], np.float32)
    for a in (2.0, 3.0, -1.0, 0.0):
        y = poisoned(dev, x.size)
        run(dev, _core.unary, UNARY["pow_scalar"], T(dev, x)._buf, y._buf, x.size, a, 0.0, 0.0)
        ref = torch.from_numpy(x.astype(np.float64)) ** a
        np.testing.assert_allclose(y.numpy(), ref.numpy(), rtol=1e-6)
    y = poisoned(dev, x.size)
    run(dev, _core.unary, UNARY["pow_scalar"], T(dev, x)._buf, y._buf, x.size, 0.5, 0.0, 0.0)
    assert np.all(np.isnan(y.numpy()[[0, 1, 4]])) and np.all(np.isfinite(y.numpy()[[2, 3]]))


@pytest.mark.parametrize("n", [1, 33, 1000])
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_backward(dev, rng, name, n):
    x = unary_input(rng, name, n)
    a, b = A_B.get(name, (0.0, 0.0))
    dy = rand(rng, n)
    dx0 = rand(rng, n)
    tx, y = T(dev, x), poisoned(dev, n)
    run(dev, _core.unary, UNARY[name], tx._buf, y._buf, n, a, b, 0.0)
    xt = torch.from_numpy(x.astype(np.float64)).requires_grad_()
    torch_unary(name, xt, a, b).backward(torch.from_numpy(dy.astype(np.float64)))
    expected = xt.grad.numpy()
    dx = poisoned(dev, n)
    run(dev, _core.unary_backward, UNARY[name], tx._buf, y._buf, T(dev, dy)._buf, dx._buf, n, a, b, 0.0)
    # Derivatives taken from the float32 output (tanh: 1 - y^2, sigmoid: y (1 - y), as
    # torch) cancel near saturation: an absolute error of a few ulps of 1, times dy.
    floor = 5e-7 * float(np.abs(dy).max()) / max(float(np.abs(expected).max()), 1e-30)
    assert_close(dx.numpy(), expected, rtol=1e-5, atol_scale=max(2e-6, floor))
    dx = T(dev, dx0)  # beta = 1 accumulates
    run(dev, _core.unary_backward, UNARY[name], tx._buf, y._buf, T(dev, dy)._buf, dx._buf, n, a, b, 1.0)
    assert_accumulated(dx.numpy(), expected, dx0, rtol=1e-5, atol_scale=2e-6)


def test_unary_backward_kinks(dev):
    """Relu'(0) = 0, Abs'(0) = 0, Clamp' = 1 on the bounds (inclusive), pow with exponent 0 -> 0."""
    x = np.array([0.0, -0.5, 0.75, 0.3, -1.0, 2.0], np.float32)
    dy = np.ones_like(x)
    cases = {
        "relu": ((0, 0), [0, 0, 1, 1, 0, 1]),
        "abs": ((0, 0), [0, -1, 1, 1, -1, 1]),
        "clamp": ((-0.5, 0.75), [1, 1, 1, 1, 0, 0]),
        "pow_scalar": ((0.0, 0), [0] * 6),
    }
    for name, ((a, b), expected) in cases.items():
        dx = poisoned(dev, x.size)
        run(
            dev,
            _core.unary_backward,
            UNARY[name],
            T(dev, x)._buf,
            T(dev, x)._buf,
            T(dev, dy)._buf,
            dx._buf,
            x.size,
            a,
            b,
            0.0,
        )
        np.testing.assert_array_equal(dx.numpy(), np.array(expected, np.float32), err_msg=name)


@pytest.mark.parametrize("n", [1, 257, 4099])
def test_fill(dev, n):
    out = poisoned(dev, n)
    run(dev, _core.fill, out._buf, n, -2.5)
    np.testing.assert_array_equal(out.numpy(), np.full(n, -2.5, np.float32))


# ---------------------------------------------------------------- binary

# (a shape, b shape): same shape, scalar, row, column, middle axis, both broadcast, 4-d mixed, 1-element
PATTERNS = {
    "same": ((7, 33), (7, 33)),
    "scalar_b": ((129,), (1,)),
    "scalar_a": ((1,), (5, 33)),
    "row": ((9, 257), (257,)),
    "column": ((33, 7), (33, 1)),
    "middle": ((3, 5, 129), (3, 1, 129)),
    "both": ((33, 1), (1, 129)),
    "mixed4d": ((2, 1, 7, 3), (1, 5, 1, 3)),
    "one": ((1,), (1,)),
}


def binary_inputs(rng, name, sa, sb):
    if name in ("maximum", "minimum", "gt", "lt", "ge", "le", "eq", "ne", "eq_nan"):
        # small integers: plenty of ties / equal pairs
        return (rng.integers(-3, 4, sa).astype(np.float32), rng.integers(-3, 4, sb).astype(np.float32))
    a, b = rand(rng, *sa), rand(rng, *sb)
    if name == "div":
        b = (np.sign(b) + (b == 0)) * (np.abs(b) + 0.5)
    if name == "pow":
        a = np.abs(a) + 0.2
    return a.astype(np.float32), b.astype(np.float32)


NP_BINARY = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "pow": np.power,
    "gt": np.greater,
    "lt": np.less,
    "ge": np.greater_equal,
    "le": np.less_equal,
    "eq": np.equal,
    "ne": np.not_equal,
    "eq_nan": lambda a, b: (a == b) | (np.isnan(a) & np.isnan(b)),
}


@pytest.mark.parametrize("pattern", list(PATTERNS))
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_forward(dev, rng, name, pattern):
    sa, sb = PATTERNS[pattern]
    shape = np.broadcast_shapes(sa, sb)
    a, b = binary_inputs(rng, name, sa, sb)
    expected = NP_BINARY[name](a.astype(np.float64), b.astype(np.float64)).astype(np.float64)
    ta, tb = T(dev, a), T(dev, b)

    def binary_into(out, beta):
        args = (list(shape), bcast_strides(sa, shape), bcast_strides(sb, shape), beta)
        run(dev, _core.binary, BINARY[name], ta._buf, tb._buf, out._buf, *args)

    out = poisoned(dev, shape)
    binary_into(out, 0.0)
    assert_close(out.numpy(), expected)
    base = rand(rng, *shape)
    out = T(dev, base)
    binary_into(out, 1.0)
    assert_accumulated(out.numpy(), expected, base)


def test_binary_nan_propagation(dev):
    a = np.array([np.nan, 1.0, np.nan, 2.0], np.float32)
    b = np.array([1.0, np.nan, np.nan, 3.0], np.float32)
    for name, fn in (("maximum", np.maximum), ("minimum", np.minimum)):
        out = pw.zeros(4, np.float32, dev)
        run(dev, _core.binary, BINARY[name], T(dev, a)._buf, T(dev, b)._buf, out._buf, [4], [1], [1], 0.0)
        np.testing.assert_array_equal(out.numpy(), fn(a, b))


def binary_grad_reference(name, which, a, b, dy):
    """d op / d operand at the output shape, float64."""
    if name in ("gt", "lt", "ge", "le", "eq", "ne", "eq_nan"):
        return np.zeros_like(dy)
    at = torch.from_numpy(np.array(a)).requires_grad_()
    bt = torch.from_numpy(np.array(b)).requires_grad_()
    out = {
        "add": lambda: at + bt,
        "sub": lambda: at - bt,
        "mul": lambda: at * bt,
        "div": lambda: at / bt,
        "pow": lambda: at**bt,
        "maximum": lambda: torch.maximum(at, bt),  # ties: half to each
        "minimum": lambda: torch.minimum(at, bt),
    }[name]()
    out.backward(torch.from_numpy(dy))
    return (at if which == 0 else bt).grad.numpy()


@pytest.mark.parametrize("pattern", ["same", "scalar_b", "row", "column", "middle", "both", "mixed4d"])
@pytest.mark.parametrize("which", [0, 1])
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_backward(dev, rng, name, which, pattern):
    sa, sb = PATTERNS[pattern]
    shape = np.broadcast_shapes(sa, sb)
    a, b = binary_inputs(rng, name, sa, sb)
    dy = rand(rng, *shape)
    # the gradient at the output shape: operands materialized there
    ea = np.broadcast_to(a.astype(np.float64), shape)
    eb = np.broadcast_to(b.astype(np.float64), shape)
    expected = binary_grad_reference(name, which, ea, eb, dy.astype(np.float64))
    g = poisoned(dev, shape)
    args = (T(dev, a)._buf, T(dev, b)._buf, T(dev, dy)._buf)
    strides = (list(shape), bcast_strides(sa, shape), bcast_strides(sb, shape))
    run(dev, _core.binary_backward, BINARY[name], which, *args, g._buf, *strides, 0.0)
    assert_close(g.numpy(), expected)
    g0 = rand(rng, *shape)
    g = T(dev, g0)
    run(dev, _core.binary_backward, BINARY[name], which, *args, g._buf, *strides, 1.0)
    assert_accumulated(g.numpy(), expected, g0)


def test_pow_gradients_follow_torch_at_zero(dev):
    a = np.array([0.0, 0.0, 2.0, 0.0], np.float32)
    b = np.array([0.0, 2.0, 0.0, 1.0], np.float32)
    dy = np.ones(4, np.float32)
    for which in (0, 1):
        at = torch.from_numpy(a.astype(np.float64)).requires_grad_()
        bt = torch.from_numpy(b.astype(np.float64)).requires_grad_()
        (at**bt).backward(torch.from_numpy(dy.astype(np.float64)))
        g = poisoned(dev, 4)
        run(
            dev,
            _core.binary_backward,
            BINARY["pow"],
            which,
            T(dev, a)._buf,
            T(dev, b)._buf,
            T(dev, dy)._buf,
            g._buf,
            [4],
            [1],
            [1],
            0.0,
        )
        np.testing.assert_allclose(g.numpy(), (at if which == 0 else bt).grad.numpy(), rtol=1e-6)


# ---------------------------------------------------------------- where


@pytest.mark.parametrize(
    "sc,sa,sb",
    [
        ((7, 33), (7, 33), (7, 33)),
        ((33, 1), (33, 129), (1,)),
        ((1, 257), (5, 1), (5, 257)),
        ((3, 1, 7), (1, 5, 7), (3, 5, 1)),
    ],
)
def test_where(dev, rng, sc, sa, sb):
    shape = np.broadcast_shapes(sc, sa, sb)
    cond = (rng.random(sc) < 0.5).astype(np.float32)
    cond[cond == 1] = rng.choice([1.0, -2.0, 0.5], size=int(cond.sum()))  # any nonzero is true
    a, b = rand(rng, *sa), rand(rng, *sb)
    expected = np.where(cond != 0, a, b).astype(np.float64)
    out = poisoned(dev, shape)
    st = [bcast_strides(s, shape) for s in (sc, sa, sb)]
    run(dev, _core.where, T(dev, cond)._buf, T(dev, a)._buf, T(dev, b)._buf, out._buf, list(shape), *st, 0.0)
    assert_close(out.numpy(), expected)
    base = rand(rng, *shape)
    out = T(dev, base)
    run(dev, _core.where, T(dev, cond)._buf, T(dev, a)._buf, T(dev, b)._buf, out._buf, list(shape), *st, 1.0)
    assert_accumulated(out.numpy(), expected, base)


# ---------------------------------------------------------------- strided copy


def gather_strided(dev, x, offset, strides, shape):
    """strided_copy of x's elements offset + sum(i_d * strides[d]) into a poisoned contiguous `shape`."""
    out = poisoned(dev, shape)
    run(
        dev, _core.strided_copy, T(dev, x)._buf, offset, list(strides), out._buf, 0, contiguous(shape), list(shape), 0.0
    )
    return out.numpy()


@pytest.mark.parametrize(
    "shape,perm",
    [
        ((7, 33), (1, 0)),
        ((3, 5, 129), (2, 0, 1)),
        ((2, 3, 5, 7), (3, 1, 0, 2)),
        ((1, 257, 1), (2, 1, 0)),
        ((2, 3, 2, 3, 2, 5), (5, 4, 3, 2, 1, 0)),
    ],
)
def test_strided_copy_permute(dev, rng, shape, perm):
    x = rand(rng, *shape)
    expected = np.transpose(x, perm)
    src_strides = [contiguous(shape)[p] for p in perm]
    np.testing.assert_array_equal(gather_strided(dev, x, 0, src_strides, expected.shape), expected)


def test_strided_copy_expand_and_accumulate(dev, rng):
    x = rand(rng, 33, 1)
    shape = (5, 33, 129)
    out = poisoned(dev, shape)
    run(dev, _core.strided_copy, T(dev, x)._buf, 0, [0, 1, 0], out._buf, 0, contiguous(shape), list(shape), 0.0)
    np.testing.assert_array_equal(out.numpy(), np.broadcast_to(x, shape))
    base = rand(rng, *shape)
    out = T(dev, base)
    run(dev, _core.strided_copy, T(dev, x)._buf, 0, [0, 1, 0], out._buf, 0, contiguous(shape), list(shape), 1.0)
    assert_accumulated(out.numpy(), np.broadcast_to(x, shape).astype(np.float64), base)


def test_strided_copy_slice(dev, rng):
    x = rand(rng, 17, 40)
    view = x[2:15:3, 5:38:2]  # offset 2*40 + 5, strides (3*40, 2)
    np.testing.assert_array_equal(gather_strided(dev, x, 2 * 40 + 5, [120, 2], view.shape), view)


def test_strided_copy_into_slice(dev, rng):
    """Concat / slice backward: write (and accumulate) into a window of a bigger tensor; the rest is untouched."""
    big = rand(rng, 9, 3, 257)
    part = rand(rng, 4, 3, 100)
    dst = T(dev, big)
    off = 2 * 3 * 257 + 150  # big[2:6, :, 150:250]
    tpart = T(dev, part)
    expected = big.copy()
    for beta in (0.0, 1.0):  # write the window, then accumulate into it
        args = (tpart._buf, 0, contiguous(part.shape), dst._buf, off, contiguous(big.shape), list(part.shape), beta)
        run(dev, _core.strided_copy, *args)
        expected[2:6, :, 150:250] = part + beta * expected[2:6, :, 150:250]
        np.testing.assert_array_equal(dst.numpy(), expected)


# ---------------------------------------------------------------- reductions along an axis

REDUCE_SHAPES = [
    (1, 1, 1),
    (7, 1, 1),
    (1, 7, 1),
    (33, 257, 1),
    (5, 1000, 1),
    (3, 1, 33),
    (1, 257, 7),
    (4, 33, 129),
    (2, 1000, 3),
    (129, 5, 17),
]


@pytest.mark.parametrize("shape", REDUCE_SHAPES)
@pytest.mark.parametrize("op", ["sum", "max"])
def test_reduce_axis(dev, rng, op, shape):
    outer, length, inner = shape
    x = rand(rng, *shape)
    x64 = x.astype(np.float64)
    ref = x64.sum(1) if op == "sum" else x64.max(1)
    out = poisoned(dev, (outer, inner))
    am = pw.tensor(np.full((outer, inner), -7, np.int32), dev) if op == "max" else None
    run(
        dev,
        _core.reduce_axis,
        REDUCE[op],
        T(dev, x)._buf,
        out._buf,
        am._buf if am is not None else None,
        outer,
        length,
        inner,
        0.5,
        0.0,
    )
    assert_close(out.numpy(), 0.5 * ref)
    if op == "max":
        np.testing.assert_array_equal(am.numpy(), x.argmax(1))
    base = rand(rng, outer, inner)
    out = T(dev, base)
    run(dev, _core.reduce_axis, REDUCE[op], T(dev, x)._buf, out._buf, None, outer, length, inner, -2.0, 1.0)
    assert_accumulated(out.numpy(), -2.0 * ref, base)


# Long reductions are split into len blocks merged into out (a loop runs at most
# 32768 trips per thread: llvmpipe leaves loops after 65535): rows of more than
# 256 * 32768 elements, columns (inner > 1) of more than 16 * 32768.
@pytest.mark.parametrize("shape", [(1, 256 * 32768 + 333, 1), (2, 16 * 32768 + 777, 3)])
def test_reduce_axis_long_len(dev, rng, shape):
    outer, length, inner = shape
    x = rng.standard_normal(shape, dtype=np.float32)
    x[:, length - 3, :] = 7.0  # max in the last block ...
    x[:, 1000, :] = 7.0  # ... tied with the first block: the first index wins
    x[-1, length - 2, -1] = np.nan  # a NaN in the last block propagates
    tx = T(dev, x)
    out = poisoned(dev, (outer, inner))
    am = pw.tensor(np.full((outer, inner), -7, np.int32), dev)
    run(dev, _core.reduce_axis, REDUCE["max"], tx._buf, out._buf, am._buf, outer, length, inner, 1.0, 0.0)
    np.testing.assert_array_equal(out.numpy(), x.max(1))
    np.testing.assert_array_equal(am.numpy(), x.argmax(1))
    x[-1, length - 2, -1] = 0.0
    tx = T(dev, x)
    base = rand(rng, outer, inner)
    out = T(dev, base)
    run(dev, _core.reduce_axis, REDUCE["sum"], tx._buf, out._buf, None, outer, length, inner, 0.5, 1.0)
    np.testing.assert_allclose(
        out.numpy(), 0.5 * x.astype(np.float64).sum(1) + base, rtol=1e-4, atol=1e-4 * np.sqrt(length)
    )
    with pytest.raises(ValueError, match="needs scale 1 and beta 0"):  # argmax: one pass, in len blocks
        run(dev, _core.reduce_axis, REDUCE["max"], tx._buf, out._buf, am._buf, outer, length, inner, 2.0, 0.0)
    # Without argmax, few lines take two passes (parts, then their maxes): no len blocks, any scale.
    run(dev, _core.reduce_axis, REDUCE["max"], tx._buf, out._buf, None, outer, length, inner, 2.0, 0.0)
    np.testing.assert_array_equal(out.numpy(), 2.0 * x.max(1))


# Few long lines take two passes: parts of each line (a workgroup each) into a
# scratch, then the parts. Sums against float64, maxes exact with a NaN and
# ties across parts, accumulation (beta), float16 input, and a line just long
# enough to split (2 parts) beside one that stays in one pass.
@pytest.mark.parametrize("shape", [(1, 100_003, 1), (3, 50_001, 5), (1, 4096, 1), (1, 4095, 1), (7, 2000, 17)])
def test_reduce_axis_few_long_lines(dev, rng, shape):
    outer, length, inner = shape
    x = rng.standard_normal(shape, dtype=np.float32)
    x[:, length // 3, :] = 9.0
    x[:, length - 1, :] = 9.0
    for half in (False, True):
        xs = x.astype(np.float16) if half else x
        ref = xs.astype(np.float64)
        base = rand(rng, outer, inner)
        out = T(dev, base)
        run(
            dev, _core.reduce_axis, REDUCE["sum"], T(dev, xs)._buf, out._buf, None, outer, length, inner, 0.5, 1.0, half
        )
        np.testing.assert_allclose(out.numpy(), 0.5 * ref.sum(1) + base, rtol=1e-5, atol=1e-5 * np.sqrt(length))
        out = poisoned(dev, (outer, inner))
        run(
            dev, _core.reduce_axis, REDUCE["max"], T(dev, xs)._buf, out._buf, None, outer, length, inner, 1.0, 0.0, half
        )
        np.testing.assert_array_equal(out.numpy(), ref.max(1).astype(np.float32))
    x[-1, length - 5, 0] = np.nan  # a NaN in a late part propagates
    out = poisoned(dev, (outer, inner))
    run(dev, _core.reduce_axis, REDUCE["max"], T(dev, x)._buf, out._buf, None, outer, length, inner, 1.0, 0.0)
    np.testing.assert_array_equal(out.numpy(), x.max(1))
    out = poisoned(dev, (outer, inner))
    run(dev, _core.reduce_axis, REDUCE["sum"], T(dev, x)._buf, out._buf, None, outer, length, inner, 1.0, 0.0)
    want = x.astype(np.float64).sum(1)
    np.testing.assert_array_equal(np.isnan(out.numpy()), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_allclose(out.numpy()[ok], want[ok], rtol=1e-5, atol=1e-5 * np.sqrt(length))


@pytest.mark.parametrize("shape", [(33, 257, 1), (3, 129, 33), (1, 1000, 1)])
def test_reduce_max_ties_and_nan(dev, rng, shape):
    outer, length, inner = shape
    x = rng.integers(-2, 3, shape).astype(np.float32)  # many ties: the first index wins
    x[0, length // 2, 0] = np.nan
    x[-1, length - 1, -1] = np.nan
    x[-1, length // 3, -1] = np.nan  # the first NaN is the argmax
    out = poisoned(dev, (outer, inner))
    am = pw.tensor(np.full((outer, inner), -7, np.int32), dev)
    run(dev, _core.reduce_axis, REDUCE["max"], T(dev, x)._buf, out._buf, am._buf, outer, length, inner, 1.0, 0.0)
    np.testing.assert_array_equal(out.numpy(), np.max(x, 1))  # NaN where a NaN is in the slice
    np.testing.assert_array_equal(am.numpy(), np.argmax(x, 1))  # NumPy: first max, first NaN
    tx = torch.from_numpy(x).max(1)
    np.testing.assert_array_equal(am.numpy(), tx.indices.numpy())


@pytest.mark.parametrize("shape", [(1, 1, 1), (33, 257, 1), (3, 1, 33), (4, 33, 129)])
def test_max_backward(dev, rng, shape):
    outer, length, inner = shape
    x = rng.integers(-3, 4, shape).astype(np.float32)
    am = x.argmax(1).astype(np.int32)
    dy = rand(rng, outer, inner)
    expected = np.zeros(shape)
    o, i = np.meshgrid(np.arange(outer), np.arange(inner), indexing="ij")
    expected[o, am, i] = dy
    dx = poisoned(dev, shape)
    run(dev, _core.max_backward, T(dev, dy)._buf, T(dev, am)._buf, dx._buf, outer, length, inner, 0.0)
    np.testing.assert_array_equal(dx.numpy(), expected.astype(np.float32))
    base = rand(rng, *shape)
    dx = T(dev, base)
    run(dev, _core.max_backward, T(dev, dy)._buf, T(dev, am)._buf, dx._buf, outer, length, inner, 1.0)
    assert_accumulated(dx.numpy(), expected, base)


# ---------------------------------------------------------------- softmax


@pytest.mark.parametrize("rows,cols", [(1, 1), (7, 33), (3, 257), (2, 1000), (129, 7)])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_forward_backward(dev, rng, log, rows, cols):
    x = rand(rng, rows, cols) * 3
    xt = torch.from_numpy(x.astype(np.float64)).requires_grad_()
    yt = torch.log_softmax(xt, 1) if log else torch.softmax(xt, 1)
    y = poisoned(dev, (rows, cols))
    run(dev, _core.softmax, T(dev, x)._buf, y._buf, rows, cols, log)
    assert_close(y.numpy(), yt.detach().numpy(), rtol=1e-5, atol_scale=1e-6)
    dy = rand(rng, rows, cols)
    yt.backward(torch.from_numpy(dy.astype(np.float64)))
    dx = poisoned(dev, (rows, cols))
    run(dev, _core.softmax_backward, y._buf, T(dev, dy)._buf, dx._buf, rows, cols, log, 0.0)
    assert_close(dx.numpy(), xt.grad.numpy(), rtol=1e-4, atol_scale=1e-5)
    base = rand(rng, rows, cols)
    dx = T(dev, base)
    run(dev, _core.softmax_backward, y._buf, T(dev, dy)._buf, dx._buf, rows, cols, log, 1.0)
    assert_accumulated(dx.numpy(), xt.grad.numpy(), base, rtol=1e-4, atol_scale=1e-5)


@pytest.mark.parametrize("log", [False, True])
def test_softmax_large_values(dev, rng, log):
    rows, cols = 5, 129
    # exp overflows f32 without the max subtraction; the last two rows are constant in f32
    x = (rand(rng, rows, cols) * 1000 + np.array([0, 1e4, -1e4, 3e38, -3e38])[:, None]).astype(np.float32)
    y = poisoned(dev, (rows, cols))
    run(dev, _core.softmax, T(dev, x)._buf, y._buf, rows, cols, log)
    xt = torch.from_numpy(x.astype(np.float64))
    ref = (torch.log_softmax(xt, 1) if log else torch.softmax(xt, 1)).numpy()
    got = y.numpy()
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6 if not log else 1e-2)


# ---------------------------------------------------------------- embedding


@pytest.mark.parametrize("n_ids,vocab,dim", [(1, 1, 1), (257, 7, 33), (33, 300, 65), (1000, 129, 129)])
def test_embedding(dev, rng, n_ids, vocab, dim):
    w = rand(rng, vocab, dim)
    ids = rng.integers(0, vocab, n_ids).astype(np.int32)
    out = poisoned(dev, (n_ids, dim))
    run(dev, _core.embedding, T(dev, w)._buf, T(dev, ids)._buf, out._buf, n_ids, vocab, dim)
    np.testing.assert_array_equal(out.numpy(), w[ids])


def test_embedding_out_of_range_ids_give_nan(dev, rng):
    vocab, dim = 10, 33
    w = rand(rng, vocab, dim)
    ids = np.array([3, -1, 10, 9, 2**31 - 1, -(2**31), 0], np.int32)
    out = poisoned(dev, (ids.size, dim))
    tw = T(dev, w)
    run(dev, _core.embedding, tw._buf, T(dev, ids)._buf, out._buf, ids.size, vocab, dim)
    got = out.numpy()
    bad = (ids < 0) | (ids >= vocab)
    assert np.all(np.isnan(got[bad]))
    np.testing.assert_array_equal(got[~bad], w[ids[~bad]])


@pytest.mark.parametrize("n_ids,vocab,dim", [(1, 1, 1), (64, 7, 33), (257, 7, 33), (1000, 300, 65), (129, 129, 129)])
def test_embedding_backward(dev, rng, n_ids, vocab, dim):
    ids = rng.integers(0, vocab, n_ids).astype(np.int32)
    if n_ids > 2:
        ids[: n_ids // 2] = ids[0]  # one id repeated many times
        ids[1] = -3  # out of range: contributes nothing
        ids[2] = vocab
    dy = rand(rng, n_ids, dim)
    ok = (ids >= 0) & (ids < vocab)
    expected = np.zeros((vocab, dim))
    np.add.at(expected, ids[ok], dy[ok].astype(np.float64))
    tdy, tids = T(dev, dy), T(dev, ids)
    dw = poisoned(dev, (vocab, dim))
    run(dev, _core.embedding_backward, tdy._buf, tids._buf, dw._buf, n_ids, vocab, dim, 0.0)
    first = dw.numpy()
    assert_close(first, expected)
    dw2 = poisoned(dev, (vocab, dim))
    run(dev, _core.embedding_backward, tdy._buf, tids._buf, dw2._buf, n_ids, vocab, dim, 0.0)
    assert first.tobytes() == dw2.numpy().tobytes()  # deterministic: bit-identical
    if n_ids <= 64:  # one segment of ids (tensor_ops.cpp kEmbSegIds): a float32 sum in increasing id position
        seq = np.zeros((vocab, dim), np.float32)
        for i in np.nonzero(ok)[0]:
            seq[ids[i]] += dy[i]
        np.testing.assert_array_equal(first, seq)
    base = rand(rng, vocab, dim)
    dw = T(dev, base)
    run(dev, _core.embedding_backward, tdy._buf, tids._buf, dw._buf, n_ids, vocab, dim, 1.0)
    assert_accumulated(dw.numpy(), expected, base)


# ---------------------------------------------------------------- NLL pick


@pytest.mark.parametrize("rows,cols", [(1, 1), (7, 33), (257, 10), (33, 1000)])
def test_nll_pick(dev, rng, rows, cols):
    x = rand(rng, rows, cols)
    labels = rng.integers(0, cols, rows).astype(np.int32)
    if rows >= 7:
        labels[1] = -100  # ignore_index
        labels[3] = cols  # out of range -> NaN
        labels[4] = -1
    out, mask = poisoned(dev, rows), poisoned(dev, rows)
    tx, tl = T(dev, x), T(dev, labels)
    run(dev, _core.nll_pick, tx._buf, tl._buf, out._buf, mask._buf, rows, cols, -100)
    ign = labels == -100
    bad = ~ign & ((labels < 0) | (labels >= cols))
    good = ~ign & ~bad
    got = out.numpy()
    np.testing.assert_array_equal(got[good], -x[np.nonzero(good)[0], labels[good]])
    assert np.all(got[ign] == 0) and np.all(np.isnan(got[bad]))
    np.testing.assert_array_equal(mask.numpy(), (~ign).astype(np.float32))

    dy = rand(rng, rows)
    expected = np.zeros((rows, cols), np.float32)
    ok = np.nonzero(~ign & (labels >= 0) & (labels < cols))[0]
    expected[ok, labels[ok]] = -dy[ok]
    dx = poisoned(dev, (rows, cols))
    run(dev, _core.nll_pick_backward, T(dev, dy)._buf, tl._buf, dx._buf, rows, cols, -100, 0.0)
    np.testing.assert_array_equal(dx.numpy(), expected)
    base = rand(rng, rows, cols)
    dx = T(dev, base)
    run(dev, _core.nll_pick_backward, T(dev, dy)._buf, tl._buf, dx._buf, rows, cols, -100, 1.0)
    assert_accumulated(dx.numpy(), expected.astype(np.float64), base)


def test_cross_entropy_composition_matches_torch(dev, rng):
    """log_softmax -> nll_pick -> (backward) equals torch's cross-entropy gradient per row."""
    rows, cols = 33, 129
    x = rand(rng, rows, cols) * 2
    labels = rng.integers(0, cols, rows).astype(np.int32)
    labels[5] = -100
    lp, out, mask = poisoned(dev, (rows, cols)), poisoned(dev, rows), poisoned(dev, rows)
    run(dev, _core.softmax, T(dev, x)._buf, lp._buf, rows, cols, True)
    run(dev, _core.nll_pick, lp._buf, T(dev, labels)._buf, out._buf, mask._buf, rows, cols, -100)
    xt = torch.from_numpy(x.astype(np.float64)).requires_grad_()
    loss = torch.nn.functional.cross_entropy(xt, torch.from_numpy(labels).long(), reduction="none", ignore_index=-100)
    assert_close(out.numpy(), loss.detach().numpy())
    dy = rand(rng, rows)
    loss.backward(torch.from_numpy(dy.astype(np.float64)))
    dlp, dx = poisoned(dev, (rows, cols)), poisoned(dev, (rows, cols))
    run(dev, _core.nll_pick_backward, T(dev, dy)._buf, T(dev, labels)._buf, dlp._buf, rows, cols, -100, 0.0)
    run(dev, _core.softmax_backward, lp._buf, dlp._buf, dx._buf, rows, cols, True, 0.0)
    assert_close(dx.numpy(), xt.grad.numpy(), rtol=1e-4, atol_scale=1e-5)


# ---------------------------------------------------------------- capture


def test_every_op_is_a_capturable_dispatch(dev, rng):
    """All launchers record dispatches only (no copies or clears): a step graph captures them, one
    dispatch each at these sizes, and replays them with a new input."""
    rows, cols, vocab = 7, 33, 5
    x0, x1 = rand(rng, rows, cols), rand(rng, rows, cols)
    ids = T(dev, rng.integers(0, vocab, rows).astype(np.int32))
    labels = T(dev, rng.integers(0, cols, rows).astype(np.int32))
    x, w = T(dev, x0), T(dev, rand(rng, vocab, cols))
    y, s, p, e, xt = (poisoned(dev, (rows, cols)) for _ in range(5))
    dx, g, wh, dw = (
        poisoned(dev, (rows, cols)),
        poisoned(dev, (rows, cols)),
        poisoned(dev, (rows, cols)),
        poisoned(dev, (vocab, cols)),
    )
    red, nll, mask, full = poisoned(dev, rows), poisoned(dev, rows), poisoned(dev, rows), poisoned(dev, rows)
    am = pw.zeros(rows, np.int32, dev)
    n, sh, st = rows * cols, [rows, cols], [cols, 1]
    rec = _core._Recorder(dev._dev)
    rec.begin_capture()
    _core.unary(rec, UNARY["exp"], x._buf, y._buf, n, 0.0, 0.0, 0.0)
    _core.unary_backward(rec, UNARY["exp"], x._buf, y._buf, x._buf, dx._buf, n, 0.0, 0.0, 0.0)
    _core.binary(rec, BINARY["mul"], x._buf, y._buf, p._buf, sh, st, st, 0.0)
    _core.binary_backward(rec, BINARY["mul"], 0, x._buf, y._buf, x._buf, g._buf, sh, st, st, 0.0)
    _core.where(rec, x._buf, x._buf, y._buf, wh._buf, sh, st, st, st, 0.0)
    _core.strided_copy(rec, x._buf, 0, [1, cols], xt._buf, 0, [rows, 1], [cols, rows], 0.0)
    _core.fill(rec, full._buf, rows, 2.0)
    _core.reduce_axis(rec, REDUCE["max"], x._buf, red._buf, am._buf, rows, cols, 1, 1.0, 0.0)
    _core.max_backward(rec, red._buf, am._buf, dx._buf, rows, cols, 1, 1.0)
    _core.softmax(rec, x._buf, s._buf, rows, cols, True)
    _core.softmax_backward(rec, s._buf, x._buf, dx._buf, rows, cols, True, 1.0)
    _core.embedding(rec, w._buf, ids._buf, e._buf, rows, vocab, cols)
    _core.embedding_backward(rec, x._buf, ids._buf, dw._buf, rows, vocab, cols, 0.0)
    _core.nll_pick(rec, s._buf, labels._buf, nll._buf, mask._buf, rows, cols, -100)
    _core.nll_pick_backward(rec, nll._buf, labels._buf, dx._buf, rows, cols, -100, 1.0)
    graph = rec.end_capture()
    rec.submit()
    assert len(graph) == 15
    np.testing.assert_allclose(red.numpy(), x0.max(1))
    rec.replay(graph, inputs=[(x._buf, x1)])
    rec.submit()
    np.testing.assert_allclose(y.numpy(), np.exp(x1), rtol=1e-6)
    np.testing.assert_allclose(red.numpy(), x1.max(1))
    np.testing.assert_array_equal(am.numpy(), x1.argmax(1))
    np.testing.assert_allclose(s.numpy(), torch.log_softmax(torch.from_numpy(x1), 1).numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(xt.numpy().reshape(cols, rows), x1.T)


# ---------------------------------------------------------------- argument errors


def test_argument_errors(dev):
    x = pw.zeros(12, np.float32, dev)
    small = pw.zeros(3, np.float32, dev)
    ids = pw.zeros(4, np.int32, dev)
    y = pw.zeros(12, np.float32, dev)
    cases = [
        (_core.unary, (UNARY["exp"], x._buf, small._buf, 12, 0.0, 0.0, 0.0), "unary output y holds 3 floats, needs 12"),
        (_core.unary, (99, x._buf, x._buf, 12, 0.0, 0.0, 0.0), "unknown op"),
        (_core.unary, (0, x._buf, x._buf, 0, 0.0, 0.0, 0.0), "n must be >= 1"),
        (_core.binary, (BINARY["add"], x._buf, x._buf, small._buf, [3, 4], [4, 1], [0, 1], 0.0), "output holds 3"),
        (_core.binary, (BINARY["add"], x._buf, x._buf, x._buf, [3, 4], [4, 1], [1], 0.0), "1 strides for a 2-d shape"),
        (_core.binary, (BINARY["add"], small._buf, x._buf, x._buf, [3, 4], [4, 1], [4, 1], 0.0), "operand a holds 3"),
        (_core.binary, (BINARY["add"], x._buf, x._buf, x._buf, [1] * 7, [0] * 7, [0] * 7, 0.0), "at most 6"),
        (_core.binary, (BINARY["add"], x._buf, x._buf, x._buf, [3, 0], [1, 1], [1, 1], 0.0), "zero dimension"),
        (_core.binary_backward, (BINARY["mul"], 2, x._buf, x._buf, x._buf, x._buf, [12], [1], [1], 0.0), "which"),
        (_core.strided_copy, (x._buf, 0, [1, 1], y._buf, 0, [0, 1], [3, 4], 0.0), "stride 0"),
        (_core.strided_copy, (x._buf, 5, [4, 1], small._buf, 0, [4, 1], [3, 4], 0.0), "src holds 12 floats, needs 17"),
        (_core.reduce_axis, (REDUCE["sum"], x._buf, small._buf, ids._buf, 3, 4, 1, 1.0, 0.0), "only produced by Max"),
        (_core.reduce_axis, (REDUCE["max"], x._buf, x._buf, ids._buf, 1, 2, 6, 1.0, 0.0), "argmax holds 4 int32"),
        (
            _core.reduce_axis,
            (REDUCE["sum"], x._buf, x._buf, None, 2, 7, 1, 1.0, 0.0),
            "input x holds 12 floats, needs 14",
        ),
        (_core.softmax, (x._buf, small._buf, 3, 4, False), "softmax output y"),
        (_core.embedding, (x._buf, ids._buf, x._buf, 5, 3, 2), "embedding ids holds 4 int32 values, needs 5"),
        (_core.embedding_backward, (x._buf, ids._buf, small._buf, 4, 6, 2, 0.0), "dweight"),
        (_core.nll_pick, (x._buf, ids._buf, small._buf, x._buf, 4, 3, -100), "nll_pick output holds 3"),
        (_core.max_backward, (x._buf, ids._buf, small._buf, 2, 3, 2, 0.0), "max_backward dx"),
        # in-place: one buffer cannot be bound read-only and writable in one dispatch
        (_core.unary, (UNARY["exp"], x._buf, x._buf, 12, 0.0, 0.0, 0.0), "unary: y shares a GPU buffer with x"),
        (
            _core.binary,
            (BINARY["add"], y._buf, x._buf, x._buf.view(0, 24), [6], [1], [1], 0.0),
            "binary: output shares a GPU buffer with operand b",
        ),
        (
            _core.strided_copy,
            (x._buf, 0, [1], x._buf, 6, [1], [6], 0.0),
            "strided_copy: dst shares a GPU buffer with src",
        ),
        (_core.softmax_backward, (x._buf, y._buf, y._buf, 3, 4, False, 0.0), "dx shares a GPU buffer with dy"),
        (_core.nll_pick, (x._buf, ids._buf, y._buf, x._buf, 4, 3, -100), "mask shares a GPU buffer with x"),
    ]
    for fn, args, msg in cases:
        with pytest.raises(ValueError, match=re.escape(msg)):
            run(dev, fn, *args)


# ---------------------------------------------------------------- past one storage binding


def binding_floats(dev):
    return dev.limits["max_storage_buffer_binding_size"] // 4


@pytest.mark.slow
def test_unary_past_binding_limit(dev, rng):
    n = binding_floats(dev) + 4099
    x = rng.standard_normal(n, dtype=np.float32)
    y = poisoned(dev, n)
    tx = T(dev, x)
    run(dev, _core.unary, UNARY["mul_scalar"], tx._buf, y._buf, n, -1.5, 0.0, 0.0)
    np.testing.assert_array_equal(y.numpy(), x * np.float32(-1.5))
    dx = poisoned(dev, n)
    run(dev, _core.unary_backward, UNARY["neg"], tx._buf, tx._buf, tx._buf, dx._buf, n, 0.0, 0.0, 0.0)
    np.testing.assert_array_equal(dx.numpy(), -x)


@pytest.mark.slow
def test_binary_past_binding_limit(dev, rng):
    cols = binding_floats(dev) // 2 + 33  # two rows exceed one binding
    shape = (2, cols)
    a = rng.standard_normal(shape, dtype=np.float32)
    b = rng.standard_normal((1, cols), dtype=np.float32)  # row broadcast
    out = poisoned(dev, shape)
    run(
        dev,
        _core.binary,
        BINARY["sub"],
        T(dev, a)._buf,
        T(dev, b)._buf,
        out._buf,
        list(shape),
        bcast_strides(a.shape, shape),
        bcast_strides(b.shape, shape),
        0.0,
    )
    np.testing.assert_array_equal(out.numpy(), a - b)
    del out
    # a transposed read of a past-limit operand: out[j, i] = a[i, j] * b[0, j] for a 3-row slab
    rows = 3
    a3 = rng.standard_normal((rows, binding_floats(dev) // 3 + 7), dtype=np.float32)
    n = a3.shape[1]
    out = poisoned(dev, (n, rows))
    run(
        dev,
        _core.binary,
        BINARY["mul"],
        T(dev, a3)._buf,
        T(dev, b[:, :n].copy())._buf,
        out._buf,
        [n, rows],
        [1, n],
        [1, 0],
        0.0,
    )
    np.testing.assert_array_equal(out.numpy(), a3.T * b[0, :n, None])


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["one_row", "rows", "inner"])
def test_reduce_axis_past_binding_limit(dev, rng, layout):
    total = binding_floats(dev) + 4099
    outer, length, inner = {"one_row": (1, total, 1), "rows": (3, total // 3 + 1, 1), "inner": (1, total // 5 + 3, 5)}[
        layout
    ]
    x = rng.standard_normal((outer, length, inner), dtype=np.float32)
    x[-1, length - 5, -1] = 9.0  # the max sits in the last len block
    x[0, length // 3, 0] = 9.0  # ... and ties with an earlier one: the first wins
    tx = T(dev, x)
    out = poisoned(dev, (outer, inner))
    run(dev, _core.reduce_axis, REDUCE["sum"], tx._buf, out._buf, None, outer, length, inner, 0.25, 0.0)
    ref = x.astype(np.float64).sum(1) * 0.25
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-4 * np.sqrt(length))
    am = pw.tensor(np.full((outer, inner), -7, np.int32), dev)
    out = poisoned(dev, (outer, inner))
    run(dev, _core.reduce_axis, REDUCE["max"], tx._buf, out._buf, am._buf, outer, length, inner, 1.0, 0.0)
    np.testing.assert_array_equal(out.numpy(), x.max(1))
    np.testing.assert_array_equal(am.numpy(), x.argmax(1))


def test_embedding_backward_many_ids(dev, rng):
    """More ids than one round of segments covers: rounds accumulate in order; deterministic."""
    n_ids, vocab, dim = 3 * 32768 + 100, 5, 3
    ids = rng.integers(0, vocab, n_ids).astype(np.int32)
    dy = rng.standard_normal((n_ids, dim), dtype=np.float32)
    tdy, tids = T(dev, dy), T(dev, ids)
    expected = np.zeros((vocab, dim))
    np.add.at(expected, ids, dy.astype(np.float64))
    results = []
    for _ in range(2):
        dw = poisoned(dev, (vocab, dim))
        run(dev, _core.embedding_backward, tdy._buf, tids._buf, dw._buf, n_ids, vocab, dim, 0.0)
        results.append(dw.numpy())
    assert_close(results[0], expected, atol_scale=1e-4)
    assert results[0].tobytes() == results[1].tobytes()


@pytest.mark.parametrize("beta", [0.0, 1.0, 0.5])
def test_embedding_backward_segments(dev, rng, beta):
    """nanoGPT-char shape (16,384 ids, vocab 65, dim 384): the ids split into segments summed by
    different workgroups; runs of one id straddle segment boundaries; bit-identical twice."""
    n_ids, vocab, dim = 16384, 65, 384
    ids = rng.integers(0, vocab, n_ids).astype(np.int32)
    ids[300:1800] = 7  # crosses several segment boundaries (every 512 ids or more)
    ids[8000:8300:3] = 64
    ids[ids == 3] = 4  # row 3 gets no ids: exact zeros (times beta)
    ids[5] = -1
    ids[9000] = vocab  # out of range: contribute nothing
    dy = rand(rng, n_ids, dim)
    ok = (ids >= 0) & (ids < vocab)
    expected = np.zeros((vocab, dim))
    np.add.at(expected, ids[ok], dy[ok].astype(np.float64))
    base = rand(rng, vocab, dim)
    expected = expected + beta * base.astype(np.float64)
    tdy, tids = T(dev, dy), T(dev, ids)
    results = []
    for _ in range(2):
        dw = T(dev, base) if beta != 0.0 else poisoned(dev, (vocab, dim))
        run(dev, _core.embedding_backward, tdy._buf, tids._buf, dw._buf, n_ids, vocab, dim, beta)
        results.append(dw.numpy())
    assert_close(results[0], expected, atol_scale=1e-5)
    assert results[0].tobytes() == results[1].tobytes()
    np.testing.assert_array_equal(results[0][3], np.float32(beta) * base[3])


def test_embedding_backward_large_table_one_segment(dev, rng):
    """A table past the partials' budget (16M floats / 2) takes the single-segment path: exactly the
    float32 sequential sum in increasing id position."""
    n_ids, vocab, dim = 600, 70000, 130
    ids = rng.integers(0, 40, n_ids).astype(np.int32)
    ids[::7] = vocab - 1
    dy = rand(rng, n_ids, dim)
    dw = poisoned(dev, (vocab, dim))
    run(dev, _core.embedding_backward, T(dev, dy)._buf, T(dev, ids)._buf, dw._buf, n_ids, vocab, dim, 0.0)
    seq = np.zeros((vocab, dim), np.float32)
    for i in range(n_ids):
        seq[ids[i]] += dy[i]
    np.testing.assert_array_equal(dw.numpy(), seq)
    # beta scales the old table first (rows of other workgroups' vocabulary blocks too), then the same sums
    base = rand(rng, vocab, dim)
    dw = T(dev, base)
    run(dev, _core.embedding_backward, T(dev, dy)._buf, T(dev, ids)._buf, dw._buf, n_ids, vocab, dim, 0.5)
    acc = np.float32(0.5) * base
    for i in range(n_ids):
        acc[ids[i]] += dy[i]
    np.testing.assert_array_equal(dw.numpy(), acc)


@pytest.mark.parametrize("padding_idx", [0, 3, -1])
@pytest.mark.parametrize("device_ids", [False, True])
def test_embedding_padding_idx_like_torch(dev, rng, padding_idx, device_ids):
    """nn.Embedding(padding_idx): that row starts at zeros and gets no gradient from the lookup;
    with the weight also used by a product (a tied output layer), the padding row keeps that
    product's gradient, as torch's; a second backward accumulates."""
    vocab, dim = 7, 5
    ids = rng.integers(0, vocab, (4, 6)).astype(np.int32)
    ids[0, :3] = padding_idx % vocab
    emb = pw.nn.Embedding(vocab, dim, padding_idx=padding_idx, device=dev, seed=3)
    assert not emb.weight.numpy()[padding_idx].any()
    ref = torch.nn.Embedding(vocab, dim, padding_idx=padding_idx).double()
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(emb.weight.numpy().astype(np.float64)))
    h = rand(rng, 3, dim)
    for _ in range(2):
        ours_ids = pw.tensor(ids, dev) if device_ids else ids
        y = emb(ours_ids)
        (y * y).sum().backward()
        (pw.tensor(h, dev) @ emb.weight.T).sum().backward()  # the tied use
        r = ref(torch.from_numpy(ids.astype(np.int64)))
        (r * r).sum().backward()
        (torch.from_numpy(h.astype(np.float64)) @ ref.weight.T).sum().backward()
    assert_close(y.numpy(), r.detach().numpy())
    assert_close(emb.weight.grad.numpy(), ref.weight.grad.numpy())
    with pytest.raises(ValueError, match="padding_idx"):
        pw.nn.Embedding(vocab, dim, padding_idx=vocab)
    with pytest.raises(TypeError, match="padding_idx"):
        pw.nn.functional.embedding(ids, emb.weight, padding_idx=1.5)
