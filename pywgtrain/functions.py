"""Differentiable tensor ops: forward and backward are recorded GPU work.

Each op checks its arguments, records its forward kernel(s), and, when an
input requires grad, attaches a backward (see autograd.py) that writes each
input's gradient through a sink. Kernels: elementwise.wgsl (unary, binary,
where, strided copies, fill), axis.wgsl (reductions, softmax), embedding.wgsl
(gather and its deterministic backward, NLL pick), gemm.wgsl (matmul, fused
linear), layernorm.wgsl (fused LayerNorm), dropout.wgsl (dropout from the GPU
random state of pywgtrain.random). The names and semantics follow PyTorch; ``docs/ops.md`` lists them.
"""

from __future__ import annotations

import builtins
import functools
import math
import numbers
import warnings
import sys
from typing import Any, Callable, Optional, Sequence, Union, cast

import numpy as np

from . import _core
from ._opcodes import BINARY, REDUCE, UNARY
from .autocast import _state as _autocast_state
from .autograd import _state as _grad_state
from .autograd import attach, copy_into, copy_mask, is_grad_enabled, needs_grad
from ._typing import Dims, ShapeLike
from .device import default_device
from .random import default_generator
from .tensor import (
    Labels,
    Operand,
    Tensor,
    TensorLike,
    _FLOAT32,
    _HALF,
    _check_flag,
    _make_view,
    _register_ops,
    _result,
    _shape_arg,
    empty,
    full,
    tensor,
    zeros,
)

MAX_DIMS = 6  # kernels index up to this many dimensions (tensor_ops.hpp kMaxDims)
ACTIVATIONS = {None: 0, "none": 0, "relu": 1, "gelu_tanh": 2, "gelu": 3, "silu": 4}


# -- argument handling ---------------------------------------------------------
def _device_of(*xs):
    for x in xs:
        if isinstance(x, Tensor):
            return x.device
    return default_device()


def _is_scalar(x):
    # type() first: numbers.Real is an ABC, whose isinstance is slow, and this runs per operand.
    if type(x) is float or type(x) is int:
        return True
    return isinstance(x, numbers.Real) and not isinstance(x, bool) or isinstance(x, (np.floating, np.integer))


def _float_tensor(x, dev, op, name, dtype=_FLOAT32):
    if isinstance(x, Tensor):
        if x.device is not dev:
            raise ValueError(f"{op}: {name} lives on {x.device!r}, the other operand on {dev!r}")
        if x.dtype != dtype:
            if dtype == _HALF:
                raise TypeError(
                    f"{op}: {name} must be float16 like input, got {x.dtype.name} (no mixed dtypes, as torch)"
                )
            hint = " (int32 tensors hold ids and labels)" if x.dtype == np.int32 else " (cast it with .float())"
            raise TypeError(f"{op}: {name} must be {dtype.name}, got {x.dtype.name}{hint}")
        return x if x._whole else _dense(x)
    if isinstance(x, np.ndarray):
        if x.dtype != dtype:  # no silent casts (torch refuses mixed dtypes too)
            raise TypeError(f"{op}: {name} must have dtype {dtype.name}, got {x.dtype.name}")
        return tensor(np.ascontiguousarray(x), dev)
    raise TypeError(f"{op}: {name} must be a Tensor, NumPy array or real number, got {type(x).__name__}")


def _dim(d, ndim, op):
    if type(d) is not int and (isinstance(d, bool) or not isinstance(d, numbers.Integral)):
        raise TypeError(f"{op}: dim must be an int, got {d!r}")
    n = builtins.max(ndim, 1)
    if not -n <= d < n:
        raise IndexError(f"{op}: dim {d} is out of range for a tensor of {ndim} dimensions")
    return d % n


def _strides(shape):
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= d
    return tuple(reversed(out))


def _kshape(shape):
    """A shape as the kernels take it: at least one dimension."""
    return list(shape) if shape else [1]


def _check_dims(shape, op):
    if len(shape) > MAX_DIMS:
        raise ValueError(f"{op}: tensors of more than {MAX_DIMS} dimensions are not supported (shape {shape})")


def _rec(dev):
    return dev._recording()


# -- raw kernels used by forward and backward passes (no autograd) ----------------
def _unary_into(code, x, out, a=0.0, b=0.0, beta=0.0):
    with _rec(out.device) as rec:
        _core.unary(
            rec, code, x._buf, out._buf, out._numel, float(a), float(b), float(beta), _half_mask(x, None, None, out)
        )


# Operand slots of the element-wise kernels (in0, in1, in2, res; tensor_ops.hpp HalfMask): the
# bit of each operand that holds float16. Slots left 0 (unused) read as float32.
_HALF_ALL = 15


def _half_mask(x0, x1, x2, res):
    return builtins.sum(1 << i for i, t in enumerate((x0, x1, x2, res)) if t is not None and t.dtype is _HALF)


def _elem_dtype(*xs):
    """The dtype of an element-wise op's float tensor operands: float16 when every one is, else
    float32; None where float16 and float32 mix (torch promotes to float32: the caller returns
    NotImplemented and _dtype_rules casts). Python scalars take the tensors' dtype."""
    dt = None
    for x in xs:
        d = getattr(x, "dtype", None)
        if d is None or (d != _HALF and d != _FLOAT32):
            continue
        if dt is not None and d != dt:
            return None
        dt = d
    return _HALF if dt == _HALF else _FLOAT32


def _expand_into(src, src_shape, out, beta=0.0):
    """out (contiguous) += broadcast of src (shape src_shape, right-aligned) to out.shape."""
    shape = _kshape(out.shape)
    _check_dims(shape, "expand")
    pad = (1,) * (len(shape) - len(src_shape)) + tuple(src_shape)
    st = _strides(pad)
    src_strides = [0 if p == 1 and s != 1 else t for p, s, t in zip(pad, shape, st)]
    with _rec(out.device) as rec:
        _core.strided_copy(
            rec,
            src._buf,
            0,
            src_strides,
            out._buf,
            0,
            list(_strides(shape)),
            shape,
            float(beta),
            _half_mask(src, None, None, out),
        )


def _zero(t):
    with _rec(t.device) as rec:
        _core.fill(rec, t._buf, t._numel, 0.0, t.dtype is _HALF)


def _reduce_raw(x, shape, axis, op="sum", scale=1.0, out=None, beta=0.0, argmax=None):
    """Reduce x (of `shape`; float32 or float16) along `axis` keeping the dimension; returns the
    float32 result."""
    outer = math.prod(shape[:axis])
    length = shape[axis]
    inner = math.prod(shape[axis + 1 :])
    if out is None:
        out = empty(tuple(shape[:axis]) + (1,) + tuple(shape[axis + 1 :]), np.float32, x.device)
    with _rec(x.device) as rec:
        _core.reduce_axis(
            rec,
            REDUCE[op],
            x._buf,
            out._buf,
            None if argmax is None else argmax._buf,
            outer,
            length,
            inner,
            float(scale),
            float(beta),
            x.dtype is _HALF,
        )
    return out


def _narrowed(x):
    """A float32 tensor rounded to float16 (a new tensor, no autograd)."""
    out = _result(x.shape, x.device, _HALF)
    _unary_into(UNARY["copy"], x, out)
    return out


def _sum_to_sink(g, sink, owned):
    """Reduce g over the dimensions broadcasting added to the sink's tensor, into the sink
    (a float16 g is summed in float32, as torch's half sums, and rounded once)."""
    target = tuple(sink.shape)
    if g.shape == target:
        sink.put(g, owned=owned)
        return
    if g._numel == math.prod(target):  # only size-1 dims differ
        if all(a == b for a, b in zip(_squeeze_shape(g.shape), _squeeze_shape(target))):
            sink.put(g.detach().reshape(target), owned=owned)
            return
    if g.dtype is _HALF:  # the reduce kernels read float16 and sum in float32
        part = _Collect(target, g.device)
        _reduce_into(g, part)
        sink.put(_narrowed(part.value), owned=True)
        return
    _reduce_into(g, sink)


def _reduce_into(g, sink):
    """Sum g over the dimensions it has beyond the sink's shape and those where the sink has size
    1, into sink.target() (float32)."""
    target = tuple(sink.shape)
    cur, shape = g, list(g.shape)
    lead = len(shape) - len(target)
    # Leading dimensions first (one pass over the merged leading block), then
    # each size-1 dimension of the target, in the target's coordinates.
    steps = [("lead", lead)] if lead > 0 else []
    steps += [("axis", d) for d, s in enumerate(target) if s == 1 and shape[lead + d] != 1]
    for i, (kind, arg) in enumerate(steps):
        if kind == "lead":
            rshape, axis = [math.prod(shape[:arg])] + shape[arg:], 0
        else:
            rshape, axis = shape, arg
        if i == len(steps) - 1:
            dst, beta = sink.target()
            _reduce_raw(cur, rshape, axis, out=dst, beta=beta)
            return
        cur = _reduce_raw(cur, rshape, axis)
        if kind == "lead":
            shape = shape[arg:]
        else:
            shape[axis] = 1


def _squeeze_shape(s):
    return tuple(d for d in s if d != 1)


class _Collect:
    """A sink that keeps what it is given: the float32 sums of a float16 gradient, rounded after."""

    def __init__(self, shape, dev):
        self.shape, self.dev, self.value = shape, dev, None

    def target(self):
        self.value = empty(self.shape, np.float32, self.dev)
        return self.value, 0.0

    def put(self, g, owned=True):
        self.value = g


def _attach_launch(out, name, x, launch, keep=()):
    """Attach to ``out`` a backward that is one recorded kernel launch writing
    ``x``'s gradient: ``launch(rec, g, dst, beta)`` with the upstream gradient's
    and the target's buffers (``beta`` 1.0 accumulates into the target);
    ``keep``: the tensors whose values the launch reads (see autograd.attach)."""

    def backward(g, sinks):
        dst, beta = sinks[0].target()
        with _rec(g.device) as rec:
            launch(rec, g._buf, dst._buf, float(beta))

    return attach(out, name, [x], backward, keep=keep)


# Unary ops whose gradient does not read x or y.
_UNARY_LINEAR = frozenset(("copy", "neg", "add_scalar", "rsub_scalar", "mul_scalar"))


# -- element-wise ----------------------------------------------------------------
def _unary(name, x, a=0.0, b=0.0):
    code = UNARY[name]
    x = _float_tensor(x, _device_of(x), name, "input", _elem_dtype(x))  # float32 or float16
    out = _result(x.shape, x.device, x.dtype)
    _unary_into(code, x, out, a, b)
    if needs_grad(x):
        xb, yb, n, fa, fb = x._buf, out._buf, x._numel, float(a), float(b)
        half = _HALF_ALL if x.dtype is _HALF else 0  # x, y, dy and dx share x's dtype
        _attach_launch(
            out,
            name,
            x,
            lambda rec, g, dst, beta: _core.unary_backward(rec, code, xb, yb, g, dst, n, fa, fb, beta, half),
            keep=() if name in _UNARY_LINEAR else (x, out),
        )
    return out


def _elementwise(name: str) -> Callable[[TensorLike], Tensor]:
    """The public one-argument op ``name`` (torch's name), differentiable."""

    def op(x: TensorLike) -> Tensor:
        return _unary(name, x)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"Element-wise ``{name}`` of a float32 or float16 tensor (``torch.{name}``); differentiable."
    return op


neg = _elementwise("neg")
abs = _elementwise("abs")  # noqa: A001 - torch's name
exp = _elementwise("exp")
log = _elementwise("log")
sqrt = _elementwise("sqrt")
rsqrt = _elementwise("rsqrt")
tanh = _elementwise("tanh")
sigmoid = _elementwise("sigmoid")
relu = _elementwise("relu")
silu = _elementwise("silu")


def gelu(x: TensorLike, approximate: str = "none") -> Tensor:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _unary("gelu_erf" if approximate == "none" else "gelu_tanh", x)


def softplus(x: TensorLike, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """``log(1 + exp(beta * x)) / beta``, and ``x`` where ``beta * x > threshold``
    (``torch.nn.functional.softplus``); differentiable."""
    for name, v in (("beta", beta), ("threshold", threshold)):
        if not _is_scalar(v):
            raise TypeError(f"softplus: {name} must be a real number, got {type(v).__name__}")
    if beta == 0:
        raise ValueError("softplus: beta must not be 0")
    return _unary("softplus", x, float(beta), float(threshold))


def square(x: TensorLike) -> Tensor:
    return _unary("pow_scalar", x, 2.0)


def clamp(
    x: TensorLike,
    min: Optional[float] = None,  # noqa: A002 - torch's names
    max: Optional[float] = None,
) -> Tensor:
    if min is None and max is None:
        raise ValueError("clamp: at least one of min and max must be given")
    for name, v in (("min", min), ("max", max)):
        if v is not None and not _is_scalar(v):
            raise TypeError(f"clamp: {name} must be a real number, got {type(v).__name__}")
    lo = -math.inf if min is None else float(min)
    hi = math.inf if max is None else float(max)
    return _unary("clamp", x, lo, hi)


def clone(x: TensorLike) -> Tensor:
    return _unary("copy", x)


_CASTS = (np.dtype(np.float32), np.dtype(np.float16))


def to_dtype(x: Tensor, dtype: Any) -> Tensor:
    """x as ``dtype``, float32 <-> float16 (``torch.Tensor.to(dtype)``): x itself when it already
    has it; float16 rounds to nearest even, overflows to +-inf and keeps NaN. Differentiable:
    the gradient is cast back to x's dtype."""
    if not isinstance(x, Tensor):
        raise TypeError(f"to: x must be a pywgtrain.Tensor, got {type(x).__name__}")
    try:
        want = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"to: dtype must be a NumPy dtype (float32 or float16), got {dtype!r}") from None
    if want == x.dtype:
        return x
    if want not in _CASTS or x.dtype not in _CASTS:
        raise TypeError(f"to: casts run between float32 and float16, got {x.dtype.name} -> {want.name}")
    src = _dense(x)
    out = empty(x.shape, want, x.device)
    with x.device._recording() as rec:
        _core.cast(rec, src._buf, out._buf, x._numel, want == np.float16)
    return _attach_cast(out, x)


def _attach_cast(out: Tensor, x: Tensor) -> Tensor:
    """out, holding x's values in another dtype, as the differentiable result of casting x."""
    if needs_grad(x):
        src_dtype = x.dtype

        def backward(g, sinks):
            if g.dtype is _HALF and src_dtype == np.float32:
                # Widened straight into the gradient's home, adding to what is there (a parameter's
                # gradient under autocast): one pass, no float32 temporary to copy in after.
                dst, beta = sinks[0].target()
                copy_into(_dense(g.detach()), dst, beta)
                return
            cast_g = to_dtype(g.detach(), src_dtype)
            sinks[0].put(cast_g, owned=cast_g is not g)

        attach(out, "to", [x], backward)
    return out


def _filled(x: Tensor) -> Tensor:
    """The autograd record of ``x.fill_(v)`` on a graph tensor: a result over
    x's memory whose gradient to x's earlier value is zero."""

    def backward(g, sinks):
        dst, beta = sinks[0].target()
        if beta == 0.0:
            _zero(dst)

    return attach(_make_view(x, x.shape, x.stride(), x._offset), "fill", [x], backward)


def _scalar_op(name, x, s):
    return _unary(name, x, float(s))


def _broadcast(sa, sb, op):
    n = builtins.max(len(sa), len(sb))
    pa = (1,) * (n - len(sa)) + tuple(sa)
    pb = (1,) * (n - len(sb)) + tuple(sb)
    out = []
    for x, y in zip(pa, pb):
        if x != y and x != 1 and y != 1:
            raise ValueError(f"{op}: shapes {tuple(sa)} and {tuple(sb)} cannot be broadcast together")
        out.append(builtins.max(x, y))
    return tuple(out)


def _bstrides(shape, out_shape):
    pad = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    return [0 if p == 1 and o != 1 else s for p, o, s in zip(pad, out_shape, _strides(pad))] or [0]


_NO_GRAD_BINARY = ("gt", "lt", "ge", "le", "eq", "ne")


def _binary(name, a, b):
    if type(a) is Tensor and type(b) is Tensor:  # the common case: no scalar operand to look for
        out = _core.binary_fast(BINARY[name], a, b)  # float32, bindable, one device (None: any other call)
        if out is not None:
            return out
        ha, hb = a.dtype is _HALF, b.dtype is _HALF
        if ha is not hb:  # float16 with float32: computed in float32 (_dtype_rules)
            return NotImplemented
        dt = _HALF if ha else _FLOAT32
        dev = a.device
        return _binary_tensors(
            name, _float_tensor(a, dev, name, "input", dt), _float_tensor(b, dev, name, "other", dt), dev
        )
    dt = _elem_dtype(a, b)
    if dt is None:
        return NotImplemented
    dev = _device_of(a, b)
    if _is_scalar(b) and isinstance(a, Tensor) and name in ("add", "sub", "mul", "div", "pow"):
        _float_tensor(a, dev, name, "input", dt)
        s = float(b)
        if name == "add":
            return _scalar_op("add_scalar", a, s)
        if name == "sub":
            return _scalar_op("add_scalar", a, -s)
        if name == "mul":
            return _scalar_op("mul_scalar", a, s)
        if name == "div":
            return _scalar_op("mul_scalar", a, 1.0 / s) if s != 0.0 else _binary("div", a, _scalar_tensor(0.0, dev, dt))
        return _scalar_op("pow_scalar", a, s)
    if _is_scalar(a) and isinstance(b, Tensor) and name in ("add", "sub", "mul", "div"):
        _float_tensor(b, dev, name, "other", dt)
        s = float(a)
        if name == "add":
            return _scalar_op("add_scalar", b, s)
        if name == "mul":
            return _scalar_op("mul_scalar", b, s)
        if name == "sub":
            return _scalar_op("rsub_scalar", b, s)
        return _scalar_op("rdiv_scalar", b, s)
    ta = _scalar_tensor(a, dev, dt) if _is_scalar(a) else _float_tensor(a, dev, name, "input", dt)
    tb = _scalar_tensor(b, dev, dt) if _is_scalar(b) else _float_tensor(b, dev, name, "other", dt)
    return _binary_tensors(name, ta, tb, dev)


def _scalar_tensor(v, dev, dtype):
    """A Python scalar operand as a 0-d tensor of the other operand's dtype."""
    t = full((1,), float(v), dev).reshape(())
    return t if dtype is _FLOAT32 else to_dtype(t, dtype)


def _binary_tensors(name, ta, tb, dev):
    """The binary op on two tensors of ``dev`` of one dtype (float32 or float16) that kernels can
    bind as they are."""
    if ta.shape == tb.shape:  # the common case: no broadcasting to work out
        shape = ta.shape
        _check_dims(shape, name)
        kshape = _kshape(shape)
        sa = sb = list(_strides(kshape))
    else:
        shape = _broadcast(ta.shape, tb.shape, name)
        _check_dims(shape, name)
        kshape = _kshape(shape)
        sa, sb = _bstrides(ta.shape, kshape), _bstrides(tb.shape, kshape)
    out = _result(shape, dev, ta.dtype)
    code = BINARY[name]
    half = _HALF_ALL if ta.dtype is _HALF else 0
    with _rec(dev) as rec:
        _core.binary(rec, code, ta._buf, tb._buf, out._buf, kshape, sa, sb, 0.0, half)
    return _binary_grad(code, ta, tb, out, kshape, sa, sb)


_BINARY_NAMES = {code: name for name, code in BINARY.items()}


def _binary_grad(code, ta, tb, out, kshape, sa, sb):
    """``out``, the recorded binary op ``code`` of ta and tb, with its autograd record when it needs one
    (also the hook of the Cython fast path, _core.binary_fast)."""
    name = _BINARY_NAMES[code]
    if name in _NO_GRAD_BINARY or not needs_grad(ta, tb):
        return out
    # (add and sub read neither operand: their backward must not keep them alive)
    abuf, bbuf = (None, None) if name in ("add", "sub") else (ta._buf, tb._buf)
    shape, dev, dtype = out.shape, out.device, ta.dtype
    half = _HALF_ALL if dtype is _HALF else 0

    def backward(g, sinks):
        for which, sink in enumerate(sinks):
            if sink is None:
                continue
            if name == "add" or (name == "sub" and which == 0):
                _sum_to_sink(g, sink, owned=False)
                continue
            full_shape = sink.shape == shape
            if full_shape:
                dst, beta = sink.target()
            else:
                dst, beta = empty(shape, dtype, dev), 0.0
            with _rec(dev) as rec:
                if name == "sub":
                    _core.unary(rec, UNARY["neg"], g._buf, dst._buf, g._numel, 0.0, 0.0, float(beta), half)
                else:
                    _core.binary_backward(
                        rec, code, which, abuf, bbuf, g._buf, dst._buf, kshape, sa, sb, float(beta), half
                    )
            if not full_shape:
                _sum_to_sink(dst, sink, owned=True)

    return attach(out, name, [ta, tb], backward, keep=() if name in ("add", "sub") else (ta, tb))


def add(a: Operand, b: Operand, alpha: float = 1) -> Tensor:
    if alpha != 1:
        b = mul(b, alpha)
    return _binary("add", a, b)


def sub(a: Operand, b: Operand, alpha: float = 1) -> Tensor:
    if alpha != 1:
        b = mul(b, alpha)
    return _binary("sub", a, b)


def _elementwise2(name: str) -> Callable[[Operand, Operand], Tensor]:
    """The public two-operand op ``name`` (torch's name; broadcasting, scalars allowed)."""

    def op(a: Operand, b: Operand) -> Tensor:
        return _binary(name, a, b)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"Element-wise ``{name}`` with broadcasting (``torch.{name}``)."
    return op


mul = _elementwise2("mul")
div = _elementwise2("div")
maximum = _elementwise2("maximum")
minimum = _elementwise2("minimum")


def pow(a: Operand, b: Operand) -> Tensor:  # noqa: A001 - torch's name
    """``a ** b`` like torch.pow, also for a scalar base (``2.0 ** t``, ``0.0 ** t``,
    ``(-2.0) ** t``): negative bases with integer exponents are real, 0 ** 0 = 1,
    and the exponent's gradient a**b log(a) is 0 where a == 0 and b >= 0 (torch's rule)."""
    return _binary("pow", a, b)


gt = _elementwise2("gt")
lt = _elementwise2("lt")
ge = _elementwise2("ge")
le = _elementwise2("le")
eq = _elementwise2("eq")
ne = _elementwise2("ne")


def _bool_as_float(x: Any) -> Any:
    """A boolean NumPy mask as 1.0 / 0.0 float32 (torch's bool tensors; there is no bool dtype
    here); anything else as it is."""
    return x.astype(np.float32) if isinstance(x, np.ndarray) and x.dtype == np.bool_ else x


def where(condition: Operand, input: Operand, other: Operand) -> Tensor:  # noqa: A002 - torch's names
    """``input`` where ``condition`` is nonzero, else ``other`` (broadcast)."""
    dt = _elem_dtype(input, other)
    if dt is None:  # float16 with float32: computed in float32 (_dtype_rules)
        return NotImplemented
    dev = _device_of(condition, input, other)
    condition = _bool_as_float(condition)
    tc = _float_tensor(condition, dev, "where", "condition", _elem_dtype(condition))
    # (a scalar stays a float32 tensor: the kernel rounds it once into a float16 result)
    ta = (
        full((1,), float(input), dev).reshape(())
        if _is_scalar(input)
        else _float_tensor(input, dev, "where", "input", dt)
    )
    tb = (
        full((1,), float(other), dev).reshape(())
        if _is_scalar(other)
        else _float_tensor(other, dev, "where", "other", dt)
    )
    shape = _broadcast(_broadcast(tc.shape, ta.shape, "where"), tb.shape, "where")
    _check_dims(shape, "where")
    kshape = _kshape(shape)
    sc, sa, sb = (_bstrides(t.shape, kshape) for t in (tc, ta, tb))
    out = empty(shape, dt, dev)
    with _rec(dev) as rec:
        _core.where(rec, tc._buf, ta._buf, tb._buf, out._buf, kshape, sc, sa, sb, 0.0, _half_mask(ta, tb, tc, out))
    if not needs_grad(ta, tb):
        return out
    cbuf = tc._buf

    def backward(g, sinks):
        zero = full((1,), 0.0, dev)
        for which, sink in enumerate(sinks[1:]):  # sinks[0] is the condition's (never differentiated)
            if sink is None:
                continue
            full_shape = sink.shape == shape
            dst, beta = sink.target() if full_shape else (empty(shape, g.dtype, dev), 0.0)
            pick, rest = (g, zero) if which == 0 else (zero, g)
            ps = [0] * len(kshape) if pick is zero else list(_strides(kshape))
            rs = [0] * len(kshape) if rest is zero else list(_strides(kshape))
            m = _half_mask(pick, rest, tc, dst)
            with _rec(dev) as rec:
                _core.where(rec, cbuf, pick._buf, rest._buf, dst._buf, kshape, sc, ps, rs, float(beta), m)
            if not full_shape:
                _sum_to_sink(dst, sink, owned=True)

    return attach(out, "where", [None, ta, tb], backward, keep=(tc,))


# -- reductions --------------------------------------------------------------------
def _dims_arg(dim, ndim, op):
    if dim is None:
        return None
    dims = (dim,) if isinstance(dim, numbers.Integral) else tuple(dim)
    out = sorted({_dim(d, ndim, op) for d in dims})
    if len(out) != len(dims):
        raise ValueError(f"{op}: dim {dim} repeats a dimension")
    return out


def _reduced_shape(shape, dims, keepdim):
    if keepdim:
        return tuple(1 if i in dims else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in dims)


def _check_float(x: TensorLike, op: str) -> Tensor:
    """x as a float32 Tensor (NumPy arrays are uploaded to the default device)."""
    return _float_tensor(x, _device_of(x), op, "input")


def _sum_mean(x, dim, keepdim, mean, op):
    """sum / mean. A float16 input is read as it is (float32 sums, rounded once; a float16
    gradient); the result is float16, except sum's under autocast (torch's float32 list)."""
    x = _float_tensor(x, _device_of(x), op, "input", _elem_dtype(x))  # float32 or float16
    dims = _dims_arg(dim, x.ndim, op)
    shape = x.shape or (1,)
    if dims is None:
        dims = list(range(len(shape)))
    count = math.prod(shape[d] for d in dims)
    scale = 1.0 / count if mean else 1.0
    cur, cur_shape = x, list(shape)
    # Adjacent reduced dims merge into one kernel pass; separate runs reduce in turn.
    runs = []
    for d in dims:
        if runs and runs[-1][1] == d:
            runs[-1][1] = d + 1
        else:
            runs.append([d, d + 1])
    for i, (lo, hi) in enumerate(reversed(runs)):
        merged = cur_shape[:lo] + [math.prod(cur_shape[lo:hi])] + cur_shape[hi:]
        cur = _reduce_raw(cur, merged, lo, scale=scale if i == 0 else 1.0)
        cur_shape = cur_shape[:lo] + [1] * (hi - lo) + cur_shape[hi:]
    out = cur.reshape(_reduced_shape(x.shape, dims, keepdim))
    out = Tensor(out._buf, out.shape, np.float32, x.device)
    if needs_grad(x):
        in_shape = x.shape
        kept = tuple(1 if i in dims else s for i, s in enumerate(shape))

        def backward(g, sinks):
            dst, beta = sinks[0].target()
            if mean:
                tmp = empty(in_shape, np.float32, x.device)
                _expand_into(g.reshape(kept) if kept else g, kept, tmp)
                _unary_into(UNARY["mul_scalar"], tmp, dst, scale, 0.0, beta)
            else:
                _expand_into(g.reshape(kept) if kept else g, kept, dst, beta)

        attach(out, "mean" if mean else "sum", [x], backward)
    if x.dtype is _HALF and (mean or _autocast_state.dtype is None):
        return to_dtype(out, _HALF)
    return out


def sum(x: TensorLike, dim: Dims = None, keepdim: bool = False) -> Tensor:  # noqa: A001 - torch's name
    return _sum_mean(x, dim, keepdim, False, "sum")


def mean(x: TensorLike, dim: Dims = None, keepdim: bool = False) -> Tensor:
    return _sum_mean(x, dim, keepdim, True, "mean")


class _MaxResult(tuple):
    """(values, indices) like torch.return_types.max."""

    @property
    def values(self) -> Tensor:
        return self[0]

    @property
    def indices(self) -> Tensor:
        return self[1]


def max(
    x: TensorLike,
    dim: Optional[int] = None,  # noqa: A001 - torch's name
    keepdim: bool = False,
) -> Union[Tensor, _MaxResult]:
    """``max()``: the largest element (0-d); ``max(dim)``: (values, indices) along dim.
    NaN wins (the first NaN's index). As in PyTorch, ``max(dim)``'s gradient goes to the
    returned index (the first of ties), ``max()``'s splits evenly over the elements equal
    to the result (over the NaNs when it is NaN)."""
    x = _check_float(x, "max")
    if dim is None:
        return _max_all(x)
    d = _dim(dim, x.ndim, "max")
    shape = list(x.shape or (1,))
    values = empty(_reduced_shape(shape, [d], keepdim), np.float32, x.device)
    indices = empty(_reduced_shape(shape, [d], keepdim), np.int32, x.device)
    _reduce_raw(x, shape, d, "max", out=values, argmax=indices)
    if needs_grad(x):
        outer, length, inner = math.prod(shape[:d]), shape[d], math.prod(shape[d + 1 :])
        ibuf = indices._buf
        _attach_launch(
            values,
            "max",
            x,
            lambda rec, g, dst, beta: _core.max_backward(rec, g, ibuf, dst, outer, length, inner, beta),
        )
    return _MaxResult((values, indices))


def _max_all(x):
    """max() of every element, 0-d; backward as torch's evenly_distribute_backward."""
    n, dev = x._numel, x.device
    value = empty((), np.float32, dev)
    _reduce_raw(x, [1, n, 1], 1, "max", out=value)
    if needs_grad(x):
        xbuf, vbuf = x._buf, value._buf

        def backward(g, sinks):
            dst, beta = sinks[0].target()
            mask = empty((n,), np.float32, dev)
            count, share = empty((1,), np.float32, dev), empty((1,), np.float32, dev)
            with _rec(dev) as rec:
                _core.binary(rec, BINARY["eq_nan"], xbuf, vbuf, mask._buf, [n], [1], [0], 0.0)  # x == max, NaN == NaN
                _core.reduce_axis(rec, REDUCE["sum"], mask._buf, count._buf, None, 1, n, 1, 1.0, 0.0)
                _core.binary(rec, BINARY["div"], g._buf, count._buf, share._buf, [1], [0], [0], 0.0)
                # mask ? share : mask (0): exactly 0 off the max, also for an infinite g
                _core.where(rec, mask._buf, share._buf, mask._buf, dst._buf, [n], [1], [0], [1], float(beta))

        attach(value, "max", [x], backward)
    return value


def var(
    x: TensorLike,
    dim: Dims = None,
    unbiased: Optional[bool] = None,
    keepdim: bool = False,
    correction: Optional[int] = None,
) -> Tensor:
    """Variance with Bessel's correction by default (``correction=1``), as torch.var."""
    if unbiased is not None and correction is not None:
        raise ValueError("var: give unbiased or correction, not both")
    corr = (
        1 if unbiased is None and correction is None else (int(bool(unbiased)) if unbiased is not None else correction)
    )
    x = _check_float(x, "var")
    dims = _dims_arg(dim, x.ndim, "var")
    n = x._numel if dims is None else math.prod(x.shape[d] for d in dims)
    corr = 1 if corr is None else corr
    centered = x - mean(x, dim, keepdim=True)
    total = sum(centered * centered, dim, keepdim)
    denom = n - corr
    return total * (1.0 / denom) if denom > 0 else total * math.nan


def std(
    x: TensorLike,
    dim: Dims = None,
    unbiased: Optional[bool] = None,
    keepdim: bool = False,
    correction: Optional[int] = None,
) -> Tensor:
    # sqrt whose gradient is 0 where std is 0 (torch's std_backward), not inf * 0 = NaN
    return _unary("sqrt_std", var(x, dim, unbiased, keepdim, correction))


def _softmax(x, dim, log):
    """softmax / log_softmax along dim. A float16 input along the last dimension is read as it
    is (float32 math and result, a float16 input gradient; backward reads the float32 result);
    along another it is cast to float32 first (its transposes are views). The result is float32
    under autocast (torch's float32 list), float16 outside, as torch."""
    op = "log_softmax" if log else "softmax"
    x = _float_tensor(x, _device_of(x), op, "input", _elem_dtype(x))  # float32 or float16
    d = _dim(dim, x.ndim, op)
    half = x.dtype is _HALF
    if x.ndim and d != x.ndim - 1:
        y = transpose(_softmax_rows(transpose(to_dtype(x, _FLOAT32), d, -1), log, op), d, -1)
    else:
        y = _softmax_rows(x, log, op)
    return to_dtype(y, _HALF) if half and _autocast_state.dtype is None else y


def _softmax_rows(x, log, op):
    """softmax / log_softmax along the last dimension: a float32 result."""
    cols = x.shape[-1] if x.shape else 1
    rows = x._numel // cols
    half = x.dtype is _HALF
    out = _result(x.shape, x.device)
    with _rec(x.device) as rec:
        _core.softmax(rec, x._buf, out._buf, rows, cols, log, half)
    if needs_grad(x):
        yb = out._buf
        _attach_launch(
            out,
            op,
            x,
            lambda rec, g, dst, beta: _core.softmax_backward(rec, yb, g, dst, rows, cols, log, beta, half),
            keep=(out,),
        )
    return out


def _implicit_softmax_dim(x: TensorLike, dim: Optional[int], op: str) -> int:
    """torch's choice when ``dim`` is None (deprecated there, with a warning): 0 for 0-, 1- and
    3-D inputs, else 1. Not the last dimension: a silent -1 would differ from torch."""
    if dim is not None:
        return dim
    ndim = np.ndim(x) if not isinstance(x, Tensor) else x.ndim
    chosen = 0 if ndim in (0, 1, 3) else 1
    warnings.warn(
        f"Implicit dimension choice for {op} has been deprecated. Change the call to include dim=X as an argument.",
        UserWarning,
        stacklevel=3,
    )
    return chosen


def softmax(x: TensorLike, dim: Optional[int] = None) -> Tensor:
    return _softmax(x, _implicit_softmax_dim(x, dim, "softmax"), False)


def log_softmax(x: TensorLike, dim: Optional[int] = None) -> Tensor:
    return _softmax(x, _implicit_softmax_dim(x, dim, "log_softmax"), True)


def logsumexp(x: TensorLike, dim: Union[int, tuple[int, ...], list[int]], keepdim: bool = False) -> Tensor:
    """``log(sum(exp(x)))`` along ``dim`` (``torch.logsumexp``), around the max of each
    slice (detached; an infinite max is left out, as torch does, so a slice of -inf gives
    -inf and one holding +inf gives inf); differentiable, the gradient is softmax(x)."""
    t = _check_float(x, "logsumexp")
    if dim is None:
        raise TypeError("logsumexp: dim must be an int or a tuple of ints (torch requires it too)")
    dims = _dims_arg(dim, t.ndim, "logsumexp")
    m = t.detach()
    for d in dims:
        m = max(m, d, keepdim=True)[0]
    m = where(eq(abs(m), math.inf), 0.0, m)
    out = log(sum(exp(t - m), dims, keepdim=True)) + m
    return out if keepdim else out.reshape(_reduced_shape(t.shape, dims, False))


def min(  # noqa: A001 - torch's name
    x: TensorLike, dim: Optional[int] = None, keepdim: bool = False
) -> Union[Tensor, _MaxResult]:
    """``min()`` / ``min(dim)`` -> (values, indices), as ``max`` of ``-x``: NaN wins, ties
    give the first index, the gradient goes where ``max``'s would."""
    t = _check_float(x, "min")
    if dim is None:
        return -cast(Tensor, max(-t))
    values, indices = cast(_MaxResult, max(-t, dim, keepdim))
    return _MaxResult((-values, indices))


def argmax(x: TensorLike, dim: Optional[int] = None, keepdim: bool = False) -> Tensor:
    """int32 indices of the largest elements along ``dim`` (torch.argmax; int64 there); over
    the flattened tensor when ``dim`` is None. NaN wins; ties give the first index."""
    t = _check_float(x, "argmax")
    if dim is None:
        idx = cast(_MaxResult, max(t.reshape(-1), 0))[1]
        return idx.reshape((1,) * t.ndim) if keepdim else idx
    return cast(_MaxResult, max(t, dim, keepdim))[1]


def argmin(x: TensorLike, dim: Optional[int] = None, keepdim: bool = False) -> Tensor:
    """``argmax(-x)`` (torch.argmin): int32 indices of the smallest elements."""
    return argmax(-_check_float(x, "argmin"), dim, keepdim)


def isnan(x: TensorLike) -> Tensor:
    """1.0 where ``x`` is NaN, else 0.0 (torch's bool result as float32: no bool dtype here)."""
    t = _check_float(x, "isnan")
    return ne(t, t)


def isinf(x: TensorLike) -> Tensor:
    """1.0 where ``x`` is +-inf, else 0.0."""
    return eq(abs(_check_float(x, "isinf")), math.inf)


def isfinite(x: TensorLike) -> Tensor:
    """1.0 where ``x`` is neither inf nor NaN, else 0.0."""
    return lt(abs(_check_float(x, "isfinite")), math.inf)


def masked_fill(x: TensorLike, mask: Operand, value: float) -> Tensor:
    """``x`` with ``value`` where ``mask`` is true (torch.masked_fill): ``mask`` a boolean NumPy
    array or a float tensor (nonzero: true) broadcastable to ``x``; no gradient where filled."""
    t = _float_tensor(x, _device_of(x), "masked_fill", "input", _elem_dtype(x))
    if not _is_scalar(value):
        raise TypeError(f"masked_fill: value must be a real number, got {type(value).__name__}")
    shape = tuple(mask.shape) if isinstance(mask, (Tensor, np.ndarray)) else ()
    if _broadcast(shape, t.shape, "masked_fill") != t.shape:
        raise ValueError(f"masked_fill: mask of shape {shape} does not broadcast to the input's {t.shape}")
    return where(mask, float(value), t)


def _triangle(x: TensorLike, diagonal: int, lower: bool, op: str) -> Tensor:
    t = _float_tensor(x, _device_of(x), op, "input", _elem_dtype(x))
    if t.ndim < 2:
        raise ValueError(f"{op}: input must have at least 2 dimensions, got shape {t.shape}")
    if isinstance(diagonal, bool) or not isinstance(diagonal, numbers.Integral):
        raise TypeError(f"{op}: diagonal must be an int, got {diagonal!r}")
    ones = np.ones(t.shape[-2:], np.float32)
    keep = np.tril(ones, int(diagonal)) if lower else np.triu(ones, int(diagonal))
    return where(tensor(keep, t.device), t, 0.0)


def tril(x: TensorLike, diagonal: int = 0) -> Tensor:
    """The lower triangle of the last two dimensions (torch.tril), the rest 0 (NaN too)."""
    return _triangle(x, diagonal, True, "tril")


def triu(x: TensorLike, diagonal: int = 0) -> Tensor:
    """The upper triangle of the last two dimensions (torch.triu), the rest 0 (NaN too)."""
    return _triangle(x, diagonal, False, "triu")


def arange(start: float, end: Optional[float] = None, step: float = 1, dtype: Any = None, device: Any = None) -> Tensor:
    """``torch.arange``: ``[start, end)`` by ``step`` (``arange(n)``: 0..n-1), int32 when every
    bound is an int (torch: int64), else float32; made on the host, then uploaded."""
    if end is None:
        start, end = 0, start
    for name, v in (("start", start), ("end", end), ("step", step)):
        if isinstance(v, bool) or not _is_scalar(v) or not math.isfinite(float(v)):
            raise TypeError(f"arange: {name} must be a finite real number, got {v!r}")
    if step == 0:
        raise ValueError("arange: step must be nonzero")
    integral = all(isinstance(v, (int, np.integer)) for v in (start, end, step))
    dt = np.dtype(dtype) if dtype is not None else np.dtype(np.int32 if integral else np.float32)
    n = builtins.max(0, math.ceil((float(end) - float(start)) / float(step)))
    values = float(start) + np.arange(n, dtype=np.float64) * float(step)  # as torch: start + i * step
    return tensor(values.astype(dt), device)


def zeros_like(x: Tensor, dtype: Any = None) -> Tensor:
    """Zeros of ``x``'s shape, dtype (or ``dtype``) and device."""
    return zeros(x.shape, x.dtype if dtype is None else dtype, x.device)


def ones_like(x: Tensor, dtype: Any = None) -> Tensor:
    """Ones of ``x``'s shape and device, float32 (the only dtype ``ones`` makes)."""
    return full_like(x, 1.0, dtype)


def full_like(x: Tensor, fill_value: float, dtype: Any = None) -> Tensor:
    """``fill_value`` in ``x``'s shape and device; float32 or float16 (``x``'s dtype unless given)."""
    return _constant(x.shape, fill_value, x.dtype if dtype is None else dtype, x.device, "full_like")


def _constant(shape: tuple[int, ...], value: float, dtype: Any, dev, op: str) -> Tensor:
    """A new float32 or float16 tensor holding ``value`` everywhere, filled on the device (a
    float16 fill rounds the value once)."""
    dt = np.dtype(dtype)
    if dt not in (_FLOAT32, _HALF):
        raise TypeError(f"{op}: dtype must be float32 or float16, got {dt.name}")
    out = empty(shape, dt, dev)
    if out._numel:
        with _rec(dev) as rec:
            _core.fill(rec, out._buf, out._numel, float(value), dt == _HALF)
    return out


def pad(x: TensorLike, pad: Sequence[int], mode: str = "constant", value: Optional[float] = None) -> Tensor:
    """``torch.nn.functional.pad`` in constant mode: ``pad`` = (left, right) of the last
    dimension, then of the one before, ...; negative sizes crop. Differentiable (a copy into
    a filled tensor)."""
    if mode != "constant":
        raise NotImplementedError(f"pad: only mode='constant' is implemented, got {mode!r}")
    t = _float_tensor(x, _device_of(x), "pad", "input", _elem_dtype(x))
    sizes = list(pad)
    if len(sizes) % 2 or len(sizes) // 2 > t.ndim or not all(isinstance(n, numbers.Integral) for n in sizes):
        raise ValueError(f"pad: pad must be an even number (at most 2 x {t.ndim}) of ints, got {tuple(pad)}")
    fill = 0.0 if value is None else float(value)
    shape, index, crop = list(t.shape), [slice(None)] * t.ndim, t
    for k in range(len(sizes) // 2):
        d = t.ndim - 1 - k
        left, right = int(sizes[2 * k]), int(sizes[2 * k + 1])
        keep = shape[d] + builtins.min(left, 0) + builtins.min(right, 0)
        if keep < 0 or shape[d] + left + right < 0:
            raise ValueError(f"pad: padding {left, right} of dimension {d} (size {shape[d]}) leaves a negative size")
        crop = crop.narrow(d, builtins.max(-left, 0), keep)
        index[d] = slice(builtins.max(left, 0), builtins.max(left, 0) + keep)
        shape[d] += left + right
    out = _constant(tuple(shape), fill, t.dtype, t.device, "pad")
    if crop._numel:
        out[tuple(index)] = crop
    return out


def normalize(x: TensorLike, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    """``x / max(||x||_p, eps)`` along ``dim`` (torch.nn.functional.normalize); the norm's
    gradient is 0 at an all-zero slice, as torch's (not inf * 0)."""
    t = _check_float(x, "normalize")
    if p == 2.0:
        norm = _unary("sqrt_std", sum(t * t, dim, keepdim=True))  # sqrt with gradient 0 at 0
    elif p == 1.0:
        norm = sum(abs(t), dim, keepdim=True)
    else:
        total = sum(pow(abs(t), float(p)), dim, keepdim=True)
        zero = eq(total, 0.0)
        norm = where(zero, 0.0, pow(where(zero, 1.0, total), 1.0 / float(p)))
    return t / clamp(norm, float(eps), None)


# -- shape -------------------------------------------------------------------------
def _new_shape(x, shape, op):
    """The target shape of reshape/view, with -1 filled in, checked against x's size."""
    if len(shape) == 1 and not isinstance(shape[0], numbers.Integral):
        shape = tuple(shape[0])
    shape = list(_shape_arg(shape))
    if shape.count(-1) > 1:
        raise ValueError(f"{op}: only one dimension can be -1, got {tuple(shape)}")
    if any(s < -1 or s == 0 for s in shape):
        raise ValueError(f"{op}: dimensions must be >= 1 (or one -1), got {tuple(shape)}")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if x._numel % known:
            raise ValueError(f"{op}: cannot reshape a tensor of shape {x.shape} into {tuple(shape)}")
        shape[shape.index(-1)] = x._numel // known
    if math.prod(shape) != x._numel:
        raise ValueError(f"{op}: cannot reshape a tensor of shape {x.shape} ({x._numel} elements) into {tuple(shape)}")
    return tuple(shape)


def _view_op(x, shape, strides, offset, name, backward):
    """A view of x (shared memory) recorded by autograd with ``backward``."""
    out = _make_view(x, shape, strides, offset)
    if needs_grad(x):
        attach(out, name, [x], backward)
    return out


def _reshape_view(x, shape, name):
    in_shape = x.shape

    def backward(g, sinks):
        sinks[0].put(g.detach().reshape(in_shape), owned=False)

    return _view_op(x, shape, _strides(shape), x._offset, name, backward)


def reshape(x: Tensor, *shape: ShapeLike) -> Tensor:
    """A view with the new shape when x is contiguous, else a contiguous copy reshaped (as torch.reshape)."""
    shape = _new_shape(x, shape, "reshape")
    if not x.is_contiguous():
        x = contiguous(x)
    return _reshape_view(x, shape, "reshape")


def view(x: Tensor, *shape: ShapeLike) -> Tensor:
    """A view with the new shape; a non-contiguous tensor raises (use reshape), as torch.Tensor.view."""
    shape = _new_shape(x, shape, "view")
    if not x.is_contiguous():
        raise RuntimeError(
            f"view: the tensor of shape {x.shape} and strides {x.stride()} is not contiguous, so view() cannot "
            "reshape it; use .reshape(...) (which copies) or .contiguous() first"
        )
    return _reshape_view(x, shape, "view")


def contiguous(x: Tensor) -> Tensor:
    """x when contiguous, else a contiguous copy whose gradient flows back to x."""
    return x if x.is_contiguous() else _copy_of_view(x)


def _dense(x):
    """x itself when the kernels can bind its memory as it is (contiguous at an
    aligned offset), else a contiguous copy (differentiable)."""
    return x if x._bindable else _copy_of_view(x)


def _copy_of_view(x):
    out = Tensor(x._view_buffer(), x.shape, x.dtype, x.device)
    if needs_grad(x):
        attach(out, "contiguous", [x], lambda g, sinks: sinks[0].put(g, owned=False))
    return out


def flatten(x: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    if not x.shape:
        return reshape(x, 1)
    s, e = _dim(start_dim, x.ndim, "flatten"), _dim(end_dim, x.ndim, "flatten")
    return reshape(x, x.shape[:s] + (math.prod(x.shape[s : e + 1]),) + x.shape[e + 1 :])


def unsqueeze(x: Tensor, dim: int) -> Tensor:
    d = _dim(dim, x.ndim + 1, "unsqueeze")
    st = x.stride()
    inner = st[d] * x.shape[d] if d < x.ndim else 1
    return _reshape_like(x, x.shape[:d] + (1,) + x.shape[d:], st[:d] + (inner,) + st[d:], "unsqueeze")


def squeeze(x: Tensor, dim: Optional[int] = None) -> Tensor:
    st = x.stride()
    if dim is None:
        keep = [i for i, s in enumerate(x.shape) if s != 1]
    else:
        d = _dim(dim, x.ndim, "squeeze")
        if x.shape[d] != 1:
            return x
        keep = [i for i in range(x.ndim) if i != d]
    if len(keep) == x.ndim:
        return x
    return _reshape_like(x, tuple(x.shape[i] for i in keep), tuple(st[i] for i in keep), "squeeze")


def _reshape_like(x, shape, strides, name):
    """A view that only adds or drops size-1 dimensions (strided x stays strided)."""
    in_shape = x.shape

    def backward(g, sinks):
        sinks[0].put(g.detach().reshape(in_shape), owned=False)

    return _view_op(x, shape, strides, x._offset, name, backward)


def permute(x: Tensor, *dims: Union[int, Sequence[int]]) -> Tensor:
    if len(dims) == 1 and not isinstance(dims[0], numbers.Integral):
        dims = tuple(cast(Sequence[int], dims[0]))
    perm = [_dim(d, x.ndim, "permute") for d in dims]
    if sorted(perm) != list(range(x.ndim)):
        raise ValueError(f"permute: dims {dims} are not a permutation of the {x.ndim} dimensions of {x.shape}")
    st = x.stride()
    out_shape = tuple(x.shape[p] for p in perm)
    inverse = [perm.index(i) for i in range(x.ndim)]

    def backward(g, sinks):
        dst, beta = sinks[0].target()
        gst = _strides(g.shape)
        ks = _kshape(x.shape)
        with _rec(x.device) as rec:
            _core.strided_copy(
                rec,
                g._buf,
                0,
                [gst[i] for i in inverse] or [0],
                dst._buf,
                0,
                list(_strides(ks)),
                ks,
                float(beta),
                copy_mask(g, dst),
            )

    return _view_op(x, out_shape, [st[p] for p in perm], x._offset, "permute", backward)


def transpose(x: Tensor, dim0: int, dim1: int) -> Tensor:
    perm = list(range(x.ndim))
    a, b = _dim(dim0, x.ndim, "transpose"), _dim(dim1, x.ndim, "transpose")
    perm[a], perm[b] = perm[b], perm[a]
    return permute(x, perm)


def expand(x: Tensor, *shape: ShapeLike) -> Tensor:
    if len(shape) == 1 and not isinstance(shape[0], numbers.Integral):
        shape = tuple(cast(Sequence[int], shape[0]))
    shape = _shape_arg(cast(Sequence[int], shape))
    if len(shape) < x.ndim:
        raise ValueError(f"expand: the new shape {shape} has fewer dimensions than {x.shape}")
    pad = (1,) * (len(shape) - x.ndim) + x.shape
    shape = tuple(p if s == -1 else s for p, s in zip(pad, shape))
    for p, s in zip(pad, shape):
        if p != s and p != 1:
            raise ValueError(f"expand: a tensor of shape {x.shape} cannot be expanded to {shape}")
    if shape == x.shape:
        return x
    pst = (0,) * (len(shape) - x.ndim) + tuple(x.stride())
    strides = [0 if p == 1 and s != 1 else t for p, s, t in zip(pad, shape, pst)]

    def backward(g, sinks):
        _sum_to_sink(g, sinks[0], owned=False)

    return _view_op(x, shape, strides, x._offset, "expand", backward)


def _region_backward(offset, strides, shape):
    """The backward of a view that is the region (offset, strides) of its input's
    contiguous layout: the gradient lands in that region of a zeroed gradient."""
    ks = _kshape(shape)
    gst = list(_strides(ks))

    def backward(g, sinks):
        dst, beta = sinks[0].target()
        if beta == 0.0:
            _zero(dst)
        with _rec(g.device) as rec:
            _core.strided_copy(rec, g._buf, 0, gst, dst._buf, offset, list(strides) or [0], ks, 1.0, copy_mask(g, dst))

    return backward


def _slice_view(x, starts, steps, out_shape, name):
    """The view x[starts[d] :: steps[d]] of out_shape; backward writes the gradient into that region."""
    st = x.stride()
    off = builtins.sum(s * t for s, t in zip(starts, st))
    # The gradient's region in x's own (contiguous) coordinates.
    cst = _strides(x.shape)
    goff = builtins.sum(s * t for s, t in zip(starts, cst))
    backward = _region_backward(goff, [t * k for t, k in zip(cst, steps)], out_shape)
    return _view_op(x, out_shape, [t * k for t, k in zip(st, steps)], x._offset + off, name, backward)


def _rebase_view(view, value):
    """Autograd of ``view`` having been overwritten in place with ``value`` (its
    shape, already written): the view's base gets a new history that takes its
    old values outside the view's region and ``value`` inside it (PyTorch's
    CopySlices), and the view becomes a view of that. The base covers its whole
    storage, so the view's offset and strides are coordinates in the base."""
    base = view._base
    off, st, ks = view._offset, list(view.stride()) or [1], _kshape(view.shape)

    def backward(g, sinks):
        to_base, to_value = sinks
        if to_value is not None:
            dst, beta = to_value.target()
            with _rec(g.device) as rec:
                _core.strided_copy(
                    rec, g._buf, off, st, dst._buf, 0, list(_strides(ks)), ks, float(beta), copy_mask(g, dst)
                )
        if to_base is not None:  # the old values are overwritten inside the region: no gradient there
            outside = clone(g.detach())
            with _rec(g.device) as rec:
                zero = full((1,), 0.0, g.device)
                _core.strided_copy(
                    rec, zero._buf, 0, [0] * len(ks), outside._buf, off, st, ks, 0.0, copy_mask(zero, outside)
                )
            to_base.put(outside, owned=True)

    result = attach(_make_view(base, base.shape, base.stride(), 0), "copy_slices", [base, value], backward)
    base._node, base.requires_grad = result._node, True
    fresh = _view_op(base, view.shape, view.stride(), off, "as_strided", _region_backward(off, st, view.shape))
    view._node, view.requires_grad, view._view_of = fresh._node, True, base._node


def narrow(x: Tensor, dim: int, start: int, length: int) -> Tensor:
    d = _dim(dim, x.ndim, "narrow")
    size = x.shape[d]
    start = int(start) + (size if int(start) < 0 else 0)
    length = int(length)
    if not (0 <= start and length >= 1 and start + length <= size):
        raise IndexError(f"narrow: start {start} and length {length} do not fit dimension {d} of size {size}")
    starts = [0] * x.ndim
    starts[d] = start
    shape = list(x.shape)
    shape[d] = length
    return _slice_view(x, starts, [1] * x.ndim, tuple(shape), "narrow")


def select(x: Tensor, dim: int, index: int) -> Tensor:
    """The view of x at ``index`` along ``dim``, that dimension removed (torch.select)."""
    d = _dim(dim, x.ndim, "select")
    size = x.shape[d]
    i = int(index)
    if not -size <= i < size:
        raise IndexError(f"select: index {i} is out of range for dimension {d} of size {size}")
    return squeeze(narrow(x, d, i % size, 1), d)


def getitem(x: Tensor, index: object) -> Tensor:
    """Basic indexing returns a view: ints, slices (positive steps), None and
    Ellipsis; an int32 Tensor or integer array on the first axis gathers rows
    (a copy, as in PyTorch)."""
    if isinstance(index, (Tensor, np.ndarray, list)):
        return index_select(x, 0, index)
    if not isinstance(index, tuple):
        index = (index,)
    if builtins.sum(1 for i in index if i is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis")
    explicit = builtins.sum(1 for i in index if i is not None and i is not Ellipsis)
    if explicit > x.ndim:
        raise IndexError(f"too many indices for a tensor of shape {x.shape}")
    expanded = []
    for i in index:
        if i is Ellipsis:
            expanded += [slice(None)] * (x.ndim - explicit)
        else:
            expanded.append(i)
    expanded += [slice(None)] * (x.ndim - builtins.sum(1 for i in expanded if i is not None))
    starts, steps, region, out_shape, out_dims = [], [], [], [], []
    d = 0
    for i in expanded:
        if i is None:
            out_dims.append(None)
            out_shape.append(1)
            continue
        size = x.shape[d]
        if isinstance(i, slice):
            start, stop, step = i.indices(size)
            if step <= 0:
                raise ValueError(f"index: slice steps must be positive, got {i.step}")
            n = len(range(start, stop, step))
            if n == 0:
                raise IndexError(
                    f"index: slice {i} of dimension {d} (size {size}) is empty; empty tensors are not supported"
                )
            starts.append(start)
            steps.append(step)
            region.append(n)
            out_shape.append(n)
            out_dims.append(d)
        elif isinstance(i, numbers.Integral) and not isinstance(i, bool):
            j = int(i) + (size if int(i) < 0 else 0)
            if not 0 <= j < size:
                raise IndexError(f"index {int(i)} is out of bounds for dimension {d} with size {size}")
            starts.append(j)
            steps.append(1)
            region.append(1)
        else:
            raise TypeError(f"index: unsupported index {i!r} (ints, slices, None, ... and integer tensors on axis 0)")
        d += 1
    if starts == [0] * x.ndim and steps == [1] * x.ndim and tuple(region) == x.shape:
        part = _reshape_like(x, x.shape, x.stride(), "getitem")  # a new view, as torch's x[:]
    else:
        part = _slice_view(x, starts, steps, tuple(region), "getitem")
    if tuple(out_shape) == part.shape:
        return part
    pst = part.stride()
    strides = [1 if od is None else pst[od] for od in out_dims]
    return _reshape_like(part, tuple(out_shape), strides, "getitem")


def split(x: Tensor, split_size_or_sections: Union[int, Sequence[int]], dim: int = 0) -> tuple[Tensor, ...]:
    d = _dim(dim, x.ndim, "split")
    size = x.shape[d]
    if isinstance(split_size_or_sections, numbers.Integral):
        step = int(split_size_or_sections)
        if step < 1:
            raise ValueError(f"split: split_size must be >= 1, got {step}")
        sizes = [builtins.min(step, size - s) for s in range(0, size, step)]
    else:
        sizes = [int(s) for s in cast(Sequence[int], split_size_or_sections)]
        if builtins.sum(sizes) != size or any(s < 1 for s in sizes):
            raise ValueError(f"split: sections {sizes} must be >= 1 and add up to {size} (dimension {d})")
    out, start = [], 0
    for s in sizes:
        out.append(narrow(x, d, start, s))
        start += s
    return tuple(out)


def chunk(x: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    chunks = int(chunks)
    if chunks < 1:
        raise ValueError(f"chunk: chunks must be >= 1, got {chunks}")
    size = x.shape[_dim(dim, x.ndim, "chunk")]
    return split(x, -(-size // chunks), dim)


def cat(tensors: Sequence[TensorLike], dim: int = 0) -> Tensor:
    tensors = list(tensors)
    if not tensors:
        raise ValueError("cat: expected a non-empty list of tensors")
    dev = _device_of(*tensors)
    ts = [_float_tensor(t, dev, "cat", f"tensors[{i}]") for i, t in enumerate(tensors)]
    first = ts[0]
    d = _dim(dim, first.ndim, "cat")
    for i, t in enumerate(ts):
        if t.ndim != first.ndim or any(a != b for j, (a, b) in enumerate(zip(t.shape, first.shape)) if j != d):
            raise ValueError(f"cat: tensors[{i}] has shape {t.shape}, incompatible with {first.shape} along dim {d}")
    shape = list(first.shape)
    shape[d] = builtins.sum(t.shape[d] for t in ts)
    _check_dims(shape, "cat")
    out = empty(tuple(shape), np.float32, dev)
    ost = _strides(shape)
    offsets, off = [], 0
    with _rec(dev) as rec:
        for t in ts:
            offsets.append(off)
            ks = _kshape(t.shape)
            _core.strided_copy(rec, t._buf, 0, list(_strides(ks)), out._buf, off * ost[d], list(ost), ks, 0.0)
            off += t.shape[d]
    if needs_grad(*ts):
        shapes = [t.shape for t in ts]

        def backward(g, sinks):
            for sink, o, s in zip(sinks, offsets, shapes):
                if sink is None:
                    continue
                dst, beta = sink.target()
                with _rec(dev) as rec:
                    _core.strided_copy(
                        rec, g._buf, o * ost[d], list(ost), dst._buf, 0, list(_strides(s)), list(s), float(beta)
                    )

        attach(out, "cat", ts, backward)
    return out


def stack(tensors: Sequence[TensorLike], dim: int = 0) -> Tensor:
    given: list[Any] = list(tensors)  # cat checks them
    if not given:
        raise ValueError("stack: expected a non-empty list of tensors")
    d = _dim(dim, given[0].ndim + 1, "stack")
    return cat([unsqueeze(t, d) for t in given], d)


# -- indexing ------------------------------------------------------------------------
def _ids_tensor(ids, dev, op, bound=None):
    if isinstance(ids, Tensor):
        if ids.device is not dev:
            raise ValueError(f"{op}: indices live on {ids.device!r}, the weight on {dev!r}")
        if ids.dtype != np.int32:
            raise TypeError(f"{op}: indices must be an int32 tensor, got {ids.dtype.name}")
        return ids
    arr = np.asarray(ids)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{op}: indices must be integers, got dtype {arr.dtype.name}")
    if bound is not None and arr.size and (arr.min() < 0 or arr.max() >= bound):
        raise IndexError(f"{op}: indices must lie in [0, {bound}), got range [{arr.min()}, {arr.max()}]")
    return tensor(np.ascontiguousarray(arr, np.int32).reshape(arr.shape or (1,)), dev).reshape(arr.shape)


def embedding(ids: Labels, weight: Tensor, padding_idx: Optional[int] = None) -> Tensor:
    """Rows of ``weight`` [vocab, dim] picked by integer ``ids`` (any shape) ->
    [*ids.shape, dim]. Ids outside [0, vocab) in a device tensor give NaN rows.
    The backward sums rows per id in a fixed order (deterministic); ``padding_idx``
    (negative: from the end), as torch's: that row gets no gradient from this lookup."""
    if not isinstance(weight, Tensor) or weight.ndim != 2:
        raise ValueError(
            f"embedding: weight must be a 2-D Tensor, got {getattr(weight, 'shape', type(weight).__name__)}"
        )
    weight = _check_float(weight, "embedding")
    vocab, dim = weight.shape
    pad = _padding_index(padding_idx, vocab, "embedding")
    tids = _ids_tensor(ids, weight.device, "embedding", vocab)
    n = tids._numel
    out = empty(tids.shape + (dim,), np.float32, weight.device)
    with _rec(weight.device) as rec:
        _core.embedding(rec, weight._buf, tids._buf, out._buf, n, vocab, dim)
    if needs_grad(weight):
        ibuf = tids._buf

        def backward(g, sinks):
            dst, beta = sinks[0].target()
            # The padding row keeps what other uses of the weight put there (a tied output layer):
            # when accumulating, this lookup's gradient goes through a scratch first.
            part = dst if pad is None or not beta else empty(dst.shape, np.float32, dst.device)
            with _rec(g.device) as rec:
                _core.embedding_backward(rec, g._buf, ibuf, part._buf, n, vocab, dim, 0.0 if part is not dst else beta)
            if pad is not None:
                part[pad].zero_()
                if part is not dst:
                    dst.add_(part)

        attach(out, "embedding", [weight], backward, keep=(tids,))
    return out


def _padding_index(padding_idx: Optional[int], vocab: int, op: str) -> Optional[int]:
    if padding_idx is None:
        return None
    if isinstance(padding_idx, bool) or not isinstance(padding_idx, numbers.Integral):
        raise TypeError(f"{op}: padding_idx must be an int or None, got {padding_idx!r}")
    if not -vocab <= padding_idx < vocab:
        raise ValueError(f"{op}: padding_idx must be within num_embeddings ({vocab}), got {padding_idx}")
    return int(padding_idx) % vocab


def index_select(x: Tensor, dim: int, index: Labels) -> Tensor:
    if _dim(dim, x.ndim, "index_select") != 0:
        raise NotImplementedError("index_select: only dim=0 is supported (rows of a tensor)")
    rows = x.shape[0]
    flat = reshape(x, rows, -1) if x.ndim != 2 else x
    out = embedding(index, flat)
    return reshape(out, out.shape[:-1] + x.shape[1:])


# -- matrix products -------------------------------------------------------------------
def matmul(a: TensorLike, b: TensorLike) -> Tensor:
    """``a @ b`` like torch.matmul: 2-D, 1-D (vector), and batched N-D operands
    whose batch dimensions broadcast."""
    out = _core.gemm_fast(_core.GEMM_MATMUL, a, b, None, False, False)  # the plain 2-D case (None: any other)
    if out is not None:
        return out
    dev = _device_of(a, b)
    if getattr(a, "dtype", None) == np.float16:
        return _matmul_half(a, b, dev)
    ta, tb = _float_tensor(a, dev, "matmul", "input"), _float_tensor(b, dev, "matmul", "other")
    if ta.ndim == 0 or tb.ndim == 0:
        raise ValueError("matmul: both operands need at least one dimension (use * for scalars)")
    ka, kb = ta.shape[-1], tb.shape[0 if tb.ndim == 1 else -2]
    if ka != kb:
        raise ValueError(f"matmul: shapes {ta.shape} and {tb.shape}: inner dimensions {ka} and {kb} differ")
    if ta.ndim == 1 or tb.ndim == 1:  # as torch: a vector becomes [1, k] / [k, 1], that dimension dropped after
        out = matmul(reshape(ta, (1, ka)) if ta.ndim == 1 else ta, reshape(tb, (kb, 1)) if tb.ndim == 1 else tb)
        rows = (out.shape[-2],) if ta.ndim > 1 else ()
        cols = (out.shape[-1],) if tb.ndim > 1 else ()
        return reshape(out, out.shape[:-2] + rows + cols)
    if ta.ndim == 2 and tb.ndim == 2:
        return _bmm(ta, tb, False, False, 1)
    batch = _broadcast(ta.shape[:-2], tb.shape[:-2], "matmul")
    ea = expand(ta, batch + ta.shape[-2:]) if ta.shape[:-2] != batch else ta
    eb = expand(tb, batch + tb.shape[-2:]) if tb.shape[:-2] != batch else tb
    nb = math.prod(batch)
    out = _bmm(reshape(ea, (nb,) + ta.shape[-2:]), reshape(eb, (nb,) + tb.shape[-2:]), False, False, nb)
    return reshape(out, batch + out.shape[-2:])


def _matmul_half(a, b, dev):
    """2-D float16 ``a @ b`` (float32 accumulation); NotImplemented for other ranks, which
    compute in float32 (``_dtype_rules``)."""
    ops = []
    for x, name in ((a, "input"), (b, "other")):
        if isinstance(x, Tensor) and x.device is not dev:
            raise ValueError(f"matmul: {name} lives on {x.device!r}, the other operand on {dev!r}")
        if not isinstance(x, (Tensor, np.ndarray)) or x.dtype != np.float16:
            got = x.dtype.name if isinstance(x, (Tensor, np.ndarray)) else type(x).__name__
            raise TypeError(f"matmul: {name} must be float16 like input, got {got} (no mixed dtypes, as torch)")
        ops.append(_dense(x) if isinstance(x, Tensor) else tensor(np.ascontiguousarray(x), dev))
    ta, tb = ops
    if ta.ndim != 2 or tb.ndim != 2:
        return NotImplemented
    k, kb = ta.shape[1], tb.shape[0]
    if k != kb:
        raise ValueError(f"matmul: shapes {ta.shape} and {tb.shape}: inner dimensions {k} and {kb} differ")
    return _gemm_half(ta, tb, False)


def _gemm_half(a, b, tb):
    """``a @ op(b)`` of 2-D float16 tensors (``op``: transpose when ``tb``, as a linear layer's
    weight) in one float16 GEMM with float32 accumulation; its backward is two more."""
    m, k = a.shape
    n = b.shape[0] if tb else b.shape[1]
    dev = a.device
    out = _result((m, n), dev, _HALF)
    with _rec(dev) as rec:
        _core.gemm(rec, a._buf, b._buf, out._buf, m, n, k, False, tb, 1.0, 0.0, True)
    if needs_grad(a, b):
        abuf, bbuf = a._buf, b._buf

        def backward(g, sinks):
            sa, sb = sinks
            with _rec(dev) as rec:
                if sa is not None:  # dA = dC op(B)^T
                    dst, beta = sa.target()
                    _core.gemm(rec, g._buf, bbuf, dst._buf, m, k, n, False, not tb, 1.0, float(beta), True)
                if sb is not None:  # dB = A^T dC, or dC^T A for a transposed B
                    dst, beta = sb.target()
                    if tb:
                        _core.gemm(rec, g._buf, abuf, dst._buf, n, k, m, True, False, 1.0, float(beta), True)
                    else:
                        _core.gemm(rec, abuf, g._buf, dst._buf, k, n, m, True, False, 1.0, float(beta), True)

        attach(out, "matmul", [a, b], backward, keep=(a, b))
    return out


def bmm(a: TensorLike, b: TensorLike, trans_a: bool = False, trans_b: bool = False) -> Tensor:
    """Batched ``op(a[i]) @ op(b[i])`` for [batch, ., .] operands; ``trans_a`` /
    ``trans_b`` transpose each matrix without a copy (attention's Q K^T)."""
    dev = _device_of(a, b)
    ta, tb = _float_tensor(a, dev, "bmm", "input"), _float_tensor(b, dev, "bmm", "other")
    if ta.ndim != 3 or tb.ndim != 3 or ta.shape[0] != tb.shape[0]:
        raise ValueError(f"bmm: operands must be 3-D with equal batch sizes, got {ta.shape} and {tb.shape}")
    trans_a, trans_b = _check_flag("bmm", "trans_a", trans_a), _check_flag("bmm", "trans_b", trans_b)
    ka = ta.shape[1] if trans_a else ta.shape[2]
    kb = tb.shape[2] if trans_b else tb.shape[1]
    if ka != kb:
        raise ValueError(
            f"bmm: inner dimensions differ: {ta.shape} (trans_a={trans_a}) and {tb.shape} (trans_b={trans_b})"
        )
    return _bmm(ta, tb, trans_a, trans_b, ta.shape[0])


def _gemm_raw(rec, a, b, c, batch, m, n, k, ta, tb, alpha, beta):
    if batch == 1:
        _core.gemm(rec, a, b, c, m, n, k, ta, tb, alpha, beta)
    else:
        _core.gemm_batched(rec, a, b, c, batch, m, n, k, ta, tb, alpha, beta)


def _bmm(a, b, ta, tb, batch):
    """C = op(A) op(B) per batch (2-D when batch == 1 and the operands are 2-D)."""
    m = a.shape[-1] if ta else a.shape[-2]
    k = a.shape[-2] if ta else a.shape[-1]
    n = b.shape[-2] if tb else b.shape[-1]
    dev = a.device
    out_shape = (m, n) if a.ndim == 2 else (batch, m, n)
    out = empty(out_shape, np.float32, dev)
    with _rec(dev) as rec:
        _gemm_raw(rec, a._buf, b._buf, out._buf, batch, m, n, k, ta, tb, 1.0, 0.0)
    if needs_grad(a, b):
        abuf, bbuf = a._buf, b._buf

        def backward(g, sinks):
            sa, sb = sinks
            with _rec(dev) as rec:
                if sa is not None:
                    dst, beta = sa.target()
                    # dA = dC op(B)^T (or its transpose when A entered transposed)
                    if ta:
                        _gemm_raw(rec, bbuf, g._buf, dst._buf, batch, k, m, n, tb, True, 1.0, beta)
                    else:
                        _gemm_raw(rec, g._buf, bbuf, dst._buf, batch, m, k, n, False, not tb, 1.0, beta)
                if sb is not None:
                    dst, beta = sb.target()
                    if tb:
                        _gemm_raw(rec, g._buf, abuf, dst._buf, batch, n, k, m, True, ta, 1.0, beta)
                    else:
                        _gemm_raw(rec, abuf, g._buf, dst._buf, batch, k, n, m, not ta, False, 1.0, beta)

        attach(out, "matmul", [a, b], backward, keep=(a, b))
    return out


def _activation_code(activation, op):
    try:
        return ACTIVATIONS[activation]
    except (KeyError, TypeError):
        raise ValueError(
            f"{op}: activation must be one of {sorted(k for k in ACTIVATIONS if k)}, got {activation!r}"
        ) from None


def _record_linear(rec, x, w, b, r, act, y, preact, rows, out_f, in_f, half):
    """y = act(x @ w.T + b) (+ r), the pre-activation kept in ``preact`` when given. ``half``:
    float16 x, w, b, preact (y and r float16 or float32); b is then never None."""
    if r is not None and b is not None:
        _core.gemm_bias_residual(
            rec, x._buf, w._buf, b._buf, r._buf, y._buf, rows, out_f, in_f, False, True, half, y.dtype == _HALF
        )
    elif r is not None:  # no bias: the GEMM accumulates onto a copy of the residual
        _core.unary(rec, UNARY["copy"], r._buf, y._buf, y._numel, 0.0, 0.0, 0.0)
        _core.gemm(rec, x._buf, w._buf, y._buf, rows, out_f, in_f, False, True, 1.0, 1.0)
    elif b is not None:
        pbuf = None if preact is None else preact._buf
        _core.gemm_bias_act(rec, x._buf, w._buf, b._buf, y._buf, pbuf, rows, out_f, in_f, False, True, act, half)
    elif act:
        z = preact if preact is not None else empty(y.shape, np.float32, y.device)
        _core.gemm(rec, x._buf, w._buf, z._buf, rows, out_f, in_f, False, True, 1.0, 0.0)
        _core.unary(rec, UNARY[_ACT_UNARY[act]], z._buf, y._buf, y._numel, 0.0, 0.0, 0.0)
    else:
        _core.gemm(rec, x._buf, w._buf, y._buf, rows, out_f, in_f, False, True, 1.0, 0.0, half)


def _record_weight_grads(rec, dz, x, sw, sb, rows, out_f, in_f, half):
    """The weight and bias gradients of a linear layer from its pre-activation gradient dz and
    input x (``half``: all float16; the bias gradient then comes from its own column-sum pass)."""
    if sw is not None and sb is not None and not half:
        dw, bw = sw.target()
        db, bb = sb.target()
        if bw == bb:
            _core.linear_weight_grads(rec, dz._buf, x._buf, dw._buf, db._buf, rows, out_f, in_f, bw)
            return
    if sw is not None:
        dw, bw = sw.target()
        _core.gemm(rec, dz._buf, x._buf, dw._buf, out_f, in_f, rows, True, False, 1.0, bw, half)
    if sb is not None:
        db, bb = sb.target()
        _core.bias_grad(rec, dz._buf, db._buf, rows, out_f, bb, half)


def mlp(
    x: TensorLike,
    weights: Sequence[Tensor],
    biases: Sequence[Optional[Tensor]],
    activations: Sequence[Optional[str]],
    residual: Optional[TensorLike] = None,
) -> Tensor:
    """A chain of linear layers, ``h = act_i(h @ weights[i].T + biases[i])``
    from ``h = x``, as one op: each layer is one fused GEMM, and the backward
    passes every layer's input gradient through the layer before's activation
    inside the GEMM that computes it, and each layer's weight and bias
    gradients come out of one GEMM. ``residual`` (the output's shape; the last
    activation must be None): added by the last GEMM's epilogue."""
    if not len(weights) == len(biases) == len(activations) >= 1:
        raise ValueError(
            f"mlp: weights, biases and activations must have one entry per layer, got {len(weights)}, "
            f"{len(biases)} and {len(activations)}"
        )
    dev = _device_of(x, *weights, residual)
    dtype = _HALF if getattr(x, "dtype", None) == _HALF else _FLOAT32  # the weights and biases must match x
    h = _float_tensor(x, dev, "linear", "input", dtype)
    # float16 layers take a residual of either float dtype (the sum is the wider, as torch's add)
    rdtype = getattr(residual, "dtype", None)
    if dtype != _HALF or rdtype not in _CASTS:
        rdtype = _FLOAT32
    tr = None if residual is None else _float_tensor(residual, dev, "linear", "residual", rdtype)
    layers: list[tuple[Tensor, int, int, Optional[Tensor], int]] = []
    params: list[Optional[Tensor]] = []
    for i, (weight, bias, activation) in enumerate(zip(weights, biases, activations)):
        tw = _float_tensor(weight, dev, "linear", "weight" if len(weights) == 1 else f"weights[{i}]", dtype)
        tb = (
            None
            if bias is None
            else _float_tensor(bias, dev, "linear", "bias" if len(weights) == 1 else f"biases[{i}]", dtype)
        )
        if tw.ndim != 2:
            raise ValueError(f"linear: weight must be 2-D [out, in], got shape {tw.shape}")
        out_f, in_f = tw.shape
        width = layers[-1][1] if layers else (h.shape[-1] if h.ndim else 0)
        if width != in_f:
            raise ValueError(
                f"linear: input has {width} features"
                + (f" (shape {h.shape})" if not layers else f" (the output of layer {i - 1})")
                + f", weight expects {in_f}"
            )
        if tb is not None and tb.shape != (out_f,):
            raise ValueError(f"linear: bias has shape {tb.shape}, expected ({out_f},)")
        layers.append((tw, out_f, in_f, tb, _activation_code(activation, "linear")))
        params += [tw, tb]
    rows = h._numel // h.shape[-1]
    shape = h.shape[:-1] + (layers[-1][1],)
    if tr is not None:
        if layers[-1][4]:
            raise ValueError(
                f"linear: residual is only supported without an activation (act(x @ W.T + b) + residual is not "
                f"fused), got activation={activations[-1]!r}"
            )
        if tr.shape != shape:
            raise ValueError(f"linear: residual has shape {tr.shape}, the output has shape {shape}")
    half = dtype == _HALF
    if half:  # the float16 epilogues always add a bias: zeros where a layer has none
        layers = [(tw, o, i, zeros((o,), _HALF, dev) if tb is None else tb, act) for tw, o, i, tb, act in layers]
    # float16 layers with a float32 residual give float32 (torch's promotion of the add)
    out_dtype = dtype if tr is None else tr.dtype
    grad = needs_grad(h, *params, tr)
    inputs, preacts = [h], []  # each layer's input, and its pre-activation when backward needs it
    with _rec(dev) as rec:
        for i, (tw, out_f, in_f, tb, act) in enumerate(layers):
            last = i == len(layers) - 1
            y = empty(h.shape[:-1] + (out_f,), out_dtype if last else dtype, dev)
            preact = empty(y.shape, dtype, dev) if grad and act else None
            _record_linear(rec, h, tw, tb, tr if last else None, act, y, preact, rows, out_f, in_f, half)
            preacts.append(preact)
            if not last:
                inputs.append(y)
            h = y
    if not grad:
        return h

    def backward(g, sinks):
        sx, sr = sinks[0], sinks[-1]
        if sr is not None:  # d(... + residual)/d residual = 1: the upstream gradient, shared
            sr.put(g, owned=False)
        with _rec(dev) as rec:
            dz = g
            if g.dtype != dtype:  # float16 layers under a float32 sum: their output's gradient is float16
                dz = empty(g.shape, dtype, dev)
                _core.cast(rec, g._buf, dz._buf, g._numel, True)
            act = layers[-1][4]
            if act:
                dz, dy = empty(g.shape, dtype, dev), dz
                _core.activation_backward(rec, dy._buf, preacts[-1]._buf, dz._buf, dz._numel, act, half)
            for i in range(len(layers) - 1, -1, -1):
                tw, out_f, in_f, _, _ = layers[i]
                _record_weight_grads(rec, dz, inputs[i], sinks[1 + 2 * i], sinks[2 + 2 * i], rows, out_f, in_f, half)
                if i > 0:
                    below_act = layers[i - 1][4]
                    dh = empty(inputs[i].shape, dtype, dev)
                    if below_act:  # the layer below's pre-activation gradient, straight out of the GEMM
                        _core.gemm_act_grad(
                            rec,
                            dz._buf,
                            tw._buf,
                            preacts[i - 1]._buf,
                            dh._buf,
                            rows,
                            in_f,
                            out_f,
                            False,
                            False,
                            below_act,
                            half,
                        )
                    else:
                        _core.gemm(rec, dz._buf, tw._buf, dh._buf, rows, in_f, out_f, False, False, 1.0, 0.0, half)
                    dz = dh
                elif sx is not None:
                    dx, bx = sx.target()
                    _core.gemm(rec, dz._buf, tw._buf, dx._buf, rows, in_f, out_f, False, False, 1.0, bx, half)

    return attach(
        h,
        "linear" if len(layers) == 1 else "mlp",
        [inputs[0], *params, tr],
        backward,
        keep=(inputs[0], *params[::2]),  # the input and the weights: what backward reads of the caller's
    )


def linear(
    x: TensorLike,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    activation: Optional[str] = None,
    residual: Optional[TensorLike] = None,
) -> Tensor:
    """``act(x @ weight.T + bias)`` (torch.nn.functional.linear, then the
    activation) in one fused GEMM; its backward gets the weight and bias
    gradients out of one GEMM. ``residual`` (the output's shape, no
    activation): ``x @ weight.T + bias + residual``, the add of a residual
    connection done by the GEMM's epilogue. A chain of layers whose backward
    fuses each activation's derivative into the next GEMM: :func:`mlp`."""
    if activation is None and residual is None:
        out = _core.gemm_fast(_core.GEMM_LINEAR, x, weight, bias, False, True)  # the plain case (None: any other)
        if out is not None:
            return out
    return mlp(x, [weight], [bias], [activation], residual)


_ACT_UNARY = {1: "relu", 2: "gelu_tanh", 3: "gelu_erf", 4: "silu"}


# -- losses ------------------------------------------------------------------------------
def _check_reduction(reduction, op):
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{op}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _labels(target, rows, cols, ignore_index, dev, op):
    """Class labels as an int32 device tensor [rows]; host labels are checked
    for an integer dtype and range (device labels out of range give NaN)."""
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"{op}: ignore_index must be an int, got {ignore_index!r}")
    if not isinstance(target, Tensor):
        arr = np.asarray(target)
        if arr.dtype.kind not in "iu":
            raise TypeError(f"{op}: target must hold integer class indices, got dtype {arr.dtype.name}")
        bad = (arr != ignore_index) & ((arr < 0) | (arr >= cols))
        if bad.any():
            raise ValueError(
                f"{op}: target must lie in [0, {cols}) or equal ignore_index={ignore_index}; got "
                f"{arr[bad].reshape(-1)[0]}"
            )
    labels = _ids_tensor(target, dev, op)
    if labels.shape != (rows,):
        raise ValueError(f"{op}: target has shape {labels.shape}, expected ({rows},) for input of {rows} rows")
    return labels


def _class_input(input, op, dtype=_FLOAT32):  # noqa: A002 - torch's name
    x = _float_tensor(input, _device_of(input), op, "input", dtype)
    if x.ndim != 2:
        raise ValueError(f"{op}: input must be [batch, classes], got shape {x.shape}")
    return x


def _nll_pick(x: Tensor, labels: Tensor, ignore_index: int) -> tuple[Tensor, Tensor]:
    """(-x[i, target_i] per row, 0 where ignored; the rows' 1/0 mask of not ignored), differentiable
    in x."""
    rows, cols = x.shape
    dev = x.device
    picked = empty((rows,), np.float32, dev)
    mask = empty((rows,), np.float32, dev)
    with _rec(dev) as rec:
        _core.nll_pick(rec, x._buf, labels._buf, picked._buf, mask._buf, rows, cols, int(ignore_index))
    if needs_grad(x):
        lbuf, ignore = labels._buf, int(ignore_index)
        _attach_launch(
            picked,
            "nll_loss",
            x,
            lambda rec, g, dst, beta: _core.nll_pick_backward(rec, g, lbuf, dst, rows, cols, ignore, beta),
            keep=(labels,),
        )
    return picked, mask


def _class_weight_vector(weight: TensorLike, cols: int, dev, op: str) -> Tensor:
    """A loss's ``weight`` argument checked: a float32 tensor of one weight per class."""
    w = _float_tensor(weight, dev, op, "weight")
    if w.shape != (cols,):
        raise ValueError(f"{op}: weight must have shape ({cols},), one per class, got {w.shape}")
    return w


def _class_weights(weight: TensorLike, labels: Tensor, mask: Tensor, cols: int, dev, op: str):
    """(weight [C] as a float32 tensor, weight[target_i] per row, 0 where ignored) for a loss's
    ``weight`` argument."""
    w = _class_weight_vector(weight, cols, dev, op)
    if needs_grad(w):
        raise NotImplementedError(f"{op}: weight requires grad; gradients to class weights are not implemented")
    # Ignored rows' labels lie outside [0, C): their gathered rows are NaN, replaced by where().
    picked = embedding(labels, w.reshape(cols, 1)).reshape(labels.shape[0])
    return w, where(mask, picked, 0.0)


def nll_loss(
    input: TensorLike,
    target: Labels,  # noqa: A002 - torch's names
    weight: Optional[TensorLike] = None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    """Negative log-likelihood of log-probabilities ``input`` [N, C] at int ``target`` [N]
    (``torch.nn.functional.nll_loss``): ``-weight[t] input[i, t]``; the mean divides by the
    summed weights of the rows not ignored."""
    _check_reduction(reduction, "nll_loss")
    x = _class_input(input, "nll_loss")
    rows, cols = x.shape
    labels = _labels(target, rows, cols, ignore_index, x.device, "nll_loss")
    picked, mask = _nll_pick(x, labels, ignore_index)
    if weight is not None:
        mask = _class_weights(weight, labels, mask, cols, x.device, "nll_loss")[1]
        picked = picked * mask
    if reduction == "none":
        return picked
    total = sum(picked)
    return total / sum(mask) if reduction == "mean" else total


def cross_entropy(
    input: TensorLike,
    target: Labels,  # noqa: A002 - torch's names
    weight: Optional[TensorLike] = None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    """Softmax cross-entropy of logits [N, C] against int class indices [N]
    (torch.nn.functional.cross_entropy); the mean skips ``ignore_index`` rows.
    Without ``weight`` and ``label_smoothing``: one fused kernel pass forward (keeping
    each row's max and log-sum of exponentials, not the softmax) and one backward (the
    softmax recomputed from the logits). float16 logits are read as they are (float32
    math, float16 gradient); the loss is float32 under autocast (torch's float32 list),
    else float16. With them, torch's formula through log_softmax: ``(1 - eps) *
    nll_loss(weight) + eps / C * smooth``, smooth = ``-sum_c weight[c] log p_c`` per row not
    ignored, the mean divided by the summed weights of the rows not ignored (their number
    without ``weight``). Also as torch: logits [N, C, d1, ...] with targets [N, d1, ...] (the
    classes along dimension 1), and float class probabilities of the input's shape as targets
    (``-sum_c weight[c] target_c log p_c``, the mean over the rows)."""
    _check_reduction(reduction, "cross_entropy")
    if isinstance(label_smoothing, bool) or not _is_scalar(label_smoothing) or not 0 <= label_smoothing <= 1:
        raise ValueError(f"cross_entropy: label_smoothing must lie in [0, 1], got {label_smoothing!r}")
    x = _float_tensor(input, _device_of(input), "cross_entropy", "input", _elem_dtype(input))
    soft = getattr(target, "dtype", None) in (_FLOAT32, _HALF) and tuple(np.shape(target)) == x.shape
    if x.ndim > 2:  # classes along dimension 1: moved last, every other position a row
        order = (0, *range(2, x.ndim), 1)
        rows_shape = (x.shape[0], *x.shape[2:])
        flat = x.permute(*order).reshape(-1, x.shape[1])
        t = target
        if soft:
            t = _float_tensor(target, x.device, "cross_entropy", "target", _elem_dtype(target))
            t = t.permute(*order).reshape(-1, x.shape[1])
        elif tuple(np.shape(target)) == rows_shape:
            t = target.reshape(-1) if isinstance(target, Tensor) else np.asarray(target).reshape(-1)
        else:
            raise ValueError(
                f"cross_entropy: target has shape {np.shape(target)}, expected {rows_shape} for input {x.shape}"
            )
        loss = cross_entropy(
            flat, t, weight, ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing
        )
        return loss.reshape(rows_shape) if reduction == "none" else loss
    x = _class_input(x, "cross_entropy", x.dtype)
    half = x.dtype is _HALF
    rows, cols = x.shape
    dev = x.device
    if soft:
        result = _soft_cross_entropy(x, target, weight, reduction, float(label_smoothing))
        return to_dtype(result, _HALF) if half and _autocast_state.dtype is None else result
    labels = _labels(target, rows, cols, ignore_index, dev, "cross_entropy")
    if weight is not None or label_smoothing:
        result = _smoothed_cross_entropy(x, labels, weight, ignore_index, reduction, float(label_smoothing))
        return to_dtype(result, _HALF) if half and _autocast_state.dtype is None else result
    stats = empty((rows, 2), np.float32, dev)
    per_row, valid = (empty((rows,), np.float32, dev) for _ in range(2))
    out, scale = empty((), np.float32, dev), empty((), np.float32, dev)
    with _rec(dev) as rec:
        _core.cross_entropy_forward(
            rec,
            x._buf,
            labels._buf,
            stats._buf,
            per_row._buf,
            valid._buf,
            out._buf,
            scale._buf,
            rows,
            cols,
            int(ignore_index),
            reduction == "mean",
            half,
        )
    result = per_row if reduction == "none" else out
    if needs_grad(x):
        xbuf, lbuf, sbuf, obuf = x._buf, labels._buf, stats._buf, scale._buf
        each, ignore = reduction == "none", int(ignore_index)

        def launch(rec, g, dst, beta):
            _core.cross_entropy_backward(rec, xbuf, lbuf, sbuf, g, obuf, dst, rows, cols, ignore, each, beta, half)

        _attach_launch(result, "cross_entropy", x, launch, keep=(x, labels))
    if half and _autocast_state.dtype is None:  # float16 logits outside autocast: a float16 loss, as torch
        result = to_dtype(result, _HALF)
    return result


def _soft_cross_entropy(x, target, weight, reduction, eps):
    """cross_entropy against class probabilities [N, C], written out as torch's."""
    cols = x.shape[1]
    logp = log_softmax(x.float() if x.dtype is _HALF else x, -1)
    t = _float_tensor(target, x.device, "cross_entropy", "target", _elem_dtype(target))
    if t.dtype is _HALF:
        t = t.float()
    if eps:
        t = t * (1.0 - eps) + eps / cols
    prod = t * logp
    if weight is not None:
        prod = prod * _class_weight_vector(weight, cols, x.device, "cross_entropy")
    return _reduced_loss(-sum(prod, -1), reduction)


def _smoothed_cross_entropy(x, labels, weight, ignore_index, reduction, eps):
    """cross_entropy with class weights and / or label smoothing, written out as torch's."""
    cols = x.shape[1]
    logp = log_softmax(x.float() if x.dtype is _HALF else x, -1)
    picked, mask = _nll_pick(logp, labels, ignore_index)
    if weight is not None:
        w, denom = _class_weights(weight, labels, mask, cols, x.device, "cross_entropy")
        picked = picked * denom
    else:
        denom = mask
    loss = picked * (1.0 - eps) if eps else picked
    if eps:
        smooth = -(matmul(logp, w) if weight is not None else sum(logp, -1))
        smooth = where(mask, smooth, 0.0)
        loss = loss + smooth * (eps / cols)
    if reduction == "none":
        return loss
    return sum(loss) / sum(denom) if reduction == "mean" else sum(loss)


def _loss_operands(input: TensorLike, target: TensorLike, reduction: str, op: str) -> tuple[Tensor, Tensor]:
    """An element-wise loss's input and target as float tensors of one shape on one device."""
    _check_reduction(reduction, op)
    dev = _device_of(input, target)
    ti = _float_tensor(input, dev, op, "input")
    tt = _float_tensor(target, dev, op, "target")
    if ti.shape != tt.shape:
        raise ValueError(f"{op}: target has shape {tt.shape}, input has {ti.shape}")
    return ti, tt


def _reduced_loss(loss: Tensor, reduction: str) -> Tensor:
    if reduction == "none":
        return loss
    return sum(loss) if reduction == "sum" else mean(loss)


def mse_loss(input: TensorLike, target: TensorLike, reduction: str = "mean") -> Tensor:  # noqa: A002 - torch's names
    ti, tt = _loss_operands(input, target, reduction, "mse_loss")
    d = ti - tt
    return _reduced_loss(d * d, reduction)


def l1_loss(input: TensorLike, target: TensorLike, reduction: str = "mean") -> Tensor:  # noqa: A002 - torch's names
    """``|input - target|``, reduced (``torch.nn.functional.l1_loss``); the gradient is 0 where they are equal."""
    ti, tt = _loss_operands(input, target, reduction, "l1_loss")
    return _reduced_loss(abs(ti - tt), reduction)


def _piecewise_loss(ti: Tensor, tt: Tensor, knee: float, scale: float) -> Tensor:
    """``0.5 d^2 / knee * scale`` where ``|d| < knee``, else ``(|d| - 0.5 knee) * scale``,
    d = ti - tt (smooth L1: scale 1; Huber: scale knee). NaN stays NaN."""
    d = ti - tt
    ad = abs(d)
    return where(lt(ad, knee), d * d * (0.5 * scale / knee), (ad - 0.5 * knee) * scale)


def smooth_l1_loss(
    input: TensorLike,  # noqa: A002 - torch's names
    target: TensorLike,
    reduction: str = "mean",
    beta: float = 1.0,
) -> Tensor:
    """``0.5 d^2 / beta`` where ``|d| < beta``, else ``|d| - 0.5 beta`` (d = input - target),
    reduced (``torch.nn.functional.smooth_l1_loss``); beta 0 is ``l1_loss``."""
    ti, tt = _loss_operands(input, target, reduction, "smooth_l1_loss")
    if not _is_scalar(beta) or not beta >= 0:
        raise ValueError(f"smooth_l1_loss: beta must be a number >= 0, got {beta!r}")
    if beta == 0:
        return _reduced_loss(abs(ti - tt), reduction)
    return _reduced_loss(_piecewise_loss(ti, tt, float(beta), 1.0), reduction)


def huber_loss(
    input: TensorLike,  # noqa: A002 - torch's names
    target: TensorLike,
    reduction: str = "mean",
    delta: float = 1.0,
) -> Tensor:
    """``0.5 d^2`` where ``|d| < delta``, else ``delta (|d| - 0.5 delta)`` (d = input - target),
    reduced (``torch.nn.functional.huber_loss``)."""
    ti, tt = _loss_operands(input, target, reduction, "huber_loss")
    if not _is_scalar(delta) or not delta > 0:
        raise ValueError(f"huber_loss: delta must be a number > 0, got {delta!r}")
    return _reduced_loss(_piecewise_loss(ti, tt, float(delta), float(delta)), reduction)


def binary_cross_entropy_with_logits(
    input: TensorLike,  # noqa: A002 - torch's names
    target: TensorLike,
    weight: Optional[TensorLike] = None,
    reduction: str = "mean",
    pos_weight: Optional[TensorLike] = None,
) -> Tensor:
    """Sigmoid and binary cross-entropy in one stable form
    (``torch.nn.functional.binary_cross_entropy_with_logits``):
    ``(1 - y) softplus(x) + pos_weight y softplus(-x)``, times ``weight``, reduced: the
    terms never cancel (``(1 - y) x + softplus(-x)``, the same value, loses the digits of a
    small loss at y = 0, x << 0). ``weight`` broadcasts to the input, ``pos_weight`` along its
    last dimension. The gradient is torch's ``(1 + (pos_weight - 1) y) sigmoid(x) -
    pos_weight y`` (with the weights), also at ``x = 0``."""
    ti, tt = _loss_operands(input, target, reduction, "binary_cross_entropy_with_logits")
    dev = ti.device
    positive = tt * softplus(-ti)
    if pos_weight is not None:
        positive = positive * _float_tensor(pos_weight, dev, "binary_cross_entropy_with_logits", "pos_weight")
    loss = (1.0 - tt) * softplus(ti) + positive
    if weight is not None:
        loss = loss * _float_tensor(weight, dev, "binary_cross_entropy_with_logits", "weight")
    return _reduced_loss(loss, reduction)


# -- attention ---------------------------------------------------------------------------
ATTN_MAX_HEAD_DIM = 128  # attention.wgsl sizes its workgroup memory for head sizes up to this


def _attn_scale(scale, d, op):
    if scale is None:
        return 1.0 / math.sqrt(d)
    if not _is_scalar(scale):
        raise TypeError(f"{op}: scale must be a real number or None, got {type(scale).__name__}")
    return float(scale)


def _attn_head_dim(d, op):
    if d > ATTN_MAX_HEAD_DIM:
        raise ValueError(f"{op}: head size {d} exceeds the fused kernel's maximum of {ATTN_MAX_HEAD_DIM}")


def _attn_backward_into(
    dev, q, qv, k, kv, v, vv, out, ov, g, gv, lse, shape, scale, grads, beta, half, causal=True, kbias=None
):
    """Records the attention backward; shape = (batch, heads, T, S, D); grads = ((dq, view),
    (dk, view), (dv, view)); ``half``: the operands and gradients are float16."""
    b, h, t, tk, d = shape
    delta = empty((b * h * t,), np.float32, dev)
    (dq, dqv), (dk, dkv), (dv, dvv) = grads
    with _rec(dev) as rec:
        _core.attention_backward(
            rec, q, qv, k, kv, v, vv, out, ov, g._buf, gv, lse, delta._buf, dq._buf, dqv, dk._buf, dkv, dv._buf, dvv,
            b, h, t, d, float(scale), float(beta), 0, half, tk=tk, causal=causal, kbias=kbias,
        )  # fmt: skip


def _sdpa_fused(q, k, v, is_causal, sc, dt, dev, kbias=None):
    """The fused kernels on dense [B, H, T, D] queries and [B, H, S, D] keys and values;
    ``kbias``: a float32 [B, S] tensor added to every score of each key."""
    op = "scaled_dot_product_attention"
    b, h, t, d = q.shape
    tk = k.shape[2]
    qview = (0, h * t * d, t * d, d)
    kview = (0, h * tk * d, tk * d, d)
    half = dt is _HALF
    out = empty(q.shape, dt, dev)
    lse = empty((b * h * t,), np.float32, dev)
    with _rec(dev) as rec:
        _core.attention_forward(
            rec, q._buf, qview, k._buf, kview, v._buf, kview, out._buf, qview, lse._buf, b, h, t, d, sc, 0, half,
            tk=tk, causal=is_causal, kbias=None if kbias is None else kbias._buf,
        )  # fmt: skip
    if not needs_grad(q, k, v):
        return out
    bufs = (q._buf, k._buf, v._buf)
    obuf, lbuf, bbuf = out._buf, lse._buf, None if kbias is None else kbias._buf
    distinct = q is not k and q is not v and k is not v
    shapes, views = (q.shape, k.shape, v.shape), (qview, kview, kview)

    def backward(g, sinks):
        if distinct:
            targets = [
                sk.target() if sk is not None else (empty(shape, dt, dev), 0.0) for sk, shape in zip(sinks, shapes)
            ]
            beta = builtins.max(bt for _, bt in targets)
            if beta:  # one beta for all three: a fresh target joins the accumulating ones from 0
                for dst, bt in targets:
                    if not bt:
                        _zero(dst)
            grads = [(dst, vw) for (dst, _), vw in zip(targets, views)]
        else:  # an input passed twice: separate results, summed by the sinks
            grads = [(empty(shape, dt, dev), vw) for shape, vw in zip(shapes, views)]
            beta = 0.0
        _attn_backward_into(
            dev, bufs[0], qview, bufs[1], kview, bufs[2], kview, obuf, qview, g, qview, lbuf, (b, h, t, tk, d), sc,
            grads, beta, half, is_causal, bbuf,
        )  # fmt: skip
        if not distinct:
            for sink, (gt, _) in zip(sinks, grads):
                if sink is not None:
                    sink.put(gt, owned=True)

    kept = (q, k, v, out) if kbias is None else (q, k, v, out, kbias)  # the backward re-reads the bias
    return attach(out, op, [q, k, v], backward, keep=kept)


def _key_bias(mask: Tensor, batch: int, keys: int) -> Optional[Tensor]:
    """An additive mask that depends on the batch and the key only (broadcastable from
    [batch, 1, 1, keys]: a key padding mask) as the fused kernels' dense float32 [batch, keys]
    bias; None for any other mask, or one that requires grad (the kernels give it none)."""
    shape = (1,) * (4 - mask.ndim) + mask.shape if mask.ndim <= 4 else None
    if shape is None or needs_grad(mask) or shape[1] != 1 or shape[2] != 1 or shape[0] not in (1, batch):
        return None
    if shape[3] not in (1, keys):
        return None
    bias = mask.float() if mask.dtype is _HALF else mask
    return bias.reshape(shape[0], shape[3]).expand(batch, keys).contiguous()


def _sdpa_mask(attn_mask, is_causal, t, tk, dev, dt, op):
    """The additive mask of the written-out path (None: no mask): a boolean NumPy mask becomes
    0 where True (take part) and -inf where False, as torch's; a float one is added as it is; the
    causal mask is the top-left triangle (key <= query)."""
    if is_causal:
        m = np.where(np.tril(np.ones((t, tk), dtype=bool)), 0.0, -np.inf).astype(np.float32)
        return tensor(m if dt is _FLOAT32 else m.astype(np.float16), dev)
    if attn_mask is None:
        return None
    if isinstance(attn_mask, np.ndarray) and attn_mask.dtype == np.bool_:
        m = np.where(attn_mask, 0.0, -np.inf).astype(np.float32)
        return tensor(m if dt is _FLOAT32 else m.astype(np.float16), dev)
    if isinstance(attn_mask, np.ndarray) and attn_mask.dtype == np.float64:
        raise TypeError(f"{op}: attn_mask must be bool, float32 or the query's dtype, got float64")
    return _float_tensor(attn_mask, dev, op, "attn_mask", getattr(attn_mask, "dtype", dt))


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Optional[TensorLike] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
) -> Tensor:
    """``softmax(query key^T * scale + mask) value`` over the last two dimensions, as
    torch.nn.functional.scaled_dot_product_attention: query [..., Hq, L, E], key [..., H, S, E],
    value [..., H, S, Ev] -> [..., Hq, L, Ev]; ``scale`` defaults to 1/sqrt(E).

    - ``is_causal``: query i sees keys 0..i (the top-left triangle when L != S); with
      ``attn_mask`` too it raises, as torch.
    - ``attn_mask``: a boolean NumPy array (True: the key takes part) or a float mask
      (Tensor or array) added to the scores, broadcastable to [..., L, S].
    - ``dropout_p``: dropout on the attention weights (applied whenever > 0, as torch).
    - ``enable_gqa``: Hq a multiple of H, each key/value head serving Hq / H query heads.

    Without a mask or dropout (and E = Ev <= 128, equal leading dimensions) it runs the fused
    kernels (attention.wgsl, FlashAttention-2 style): the L x S scores are never stored, the
    forward keeps one log-sum-exp per row and the backward recomputes the weights from it
    (deterministic). Otherwise it is written out (products, softmax, dropout), as torch's math
    path. float16 operands run float16 kernels (float32 math inside, each output rounded once)."""
    op = "scaled_dot_product_attention"
    if is_causal and attn_mask is not None:
        raise ValueError(f"{op}: pass either attn_mask or is_causal=True, not both (as torch)")
    if isinstance(dropout_p, bool) or not _is_scalar(dropout_p) or not 0.0 <= float(dropout_p) <= 1.0:
        raise ValueError(f"{op}: dropout_p must be a probability in [0, 1], got {dropout_p!r}")
    dt = _elem_dtype(query, key, value)
    if dt is None:  # float16 with float32: computed in float32 (_dtype_rules)
        return NotImplemented
    dev = _device_of(query, key, value)
    q = _float_tensor(query, dev, op, "query", dt)
    k = _float_tensor(key, dev, op, "key", dt)
    v = _float_tensor(value, dev, op, "value", dt)
    for name, x in (("query", q), ("key", k), ("value", v)):
        if x.ndim < 2:
            raise ValueError(f"{op}: {name} must have at least 2 dimensions [..., seq, features], got {x.shape}")
        if 0 in x.shape:
            raise ValueError(f"{op}: {name} has an empty dimension: {x.shape}")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"{op}: key's last dimension {k.shape[-1]} differs from query's {q.shape[-1]}")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"{op}: key {k.shape} and value {v.shape} differ before the last dimension")
    if enable_gqa and q.ndim >= 3 and k.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        hq, hk = q.shape[-3], k.shape[-3]
        if hq % hk:
            raise ValueError(f"{op}: enable_gqa needs query heads ({hq}) to be a multiple of key heads ({hk})")
        g = hq // hk  # key/value head j serves query heads j g .. j g + g - 1 (torch's repeat_interleave)
        k, v = (
            x.unsqueeze(-3).expand(*x.shape[:-2], g, *x.shape[-2:]).reshape(*x.shape[:-3], hq, *x.shape[-2:])
            for x in (k, v)
        )
    sc = _attn_scale(scale, q.shape[-1], op)
    dropout_p = float(dropout_p)
    fusable = (
        dropout_p == 0.0
        and q.ndim == 4
        and k.shape[:2] == q.shape[:2]
        and v.shape[-1] == q.shape[-1] <= ATTN_MAX_HEAD_DIM
    )
    if fusable and attn_mask is None:
        return _sdpa_fused(q, k, v, bool(is_causal), sc, dt, dev)
    mask = _sdpa_mask(attn_mask, is_causal, q.shape[-2], k.shape[-2], dev, dt, op)
    if fusable and mask is not None and not is_causal:
        kbias = _key_bias(mask, q.shape[0], k.shape[2])
        if kbias is not None:
            return _sdpa_fused(q, k, v, False, sc, dt, dev, kbias)
    scores = matmul(q, k.transpose(-2, -1)) * sc
    if mask is not None:
        scores = scores + mask
    weights = softmax(scores, -1)
    if dropout_p > 0.0:
        weights = dropout(weights, dropout_p)
    return matmul(weights, v)


def causal_self_attention_qkv(qkv: Tensor, n_head: int, scale: Optional[float] = None) -> Tensor:
    """Causal self-attention straight from a fused projection ``qkv`` [B, T, 3C]
    (q, k, v side by side, as Linear(C, 3C) produces them) with ``n_head`` heads of
    D = C / n_head -> [B, T, C], heads side by side (what the output projection
    takes). The kernels read and write the strided layout directly: no split,
    permute or concatenation copies forward or backward (the gradient lands in one
    [B, T, 3C] tensor). A float16 ``qkv`` runs the float16 kernels (float32 math inside,
    each output rounded once): a float16 result and gradient, float16 kept for backward."""
    return _self_attention_qkv(qkv, n_head, scale, True, "causal_self_attention_qkv")


def _self_attention_qkv(qkv: Tensor, n_head: int, scale: Optional[float], causal: bool, op: str) -> Tensor:
    """causal_self_attention_qkv's kernels, with or without the causal mask."""
    x = _float_tensor(qkv, _device_of(qkv), op, "qkv", _elem_dtype(qkv))
    if isinstance(n_head, bool) or not isinstance(n_head, numbers.Integral) or n_head < 1:
        raise TypeError(f"{op}: n_head must be a positive int, got {n_head!r}")
    if x.ndim != 3 or x.shape[2] % 3 != 0:
        raise ValueError(f"{op}: qkv must be [batch, seq, 3 * C], got shape {x.shape}")
    b, t, c3 = x.shape
    c = c3 // 3
    if 0 in x.shape:
        raise ValueError(f"{op}: empty dimension in shape {x.shape}")
    if c % n_head != 0:
        raise ValueError(f"{op}: C = {c} is not divisible by n_head = {n_head}")
    h = int(n_head)
    d = c // h
    _attn_head_dim(d, op)
    sc = _attn_scale(scale, d, op)
    qv, kv, vv = ((i * c, t * c3, d, c3) for i in range(3))
    ov = (0, t * c, d, c)
    dev = x.device
    half = x.dtype is _HALF
    out = empty((b, t, c), x.dtype, dev)
    lse = empty((b * h * t,), np.float32, dev)
    with _rec(dev) as rec:
        _core.attention_forward(
            rec, x._buf, qv, x._buf, kv, x._buf, vv, out._buf, ov, lse._buf, b, h, t, d, sc, 0, half, causal=causal
        )
    if needs_grad(x):
        xbuf, obuf, lbuf = x._buf, out._buf, lse._buf  # (buffers: the node must not hold out itself)

        def backward(g, sinks):
            dst, beta = sinks[0].target()
            _attn_backward_into(
                dev,
                xbuf,
                qv,
                xbuf,
                kv,
                xbuf,
                vv,
                obuf,
                ov,
                g,
                ov,
                lbuf,
                (b, h, t, t, d),
                sc,
                ((dst, qv), (dst, kv), (dst, vv)),
                beta,
                half,
                causal,
            )

        attach(out, op, [x], backward, keep=(x, out))
    return out


# -- decoding with a key/value cache (inference only: no autograd) ---------------------------------
# attn_decode's largest cache (its scores sit in workgroup memory); csrc/shader_contract.hpp has the number.
DECODE_MAX_CAPACITY = _core.shader_constants()["attention"]["DEC_KEYS"]


def _decode_operand(x, dev, dtype, shape, op, name):
    """x checked as a contiguous ``dtype`` Tensor on ``dev`` of ``shape`` (None: any) for a decode kernel."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: {name} must be a pywgtrain.Tensor, got {type(x).__name__}")
    if x.device is not dev:
        raise ValueError(f"{op}: {name} lives on {x.device!r}, expected {dev!r}")
    if x.dtype != dtype:
        raise TypeError(f"{op}: {name} must be {np.dtype(dtype).name}, got {x.dtype.name}")
    if shape is not None and x.shape != tuple(shape):
        raise ValueError(f"{op}: {name} must have shape {tuple(shape)}, got {x.shape}")
    if not x._bindable:
        raise ValueError(f"{op}: {name} must be a contiguous tensor (the kernel writes or reads it in place)")
    if needs_grad(x):
        raise RuntimeError(f"{op} has no backward: call it under pywgtrain.no_grad() ({name} requires grad)")
    return x


def kv_cache_attention(
    qkv: Tensor, k_cache: Tensor, v_cache: Tensor, pos: Tensor, n_head: int, scale: Optional[float] = None
) -> Tensor:
    """One decoding step of causal self-attention against a key/value cache ->
    [B, 1, C]. ``qkv`` [B, 1, 3C] holds the new token's query, key and value (as
    ``causal_self_attention_qkv`` takes them); ``k_cache`` and ``v_cache``
    [B * n_head, capacity, D] (float32, D = C / n_head); ``pos`` a one-element
    int32 tensor. The kernel reads the position on the device, writes the new key
    and value into cache row ``pos`` and attends over rows 0..pos, so a captured
    step replays at every position. The host does not see ``pos``: keeping it in
    [0, capacity) is the caller's part (the kernel clamps it). Inference only."""
    op = "kv_cache_attention"
    if not isinstance(qkv, Tensor):
        raise TypeError(f"{op}: qkv must be a pywgtrain.Tensor, got {type(qkv).__name__}")
    dev = qkv.device
    if isinstance(n_head, bool) or not isinstance(n_head, numbers.Integral) or n_head < 1:
        raise TypeError(f"{op}: n_head must be a positive int, got {n_head!r}")
    if qkv.ndim != 3 or qkv.shape[1] != 1 or qkv.shape[2] % 3 or 0 in qkv.shape:
        raise ValueError(f"{op}: qkv must be [batch, 1, 3 * C], got shape {qkv.shape}")
    b, _, c3 = qkv.shape
    c = c3 // 3
    if c % n_head:
        raise ValueError(f"{op}: C = {c} is not divisible by n_head = {n_head}")
    h = int(n_head)
    d = c // h
    _attn_head_dim(d, op)
    sc = _attn_scale(scale, d, op)
    _decode_operand(qkv, dev, np.float32, None, op, "qkv")
    if not isinstance(k_cache, Tensor) or k_cache.ndim != 3:
        raise ValueError(f"{op}: k_cache must be [B * n_head, capacity, D], got {getattr(k_cache, 'shape', k_cache)}")
    cap = k_cache.shape[1]
    if not 1 <= cap <= DECODE_MAX_CAPACITY:
        raise ValueError(f"{op}: cache capacity {cap} outside [1, {DECODE_MAX_CAPACITY}]")
    _decode_operand(k_cache, dev, np.float32, (b * h, cap, d), op, "k_cache")
    _decode_operand(v_cache, dev, np.float32, (b * h, cap, d), op, "v_cache")
    _decode_operand(pos, dev, np.int32, None, op, "pos")
    if pos._numel != 1:
        raise ValueError(f"{op}: pos must hold one int32 position, got shape {pos.shape}")
    out = empty((b, 1, c), np.float32, dev)
    with _rec(dev) as rec:
        _core.attention_decode(rec, qkv._buf, k_cache._buf, v_cache._buf, pos._buf, out._buf, b, h, cap, d, sc)
    k_cache._bump_version()
    v_cache._bump_version()
    return out


def next_token(logits: Tensor, tok: Tensor, hist: Tensor, pos: Tensor) -> None:
    """Greedy decoding's next token, on the device: for logits [B, V] (or
    [B, 1, V]), ``tok`` [B, 1] or [B] (int32) <- the argmax of each row (the
    first of equal maxima, NaN the largest, as ``numpy.argmax``), ``hist``
    [B, L] (int32) column pos + 1 <- the same ids (skipped from L on), then
    ``pos`` (one int32) += 1. Nothing is read back, so decoding steps chain
    on the GPU. Inference only."""
    op = "next_token"
    if not isinstance(logits, Tensor):
        raise TypeError(f"{op}: logits must be a pywgtrain.Tensor, got {type(logits).__name__}")
    dev = logits.device
    if logits.ndim not in (2, 3) or (logits.ndim == 3 and logits.shape[1] != 1) or 0 in logits.shape:
        raise ValueError(f"{op}: logits must be [batch, vocab] or [batch, 1, vocab], got shape {logits.shape}")
    b, v = logits.shape[0], logits.shape[-1]
    _decode_operand(logits, dev, np.float32, None, op, "logits")
    _decode_operand(tok, dev, np.int32, None, op, "tok")
    if tok.shape not in ((b,), (b, 1)):
        raise ValueError(f"{op}: tok must have shape ({b},) or ({b}, 1), got {tok.shape}")
    _decode_operand(hist, dev, np.int32, None, op, "hist")
    if hist.ndim != 2 or hist.shape[0] != b or hist.shape[1] < 1:
        raise ValueError(f"{op}: hist must be [{b}, length >= 1], got shape {hist.shape}")
    _decode_operand(pos, dev, np.int32, None, op, "pos")
    if pos._numel != 1:
        raise ValueError(f"{op}: pos must hold one int32 position, got shape {pos.shape}")
    with _rec(dev) as rec:
        _core.next_token(rec, logits._buf, tok._buf, hist._buf, pos._buf, b, v, hist.shape[1])
    for t in (tok, hist, pos):
        t._bump_version()


# -- normalization and dropout -----------------------------------------------------------------------
def layer_norm(
    input: TensorLike,
    normalized_shape: ShapeLike,
    weight: Optional[Tensor] = None,
    bias: Optional[Tensor] = None,
    eps: float = 1e-5,
) -> Tensor:  # noqa: A002 - torch's names
    """Layer normalization over the last dimension (torch.nn.functional.layer_norm with
    ``normalized_shape`` = ``(input.shape[-1],)``): ``(x - mean) / sqrt(var + eps) * weight + bias``,
    biased variance, ``weight`` / ``bias`` of shape ``normalized_shape`` or None. One fused kernel
    forward (saving mean and 1 / std per row) and one backward; the weight and bias gradients are
    reduced over rows on the GPU in a fixed order (deterministic). A float16 input is read as it
    is (float32 statistics and output, a float16 input gradient; autograd keeps the float16
    input); float16 weight and bias are cast to float32. The result is float32 under autocast
    (torch's float32 list) or beside a float32 operand, float16 when every operand is."""
    dev = _device_of(input, weight, bias)
    x = _float_tensor(input, dev, "layer_norm", "input", _elem_dtype(input))  # float32 or float16
    ns = _shape_arg(normalized_shape, "layer_norm: normalized_shape")
    if len(ns) != 1:
        raise ValueError(
            f"layer_norm: only normalization over the last dimension is supported: normalized_shape must "
            f"be one int (the input's last dimension), got {ns}; reshape the input to merge the "
            f"normalized dimensions first"
        )
    if x.ndim == 0 or x.shape[-1] != ns[0]:
        raise ValueError(
            f"layer_norm: normalized_shape={list(ns)} expects an input of shape [*, {ns[0]}], got shape {list(x.shape)}"
        )
    tw = None if weight is None else _float_tensor(weight, dev, "layer_norm", "weight", _elem_dtype(weight))
    tb = None if bias is None else _float_tensor(bias, dev, "layer_norm", "bias", _elem_dtype(bias))
    for t, name in ((tw, "weight"), (tb, "bias")):
        if t is not None and t.shape != ns:
            raise ValueError(f"layer_norm: {name} has shape {t.shape}, expected normalized_shape {ns}")
    if isinstance(eps, bool) or not _is_scalar(eps) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"layer_norm: eps must be a finite number >= 0, got {eps!r}")
    narrow = _autocast_state.dtype is None and _elem_dtype(x, tw, tb) is _HALF  # torch's dtype outside autocast
    tw = None if tw is None else _cast(tw, _FLOAT32)  # parameters: float32, as torch's autocast keeps them
    tb = None if tb is None else _cast(tb, _FLOAT32)
    half = x.dtype is _HALF
    cols = ns[0]
    rows = x._numel // cols
    y = empty(x.shape, np.float32, dev)
    mean_, rstd = empty((rows,), np.float32, dev), empty((rows,), np.float32, dev)
    wbuf = None if tw is None else tw._buf
    with _rec(dev) as rec:
        _core.layer_norm_forward(
            rec,
            x._buf,
            wbuf,
            None if tb is None else tb._buf,
            y._buf,
            mean_._buf,
            rstd._buf,
            rows,
            cols,
            float(eps),
            half,
        )
    if needs_grad(x, tw, tb):
        xbuf, mbuf, sbuf = x._buf, mean_._buf, rstd._buf

        def backward(g, sinks):
            outs = [(None, 0.0) if s is None else s.target() for s in sinks]
            (dx, bx), (dw, bw), (db, bb) = outs
            with _rec(dev) as rec:
                _core.layer_norm_backward(
                    rec,
                    xbuf,
                    wbuf,
                    mbuf,
                    sbuf,
                    g._buf,
                    None if dx is None else dx._buf,
                    None if dw is None else dw._buf,
                    None if db is None else db._buf,
                    rows,
                    cols,
                    float(bx),
                    float(bw),
                    float(bb),
                    half,
                )

        attach(y, "layer_norm", [x, tw, tb], backward, keep=(x, tw))
    return to_dtype(y, _HALF) if narrow else y


def rms_norm(
    input: TensorLike,  # noqa: A002 - torch's names
    normalized_shape: ShapeLike,
    weight: Optional[TensorLike] = None,
    eps: Optional[float] = None,
) -> Tensor:
    """Root-mean-square normalization over the trailing ``normalized_shape`` dimensions
    (``torch.nn.functional.rms_norm``), as torch computes it: ``x / sqrt(mean(x^2) + eps)``
    in float32, cast back to the input's dtype, then times ``weight``; ``eps`` None is
    float32's machine epsilon. Element-wise ops and a mean; differentiable in the input
    and the weight."""
    dev = _device_of(input, weight)
    x = _float_tensor(input, dev, "rms_norm", "input", _elem_dtype(input))
    ns = _shape_arg(normalized_shape, "rms_norm: normalized_shape")
    k = len(ns)
    if k == 0 or x.ndim < k or tuple(x.shape[x.ndim - k :]) != ns:
        raise ValueError(
            f"rms_norm: normalized_shape={list(ns)} does not match the trailing dimensions of an input of "
            f"shape {list(x.shape)}"
        )
    if eps is None:
        eps = float(np.finfo(np.float32).eps)
    elif isinstance(eps, bool) or not _is_scalar(eps) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"rms_norm: eps must be a finite number >= 0 or None, got {eps!r}")
    half = x.dtype is _HALF
    xf = to_dtype(x, np.float32) if half else x
    y = xf * rsqrt(mean(xf * xf, list(range(x.ndim - k, x.ndim)), keepdim=True) + float(eps))
    if half:
        y = to_dtype(y, np.float16)
    if weight is not None:
        tw = _float_tensor(weight, dev, "rms_norm", "weight", _elem_dtype(weight))
        if tw.shape != ns:
            raise ValueError(f"rms_norm: weight has shape {tw.shape}, expected normalized_shape {ns}")
        y = y * tw
    return y


def leaky_relu(x: TensorLike, negative_slope: float = 0.01) -> Tensor:
    """``x`` where ``x > 0``, else ``negative_slope * x`` (``torch.nn.functional.leaky_relu``);
    the gradient at 0 is ``negative_slope``, as torch's."""
    if not _is_scalar(negative_slope):
        raise TypeError(f"leaky_relu: negative_slope must be a real number, got {type(negative_slope).__name__}")
    t = _float_tensor(x, _device_of(x), "leaky_relu", "input", _elem_dtype(x))
    return where(gt(t, 0.0), t, t * float(negative_slope))


def dropout(
    input: TensorLike,
    p: float = 0.5,  # noqa: A002 - torch's names
    training: bool = True,
    inplace: bool = False,
) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by ``1 / (1 - p)``
    (torch.nn.functional.dropout); the identity when not ``training`` or ``p == 0``,
    zeros when ``p == 1``. The mask comes from the device's GPU random state
    (``pywgtrain.random``): each call takes a fresh key from it on the GPU, so
    replayed step graphs draw new masks and ``manual_seed`` / ``set_rng_state``
    reproduce them. The backward recomputes the mask from the same key."""
    if isinstance(p, bool) or not _is_scalar(p):
        raise TypeError(f"dropout: p must be a real number, got {p!r}")
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if inplace:
        raise ValueError(
            "dropout: inplace=True is not supported (kernels cannot read and write one buffer); use the returned tensor"
        )
    x = _float_tensor(input, _device_of(input), "dropout", "input", _elem_dtype(input))  # float32 or float16
    if not training or p == 0.0:
        return x
    dev = x.device
    half = x.dtype is _HALF
    out = empty(x.shape, x.dtype, dev)
    if p == 1.0:
        _zero(out)

        def backward_zero(g, sinks):
            dst, beta = sinks[0].target()
            if beta == 0.0:
                _zero(dst)

        return attach(out, "dropout", [x], backward_zero)
    state = default_generator(dev).state
    key = _core._Buffer(dev._dev, 16, "pywgtrain.rng_key")
    with _rec(dev) as rec:
        _core.rng_take(rec, state, key)
        _core.dropout(rec, x._buf, key, out._buf, x._numel, p, 0.0, half)
    if needs_grad(x):
        n = x._numel
        _attach_launch(out, "dropout", x, lambda rec, g, dst, beta: _core.dropout(rec, g, key, dst, n, p, beta, half))
    return out


# -- float16 operands and autocast -----------------------------------------------------
# The element-wise ops (_HALF_NATIVE), 2-D products and the attention ops
# take float16 operands as they are (``native``: float16 results, float16 kept for
# backward). The other ops have float32 kernels only: given float16 operands, they
# cast them up with recorded casts (to_dtype: autograd sees them, so their gradients
# come back as float16), compute in float32 and cast the result back to float16
# when no floating operand was float32 (torch's promotion: float16 with float32
# gives float32, also for the native ops, which return NotImplemented for mixed
# operands; a Python scalar keeps the tensor's dtype). Inside
# pywgtrain.autocast an op's kind (below) decides first, following torch's CUDA
# autocast lists: "f16" ops get their float32 operands cast to float16, "f32"
# ops their float16 operands cast to float32; the rest keep their operands.


def _cast(x, dtype):
    """x (a Tensor or NumPy array) as ``dtype`` when it is a float of the other width. Inside
    autocast, the cast of a leaf that requires grad (a parameter) is made once per outermost
    region and reused while the leaf's version is unchanged, as torch's autocast cache; a leaf
    with a float16 shadow (``Tensor.half_shadow``: a fused AdamW writes one with each update)
    is read from it instead of cast."""
    if x.dtype == dtype or x.dtype not in _CASTS:
        return x
    if isinstance(x, np.ndarray):
        return x.astype(dtype)
    s = _autocast_state
    if s.dtype is None or not x.requires_grad or not x.is_leaf:
        return to_dtype(x, dtype)
    cached = s.cache_enabled and is_grad_enabled()
    if cached:
        hit = s.cache.get(id(x))
        if hit is not None and hit[0] is x and hit[1] == x._version and hit[2] == dtype:
            return hit[3]
    shadow = x.half_shadow if dtype == _HALF else None
    out = to_dtype(x, dtype) if shadow is None else _from_shadow(x, shadow)
    if cached:
        s.cache[id(x)] = (x, x._version, dtype, out)  # holding x keeps its id from being reused
    return out


def _from_shadow(x, shadow):
    """x as float16 read from its shadow, attached to autograd as the cast would be (x's
    gradient comes back as float32). The shadow casts into its copy first when x was written
    since the copy was; in a graph capture, each replay does that check again (graphs.py)."""
    with x.device._recording() as rec:
        out = shadow.read(rec).detach()
    return _attach_cast(out, x)


def _operands(args, kwargs, skip):
    """(position or keyword, value) of every Tensor / NumPy operand, also inside a list or tuple
    argument (cat's tensors, mlp's weights); ``skip``: arguments that are no operands of the
    op's dtype (a condition, a residual added after)."""
    for key, x in (*enumerate(args), *kwargs.items()):
        if key in skip:
            continue
        if isinstance(x, (Tensor, np.ndarray)):
            yield key, x
        elif type(x) in (list, tuple):
            for y in x:
                if isinstance(y, (Tensor, np.ndarray)):
                    yield key, y


def _cast_operands(args, kwargs, dtype, skip=()):
    def one(key, x):
        if key in skip:
            return x
        if isinstance(x, (Tensor, np.ndarray)):
            return _cast(x, dtype)
        if type(x) in (list, tuple):
            return type(x)(_cast(y, dtype) if isinstance(y, (Tensor, np.ndarray)) else y for y in x)
        return x

    return tuple(one(i, x) for i, x in enumerate(args)), {k: one(k, v) for k, v in kwargs.items()}


def _narrow(out):
    """An op's float32 result(s) as float16."""
    if isinstance(out, Tensor):
        return to_dtype(out, _HALF) if out.dtype == _FLOAT32 else out
    if isinstance(out, _MaxResult):
        return _MaxResult((_narrow(out[0]), out[1]))
    if type(out) is tuple:
        return tuple(_narrow(o) for o in out)
    return out


def _dtype_rules(fn, kind=None, native=False, skip=()):
    """``fn`` taking float16 operands as described above. ``kind``: its autocast list ("f16",
    "f32" or None); ``native``: fn handles float16 operands itself, returning NotImplemented
    where it has no float16 kernel (then it computes in float32); "f32": also inside autocast,
    where it reads float16 operands and computes float32 (an "f32" op); ``skip``: positions and
    names of arguments that do not decide the dtype."""

    @functools.wraps(fn)
    def op(*args, **kwargs):
        ac = _autocast_state.dtype
        if (ac is None or kind is None) and not kwargs:  # the common case, checked without generators
            for x in args:
                t = type(x)
                if t is Tensor:
                    if x.dtype is _HALF:  # dtypes are NumPy's singletons (tensor() takes native order only)
                        break
                elif t not in _PLAIN_ARGS:
                    break
            else:
                return fn(*args)
        return _apply_rules(fn, kind, native, skip, ac, args, kwargs)

    return op


_PLAIN_ARGS = frozenset((float, int, bool, str, type(None)))


def _apply_rules(fn, kind, native, skip, ac, args, kwargs):
    """The rules of _dtype_rules for a call with float16, NumPy, list or keyword operands, or
    inside autocast (``ac``: its dtype)."""
    if ac is not None and kind is not None:
        if kind == "f32":
            if native == "f32":  # reads float16 operands itself, computing (and returning) float32
                return fn(*args, **kwargs)
            args, kwargs = _cast_operands(args, kwargs, _FLOAT32, skip)
            return fn(*args, **kwargs)
        args, kwargs = _cast_operands(args, kwargs, ac, skip)
    half = wide = False
    for _, x in _operands(args, kwargs, skip):
        if x.dtype == _HALF:
            half = True
        elif x.dtype == _FLOAT32:
            wide = True
    if not half:
        return fn(*args, **kwargs)
    if native:
        out = fn(*args, **kwargs)
        if out is not NotImplemented:
            return out
    args, kwargs = _cast_operands(args, kwargs, _FLOAT32)
    out = fn(*args, **kwargs)
    return out if wide else _narrow(out)


# Under autocast the attention ops take float16 operands (float32 ones get recorded casts, as
# torch's) and run the float16 kernels, keeping float16 for backward; bmm computes in float32
# with the result rounded to float16 (torch's dtype).
_F16_OPS = "bmm scaled_dot_product_attention causal_self_attention_qkv".split()
_F32_OPS = "exp log rsqrt pow sum softmax log_softmax layer_norm cross_entropy nll_loss mse_loss".split()
_SAME_OPS = """neg abs sqrt tanh sigmoid relu silu gelu square clamp clone add sub mul div maximum minimum
gt lt ge le eq ne mean max var std cat stack embedding index_select dropout""".split()
# (kind, native, skip) of the ops that differ from _dtype_rules' defaults
_RULES: dict[str, tuple[Optional[str], Union[bool, str], tuple]] = {
    "matmul": ("f16", True, ()),
    "causal_self_attention_qkv": ("f16", True, ()),
    "scaled_dot_product_attention": ("f16", True, ()),
    "cross_entropy": ("f32", "f32", ()),  # float16 logits read as they are; a float32 loss under autocast
    # float16 inputs read as they are (float32 math and result under autocast, float16 input gradients)
    "layer_norm": ("f32", "f32", ()),
    "softmax": ("f32", "f32", ()),
    "log_softmax": ("f32", "f32", ()),
    "sum": ("f32", "f32", ()),
    "mean": (None, True, ()),  # on no autocast list: float16 stays float16 (summed in float32)
    "mlp": ("f16", True, (4, "residual")),  # torch adds the residual after the linear, in the wider dtype
    "where": (None, True, (0, "condition")),  # a mask (bool in torch)
}
# Element-wise ops with float16 kernels (elementwise.wgsl): float16 operands stay float16.
_HALF_NATIVE = frozenset(
    """neg abs exp log sqrt rsqrt tanh sigmoid relu silu gelu square clamp clone add sub mul div
maximum minimum pow gt lt ge le eq ne dropout""".split()
)
_this = sys.modules[__name__]
for _name in _F16_OPS + _F32_OPS + _SAME_OPS + list(_RULES):
    _kind = "f16" if _name in _F16_OPS else "f32" if _name in _F32_OPS else None
    _kind, _native, _skip = _RULES.get(_name, (_kind, _name in _HALF_NATIVE, ()))
    setattr(_this, _name, _dtype_rules(getattr(_this, _name), _kind, _native, _skip))


_register_ops(sys.modules[__name__])  # Tensor's methods call the ops through this (see tensor.py)
_core.register_fast_paths(Tensor, _FLOAT32, _binary_grad, _autocast_state, _grad_state)
