"""The Cython fast path of the element-wise binary ops (_core.binary_fast,
tried first by Tensor's operators and functions._binary): the same results,
exceptions, autograd records and batch tokens as the Python path
(functions._binary_tensors), which every call it declines falls to."""

import numpy as np
import pytest
import torch

import pywgtrain as pw
import pywgtrain.functions as F
from pywgtrain import _core
from pywgtrain._opcodes import BINARY
from helpers import rand, stream_schedule

OPS = {
    "add": (lambda a, b: a + b, np.add),
    "sub": (lambda a, b: a - b, np.subtract),
    "mul": (lambda a, b: a * b, np.multiply),
    "div": (lambda a, b: a / b, np.divide),
    "maximum": (F.maximum, np.maximum),
    "minimum": (F.minimum, np.minimum),
    "gt": (F.gt, lambda a, b: (a > b).astype(np.float64)),
}
SHAPES = [
    ((1,), (1,)),
    ((7,), (7,)),
    ((33, 129), (33, 129)),
    ((129, 1), (1, 33)),
    ((7, 1, 5), (5,)),
    ((), (3, 7)),
    ((), ()),
    ((2, 1, 3, 1, 2, 3), (1, 3, 1, 4, 1, 3)),
]


@pytest.fixture
def python_path(monkeypatch):
    """Every binary op on the Python path: the fast entry declines all calls."""
    monkeypatch.setattr(_core, "binary_fast", lambda op, a, b: None)


def _pair(rng, dev, sa, sb):
    a, b = rand(rng, *sa), rand(rng, *sb)
    b = np.where(np.abs(b) < 0.1, 0.5, b).astype(np.float32)  # no division by ~0
    return a, b, pw.tensor(a, dev), pw.tensor(b, dev)


@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize("sa,sb", SHAPES)
def test_results_match_numpy_and_the_python_path(dev, rng, monkeypatch, name, sa, sb):
    op, ref = OPS[name]
    a, b, x, y = _pair(rng, dev, sa, sb)
    assert _core.binary_fast(BINARY[name], x, y) is not None  # the fast path takes these
    fast = op(x, y)
    expected = ref(a.astype(np.float64), b.astype(np.float64))
    assert fast.shape == expected.shape and fast.dtype == np.float32 and fast.is_contiguous()
    np.testing.assert_allclose(fast.numpy(), expected, rtol=1e-6, atol=1e-6)
    monkeypatch.setattr(_core, "binary_fast", lambda op, a, b: None)
    slow = op(x, y)
    assert slow.shape == fast.shape
    np.testing.assert_array_equal(fast.numpy(), slow.numpy())


def _declined(dev, rng):
    x = pw.tensor(rand(rng, 4, 6), dev)
    other = pw.Device()
    return {
        "strided view": (x[:, ::2], pw.tensor(rand(rng, 4, 3), dev)),
        "unaligned view": (x[1:2, 1:4], pw.tensor(rand(rng, 1, 3), dev)),
        "scalar": (x, 2.0),
        "numpy": (x, rand(rng, 4, 6)),
        "float16": (x.half(), x.half()),
        "mixed dtypes": (x, x.half()),
        "int32": (x, pw.tensor(np.ones((4, 6), np.int32), dev)),
        "other device": (x, pw.tensor(rand(rng, 4, 6), other)),
        "not broadcastable": (x, pw.tensor(rand(rng, 5), dev)),
        "7-D": (pw.tensor(rand(rng, 1, 1, 1, 1, 1, 1, 2), dev), pw.tensor(rand(rng, 2), dev)),
    }


def _outcome(fn):
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - the exception itself is the result compared
        return type(e), str(e)
    return out.dtype, out.shape, out.numpy().tobytes()


@pytest.mark.parametrize(
    "case",
    [
        "strided view",
        "unaligned view",
        "scalar",
        "numpy",
        "float16",
        "mixed dtypes",
        "int32",
        "other device",
        "not broadcastable",
        "7-D",
    ],
)
@pytest.mark.parametrize("name", ["add", "sub", "mul", "div"])
def test_other_calls_fall_to_the_python_path_unchanged(dev, rng, monkeypatch, case, name):
    """What the fast path declines gives the Python path's result or exception (type and message)."""
    a, b = _declined(dev, rng)[case]
    assert _core.binary_fast(BINARY[name], a, b) is None
    op = OPS[name][0]
    got = _outcome(lambda: op(a, b))
    monkeypatch.setattr(_core, "binary_fast", lambda op, a, b: None)
    assert got == _outcome(lambda: op(a, b))
    if case in ("other device", "int32", "not broadcastable", "7-D"):  # float16 mixes promote, as torch
        assert isinstance(got[0], type) and issubclass(got[0], Exception), got


@pytest.mark.parametrize("grad_on", [True, False])
def test_autograd_matches_torch(dev, rng, grad_on):
    a, b = rand(rng, 7, 1, 33), rand(rng, 5, 1)
    b = np.where(np.abs(b) < 0.1, 0.5, b).astype(np.float32)
    x, y = pw.tensor(a, dev, requires_grad=True), pw.tensor(b, dev, requires_grad=True)
    tx, ty = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    with pw.set_grad_enabled(grad_on):
        z = ((x + y) * x - y / x * 0.5) / y
    if not grad_on:  # under no_grad: no record, as the Python path
        assert not z.requires_grad and z.grad_fn is None
        return
    assert z.requires_grad and z.grad_fn is not None
    tz = ((tx + ty) * tx - ty / tx * 0.5) / ty
    np.testing.assert_allclose(z.numpy(), tz.detach().numpy(), rtol=1e-5, atol=1e-5)
    z.sum().backward()
    tz.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(y.grad.numpy(), ty.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_one_operand_requiring_grad(dev, rng):
    a, b = rand(rng, 33), rand(rng, 33)
    x, y = pw.tensor(a, dev, requires_grad=True), pw.tensor(b, dev)
    z = x * y
    assert z.requires_grad and not y.requires_grad
    z.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), b, rtol=1e-6)
    assert y.grad is None
    assert not (y * y).requires_grad


def test_batch_tokens_inside_and_outside_a_batch(dev, rng):
    x, y = pw.tensor(rand(rng, 129), dev), pw.tensor(rand(rng, 129), dev)
    token = dev._stream.token  # z's, also if z completes a chunk and its submission starts a new token
    z = x + y
    assert z._batch is token
    with dev.batch():
        w = x * y
        assert w._batch is dev._current_batch_token() and w._batch is not dev._stream.token
    np.testing.assert_allclose(w.numpy(), x.numpy().astype(np.float64) * y.numpy(), rtol=1e-6)
    np.testing.assert_allclose(z.numpy(), x.numpy().astype(np.float64) + y.numpy(), rtol=1e-6)


def test_a_discarded_batch_makes_fast_results_raise(dev, rng):
    x, y = pw.tensor(rand(rng, 7), dev), pw.tensor(rand(rng, 7), dev)
    with pytest.raises(KeyError):
        with dev.batch():
            z = x + y
            raise KeyError("boom")
    with pytest.raises(RuntimeError, match="discarded by KeyError"):
        z.numpy()


def test_the_stream_submits_in_doubling_chunks(dev, rng):
    x = pw.tensor(rand(rng, 33), dev)
    dev.synchronize()
    before = dev._stream.submits
    y = x
    n = 3 * pw.Device.BATCH_SUBMIT_COMMANDS + 3
    for _ in range(n):
        y = y + x
    # 1, 2, ..., 32, then whole chunks of BATCH_SUBMIT_COMMANDS (64): 8 submissions, 4 pending.
    assert (dev._stream.submits - before, dev._stream.rec.pending) == stream_schedule(n) == (8, 4)
    np.testing.assert_allclose(y.numpy(), x.numpy().astype(np.float64) * (n + 1), rtol=1e-5)


def test_a_failed_recording_discards_the_stream(dev, rng):
    """A command that fails to record discards the stream's open recording, fast path or not."""
    dev.synchronize()
    x, y = pw.tensor(rand(rng, 50), dev), pw.tensor(rand(rng, 50), dev)
    w = x - y  # fast, the stream's first chunk after the uploads' flush: submitted at once
    z = x + y  # fast, recorded, not submitted
    assert dev._stream.rec.pending == 1
    with pytest.raises(pw.ValidationError):
        with dev._recording() as rec:
            _core._inject_invalid_binding(rec, x._buf)
    with pytest.raises(RuntimeError, match="never ran: a later operation failed to record"):
        z.numpy()
    np.testing.assert_allclose(w.numpy(), x.numpy().astype(np.float64) - y.numpy(), rtol=1e-6)
    np.testing.assert_allclose((x + y).numpy(), x.numpy().astype(np.float64) + y.numpy(), rtol=1e-6)


# -- matrix products: _core.gemm_fast, tried first by pw.gemm, matmul / @ and F.linear --

GEMM_SHAPES = [(1, 1, 1), (7, 33, 129), (33, 1, 7), (129, 7, 33), (64, 65, 66)]


def _python_gemm(monkeypatch):
    monkeypatch.setattr(_core, "gemm_fast", lambda *args: None)


@pytest.mark.parametrize("m,n,k", GEMM_SHAPES)
@pytest.mark.parametrize("mode", ["NN", "NT", "TN", "TT"])
def test_gemm_matches_numpy_and_the_python_path(dev, rng, monkeypatch, m, n, k, mode):
    ta, tb = mode[0] == "T", mode[1] == "T"
    a, b = rand(rng, *((k, m) if ta else (m, k))), rand(rng, *((n, k) if tb else (k, n)))
    x, y = pw.tensor(a, dev), pw.tensor(b, dev)
    fast = pw.gemm(x, y, trans_a=ta, trans_b=tb)
    expected = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)
    np.testing.assert_allclose(fast.numpy(), expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
    _python_gemm(monkeypatch)
    slow = pw.gemm(x, y, trans_a=ta, trans_b=tb)
    assert (fast.shape, fast._version) == (slow.shape, slow._version)
    np.testing.assert_array_equal(fast.numpy(), slow.numpy())


@pytest.mark.parametrize("m,n,k", GEMM_SHAPES)
@pytest.mark.parametrize("lead", [(), (3,)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_and_matmul_match_numpy_and_the_python_path(dev, rng, monkeypatch, m, n, k, lead, with_bias):
    a, w, bias = rand(rng, *lead, m, k), rand(rng, n, k), rand(rng, n)
    x, tw, tbias = pw.tensor(a, dev), pw.tensor(w, dev), pw.tensor(bias, dev) if with_bias else None
    ww = pw.tensor(np.ascontiguousarray(w.T), dev)
    expected = a.astype(np.float64) @ w.T.astype(np.float64) + (bias if with_bias else 0.0)
    fast = [pw.nn.functional.linear(x, tw, tbias)]
    if not lead:
        fast.append(x @ ww)
    np.testing.assert_allclose(fast[0].numpy(), expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
    _python_gemm(monkeypatch)
    slow = [pw.nn.functional.linear(x, tw, tbias)] + ([x @ ww] if not lead else [])
    for f, s in zip(fast, slow):
        assert f.shape == s.shape and not f.requires_grad
        np.testing.assert_array_equal(f.numpy(), s.numpy())


def _declined_gemm(dev, rng):
    x, w = pw.tensor(rand(rng, 8, 6), dev), pw.tensor(rand(rng, 6, 6), dev)
    grad_w = pw.tensor(rand(rng, 6, 6), dev, requires_grad=True)
    return {
        "requires grad": (x, grad_w),
        "strided view": (x[:, ::2], pw.tensor(rand(rng, 3, 6), dev)),
        "numpy": (x, rand(rng, 6, 6)),
        "float16": (x.half(), w.half()),
        "int32": (x, pw.tensor(np.ones((6, 6), np.int32), dev)),
        "other device": (x, pw.tensor(rand(rng, 6, 6), pw.Device())),
        "inner dimensions": (x, pw.tensor(rand(rng, 5, 6), dev)),
        "1-D": (x, pw.tensor(rand(rng, 6), dev)),
    }


@pytest.mark.parametrize(
    "case", ["requires grad", "strided view", "numpy", "float16", "int32", "other device", "inner dimensions", "1-D"]
)
def test_other_products_fall_to_the_python_path_unchanged(dev, rng, monkeypatch, case):
    a, b = _declined_gemm(dev, rng)[case]
    calls = {
        "linear": lambda: pw.nn.functional.linear(a, b),
        "matmul": lambda: a @ b,
    }
    if case != "requires grad":  # pw.gemm takes no autograd: that case is its plain one
        calls["gemm"] = lambda: pw.gemm(a, b, trans_b=True)
    got = {name: _outcome(fn) for name, fn in calls.items()}
    _python_gemm(monkeypatch)
    for name, fn in calls.items():
        assert got[name] == _outcome(fn), name


def test_products_under_autocast_and_no_grad(dev, rng):
    x, w = pw.tensor(rand(rng, 8, 16), dev), pw.tensor(rand(rng, 4, 16), dev, requires_grad=True)
    with pw.autocast(dev):
        assert _core.gemm_fast(_core.GEMM_LINEAR, x, w.detach(), None, False, True) is None
        y = pw.nn.functional.linear(x, w.detach())
    assert y.dtype == np.float16  # autocast's rule, from the Python path
    with pw.no_grad():
        assert _core.gemm_fast(_core.GEMM_LINEAR, x, w, None, False, True) is not None  # no record to make
        z = pw.nn.functional.linear(x, w)
    assert not z.requires_grad
    assert _core.gemm_fast(_core.GEMM_LINEAR, x, w, None, False, True) is None
    out = pw.nn.functional.linear(x, w)
    assert out.requires_grad
    out.sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), np.broadcast_to(x.numpy().sum(0), (4, 16)), rtol=1e-4, atol=1e-4)


def test_parameters_take_the_fast_path(dev, rng):
    p = pw.nn.Parameter(rand(rng, 4, 16), dev)
    x = pw.tensor(rand(rng, 4, 16), dev)
    z = p * x  # a subclass of Tensor, requiring grad
    assert z.requires_grad and z.grad_fn is not None
    z.sum().backward()
    np.testing.assert_allclose(p.grad.numpy(), x.numpy(), rtol=1e-6)
    with pw.no_grad():
        y = pw.nn.functional.linear(x, p)
    np.testing.assert_allclose(y.numpy(), x.numpy().astype(np.float64) @ p.numpy().T, rtol=1e-4, atol=1e-4)
