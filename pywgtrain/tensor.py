"""Device tensors: a GPU buffer with a shape, a dtype and an autograd record."""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union

import numpy as np

from . import _core
from ._typing import Dims, DTypeLike, Operand, ShapeLike
from .device import Device, default_device

if TYPE_CHECKING:
    from .autograd import Node

_DTYPES = (np.dtype(np.float32), np.dtype(np.int32))
MAX_DIM = 2**31 - 1  # kernels index with 32-bit integers


class Tensor:
    """A C-contiguous array in GPU memory (float32, or int32 for labels and ids).

    Create with :func:`tensor` / :func:`zeros` / :func:`empty`; read back with
    ``.numpy()`` or ``.item()``. Float tensors take part in autograd:
    ``requires_grad``, ``.grad``, ``.backward()``, ``.detach()`` behave as in
    PyTorch; the ops (``+ - * / @ **``, ``.exp()``, ``.sum(dim)``, ...) are
    listed in ``docs/ops.md``. Shape ops that return views in PyTorch
    (``transpose``, ``permute``, slicing) return contiguous copies here;
    ``reshape``/``view`` share memory.
    """

    __slots__ = (
        "_buf",
        "shape",
        "dtype",
        "device",
        "size",
        "requires_grad",
        "grad",
        "_node",
        "_grad_home",
        "_batch",
        "__weakref__",
    )
    shape: tuple[int, ...]
    dtype: np.dtype
    device: Device
    size: int
    requires_grad: bool
    grad: Optional[Tensor]

    def __init__(
        self, buf: _core._Buffer, shape: Sequence[int], dtype: DTypeLike, device: Device, requires_grad: bool = False
    ) -> None:
        self._buf = buf
        self.shape = shape if _is_int_tuple(shape) else tuple(int(s) for s in shape)
        self.dtype = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
        self.device = device
        self.size = math.prod(self.shape)
        self.requires_grad = bool(requires_grad)
        self.grad = None
        self._node = None  # the op that produced this tensor (autograd), None for leaves
        self._grad_home = None  # where a new .grad lives (a view of an optimizer's flat arena)
        self._batch = device._current_batch_token() if device is not None else None

    # -- description ---------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    def dim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def is_leaf(self) -> bool:
        return self._node is None

    @property
    def grad_fn(self) -> Optional[Node]:
        return self._node

    def numel(self) -> int:
        return self.size

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self):
        grad = ", requires_grad=True" if self.requires_grad else ""
        return (
            f"Tensor(shape={self.shape}, dtype={self.dtype.name}, device={self.device.name!r}"
            f"#{self.device.ordinal}{grad})"
        )

    # -- host transfer -------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """Copy to a new NumPy array (waits for the GPU; the GIL is released)."""
        if self._batch is not None:
            self._batch.check()  # RuntimeError when the work that was to write this tensor was discarded
        out = np.empty(self.shape, self.dtype)
        self.device.flush()
        self._buf.download(out.reshape(-1).view(np.uint8))
        return out

    def item(self) -> Union[float, int]:
        if self.size != 1:
            raise ValueError(f"item(): only one-element tensors can be converted to Python scalars, shape {self.shape}")
        return self.numpy().reshape(-1)[0].item()

    def tolist(self) -> Union[list, float, int]:
        return self.numpy().tolist()

    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __bool__(self):
        if self.size != 1:
            raise RuntimeError(f"the truth value of a tensor with {self.size} elements is ambiguous")
        return bool(self.item())

    # -- in-place writes (outside autograd) ----------------------------------
    def _check_inplace(self, what):
        from .autograd import is_grad_enabled

        if self.requires_grad and is_grad_enabled():
            kind = "a leaf tensor that requires grad" if self._node is None else "a tensor that is part of a graph"
            raise RuntimeError(
                f"{what}: in-place operation on {kind}; wrap it in pywgtrain.no_grad() or use the out-of-place form"
            )

    def copy_(self, src: Union[Tensor, np.ndarray]) -> Tensor:
        """Overwrite with ``src`` (array or Tensor) of the same shape and dtype."""
        self._check_inplace("copy_")
        if isinstance(src, Tensor):
            _check_same(self, src, "src")
            with self.device._recording() as rec:
                if self.dtype == np.float32:
                    _core.unary(rec, 0, src._buf, self._buf, self.size, 0.0, 0.0, 0.0)
                else:
                    rec.copy(src._buf, 0, self._buf, 0, self.nbytes)
        else:
            arr = _check_array(src, "src", dtype=self.dtype)
            if arr.shape != self.shape:
                raise ValueError(f"src has shape {arr.shape}, expected {self.shape}")
            self.device.flush()  # keep order with work recorded earlier in a batch
            self._buf.upload(arr.reshape(-1).view(np.uint8))
            self._batch = None
        return self

    def fill_(self, value: float) -> Tensor:
        self._check_inplace("fill_")
        if self.dtype != np.float32:
            raise TypeError(f"fill_ needs a float32 tensor, got {self.dtype.name}")
        with self.device._recording() as rec:
            _core.fill(rec, self._buf, self.size, float(value))
        return self

    def zero_(self) -> Tensor:
        if self.dtype == np.float32:
            return self.fill_(0.0)
        self._check_inplace("zero_")
        with self.device._recording() as rec:
            rec.fill_zero(self._buf, 0, (self.nbytes + 3) // 4 * 4)
        return self

    def clone(self) -> Tensor:
        from . import functions as F

        if self.dtype == np.float32:
            return F.clone(self)
        out = empty(self.shape, self.dtype, self.device)
        with self.device._recording() as rec:
            rec.copy(self._buf, 0, out._buf, 0, self.nbytes)
        return out

    # -- autograd ------------------------------------------------------------
    def backward(self, gradient: Union[Tensor, np.ndarray, None] = None) -> None:
        """Accumulate d(self)/d(leaf) into every leaf's ``.grad`` (a scalar, or with ``gradient``)."""
        from .autograd import backward

        backward(self, gradient)

    def detach(self) -> Tensor:
        """The same memory, cut from the graph."""
        out = Tensor(self._buf, self.shape, self.dtype, self.device)
        out._batch = self._batch
        return out

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        if self._node is not None and not requires_grad:
            raise RuntimeError("requires_grad_(False) on a non-leaf tensor; use detach()")
        if requires_grad and self.dtype != np.float32:
            raise TypeError(f"only float32 tensors can require gradients, got {self.dtype.name}")
        self.requires_grad = bool(requires_grad)
        return self

    # -- shape ---------------------------------------------------------------
    def reshape(self, *shape: ShapeLike) -> Tensor:
        """A tensor with a new shape over the same buffer (no copy); one dimension may be -1."""
        from . import functions as F

        return F.reshape(self, *shape)

    view = reshape

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        from . import functions as F

        return F.flatten(self, start_dim, end_dim)

    def unsqueeze(self, dim: int) -> Tensor:
        from . import functions as F

        return F.unsqueeze(self, dim)

    def squeeze(self, dim: Optional[int] = None) -> Tensor:
        from . import functions as F

        return F.squeeze(self, dim)

    def transpose(self, dim0: int, dim1: int) -> Tensor:
        from . import functions as F

        return F.transpose(self, dim0, dim1)

    def permute(self, *dims: Union[int, Sequence[int]]) -> Tensor:
        from . import functions as F

        return F.permute(self, *dims)

    @property
    def T(self) -> Tensor:
        if self.ndim != 2:
            raise ValueError(f".T needs a 2-D tensor, got shape {self.shape} (use permute)")
        return self.transpose(0, 1)

    def t(self) -> Tensor:
        return self.T

    def contiguous(self) -> Tensor:
        return self  # every tensor is contiguous

    def expand(self, *shape: ShapeLike) -> Tensor:
        from . import functions as F

        return F.expand(self, *shape)

    def split(self, split_size: Union[int, Sequence[int]], dim: int = 0) -> tuple[Tensor, ...]:
        from . import functions as F

        return F.split(self, split_size, dim)

    def chunk(self, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
        from . import functions as F

        return F.chunk(self, chunks, dim)

    def narrow(self, dim: int, start: int, length: int) -> Tensor:
        from . import functions as F

        return F.narrow(self, dim, start, length)

    def __getitem__(self, index: object) -> Tensor:
        from . import functions as F

        return F.getitem(self, index)

    if TYPE_CHECKING:
        # Set from pywgtrain.functions after the class (see below); declared here
        # so that type checkers see them. Each is the function of that name with
        # this tensor as its first argument.
        def neg(self) -> Tensor: ...
        def abs(self) -> Tensor: ...
        def exp(self) -> Tensor: ...
        def log(self) -> Tensor: ...
        def sqrt(self) -> Tensor: ...
        def rsqrt(self) -> Tensor: ...
        def tanh(self) -> Tensor: ...
        def sigmoid(self) -> Tensor: ...
        def relu(self) -> Tensor: ...
        def silu(self) -> Tensor: ...
        def square(self) -> Tensor: ...
        def pow(self, exponent: Operand) -> Tensor: ...
        def clamp(self, min: Optional[float] = None, max: Optional[float] = None) -> Tensor: ...
        def add(self, other: Operand, alpha: float = 1) -> Tensor: ...
        def sub(self, other: Operand, alpha: float = 1) -> Tensor: ...
        def mul(self, other: Operand) -> Tensor: ...
        def div(self, other: Operand) -> Tensor: ...
        def maximum(self, other: Operand) -> Tensor: ...
        def minimum(self, other: Operand) -> Tensor: ...
        def gt(self, other: Operand) -> Tensor: ...
        def lt(self, other: Operand) -> Tensor: ...
        def ge(self, other: Operand) -> Tensor: ...
        def le(self, other: Operand) -> Tensor: ...
        def eq(self, other: Operand) -> Tensor: ...
        def ne(self, other: Operand) -> Tensor: ...
        def matmul(self, other: Union[Tensor, np.ndarray]) -> Tensor: ...
        def sum(self, dim: Dims = None, keepdim: bool = False) -> Tensor: ...
        def mean(self, dim: Dims = None, keepdim: bool = False) -> Tensor: ...
        def max(self, dim: Optional[int] = None, keepdim: bool = False) -> Any: ...  # Tensor, or (values, indices)
        def var(
            self,
            dim: Dims = None,
            unbiased: Optional[bool] = None,
            keepdim: bool = False,
            correction: Optional[int] = None,
        ) -> Tensor: ...

        std = var  # the same signature

        def softmax(self, dim: int = -1) -> Tensor: ...
        def log_softmax(self, dim: int = -1) -> Tensor: ...
        def __add__(self, other: Operand) -> Tensor: ...
        def __sub__(self, other: Operand) -> Tensor: ...
        def __mul__(self, other: Operand) -> Tensor: ...
        def __truediv__(self, other: Operand) -> Tensor: ...
        def __pow__(self, other: Operand) -> Tensor: ...
        def __matmul__(self, other: Operand) -> Tensor: ...
        def __radd__(self, other: Operand) -> Tensor: ...
        def __rsub__(self, other: Operand) -> Tensor: ...
        def __rmul__(self, other: Operand) -> Tensor: ...
        def __rtruediv__(self, other: Operand) -> Tensor: ...
        def __rpow__(self, other: Operand) -> Tensor: ...
        def __rmatmul__(self, other: Operand) -> Tensor: ...
        def __gt__(self, other: Operand) -> Tensor: ...
        def __lt__(self, other: Operand) -> Tensor: ...
        def __ge__(self, other: Operand) -> Tensor: ...
        def __le__(self, other: Operand) -> Tensor: ...
        def __iadd__(self, other: Operand) -> Tensor: ...
        def __isub__(self, other: Operand) -> Tensor: ...
        def __imul__(self, other: Operand) -> Tensor: ...
        def __itruediv__(self, other: Operand) -> Tensor: ...
        def add_(self, other: Operand) -> Tensor: ...
        def sub_(self, other: Operand) -> Tensor: ...
        def mul_(self, other: Operand) -> Tensor: ...
        def div_(self, other: Operand) -> Tensor: ...
        def __neg__(self) -> Tensor: ...
        def __abs__(self) -> Tensor: ...
        def __eq__(self, other: object) -> Tensor: ...  # type: ignore[override]
        def __ne__(self, other: object) -> Tensor: ...  # type: ignore[override]
        def __hash__(self) -> int: ...


def _unary_method(name):
    def method(self: Tensor, *args: Any, **kwargs: Any) -> Any:  # a Tensor (max(dim): values and indices)
        from . import functions as F

        return getattr(F, name)(self, *args, **kwargs)

    method.__name__ = name
    method.__doc__ = f"See ``pywgtrain.{name}``."
    return method


for _name in (
    "neg",
    "abs",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "tanh",
    "sigmoid",
    "relu",
    "silu",
    "pow",
    "clamp",
    "add",
    "sub",
    "mul",
    "div",
    "maximum",
    "minimum",
    "matmul",
    "sum",
    "mean",
    "max",
    "var",
    "std",
    "softmax",
    "log_softmax",
    "gt",
    "lt",
    "ge",
    "le",
    "eq",
    "ne",
    "square",
):
    setattr(Tensor, _name, _unary_method(_name))


def _binop(name, reverse=False):
    def op(self: Tensor, other: Operand) -> Tensor:
        from . import functions as F

        fn = getattr(F, name)
        return fn(other, self) if reverse else fn(self, other)

    return op


def _inplace(name):
    def op(self: Tensor, other: Operand) -> Tensor:
        from . import functions as F
        from .autograd import is_grad_enabled

        result = getattr(F, name)(self, other)
        if self.requires_grad and is_grad_enabled():
            if self._node is None:
                raise RuntimeError(
                    f"a leaf tensor that requires grad is used in an in-place operation "
                    f"({name}_); use the out-of-place form or pywgtrain.no_grad()"
                )
            return result  # the name is rebound to the out-of-place result; its graph stays intact
        if result.shape != self.shape:
            raise ValueError(
                f"{name}_: the result of shape {result.shape} does not fit the tensor of shape {self.shape}"
            )
        with self.device._recording() as rec:
            _core.unary(rec, 0, result._buf, self._buf, self.size, 0.0, 0.0, 0.0)
        return self

    return op


for _name, _op in (
    ("add", "__add__"),
    ("sub", "__sub__"),
    ("mul", "__mul__"),
    ("div", "__truediv__"),
    ("pow", "__pow__"),
    ("matmul", "__matmul__"),
    ("gt", "__gt__"),
    ("lt", "__lt__"),
    ("ge", "__ge__"),
    ("le", "__le__"),
):
    setattr(Tensor, _op, _binop(_name))
for _name, _op in (
    ("add", "__radd__"),
    ("sub", "__rsub__"),
    ("mul", "__rmul__"),
    ("div", "__rtruediv__"),
    ("pow", "__rpow__"),
    ("matmul", "__rmatmul__"),
):
    setattr(Tensor, _op, _binop(_name, reverse=True))
for _name in ("add", "sub", "mul", "div"):
    _f = _inplace(_name)
    setattr(Tensor, f"__i{'truediv' if _name == 'div' else _name}__", _f)
    setattr(Tensor, f"{_name}_", _f)
Tensor.__neg__ = _unary_method("neg")
Tensor.__abs__ = _unary_method("abs")
# Tensors are identity-hashed (autograd keys, sets); == builds an eq tensor like torch.
Tensor.__hash__ = object.__hash__
Tensor.__eq__ = _binop("eq")
Tensor.__ne__ = _binop("ne")


def _check_array(x, name, dtype=np.float32):
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray or pywgtrain.Tensor, got {type(x).__name__}")
    if x.dtype != np.dtype(dtype):
        raise TypeError(f"{name} must have dtype {np.dtype(dtype).name}, got {x.dtype.name}")
    if not x.flags.c_contiguous:
        raise ValueError(
            f"{name} must be C-contiguous (got a strided or Fortran-ordered array); use np.ascontiguousarray"
        )
    if x.ndim == 0:
        raise ValueError(f"{name} must have at least one dimension, got a 0-d array")
    if x.size == 0:
        raise ValueError(f"{name} is empty (shape {x.shape}); zero-size arrays are not supported")
    if any(s > MAX_DIM for s in x.shape):
        raise ValueError(f"{name} has a dimension above {MAX_DIM} (shape {x.shape})")
    return x


def _check_flag(fn, name, flag):
    """A bool or NumPy bool, as a bool; TypeError naming the function and argument otherwise."""
    if not isinstance(flag, (bool, np.bool_)):
        raise TypeError(f"{fn}: {name} must be a bool, got {type(flag).__name__} {flag!r}")
    return bool(flag)


def _check_same(a, b, name):
    if a.device is not b.device:
        raise ValueError(f"{name} lives on {b.device!r}, expected {a.device!r}")
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"{name} has shape {b.shape} and dtype {b.dtype.name}, expected {a.shape} and {a.dtype.name}")


def _resolve_device(device):
    if device is None:
        return default_device()
    if not isinstance(device, Device):
        raise TypeError(f"device must be a pywgtrain.Device, got {type(device).__name__}")
    return device


def _is_int_tuple(shape):
    """A tuple of plain ints: the common shape, checked without the
    numbers.Integral ABC machinery (every new tensor passes here)."""
    return type(shape) is tuple and all(type(s) is int for s in shape)


def _shape_arg(shape, name="shape"):
    if _is_int_tuple(shape):
        return shape
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise TypeError(f"{name} must be an int or a sequence of ints, got {type(shape).__name__}") from None
    for s in dims:
        if isinstance(s, bool) or not isinstance(s, numbers.Integral):
            raise TypeError(f"{name} must hold ints, got {s!r} in {dims}")
    return tuple(int(s) for s in dims)


def empty(
    shape: ShapeLike, dtype: DTypeLike = np.float32, device: Optional[Device] = None, requires_grad: bool = False
) -> Tensor:
    """Uninitialized device tensor (``shape`` may be ``()`` for a scalar)."""
    device = _resolve_device(device)
    shape = _shape_arg(shape)
    dtype = np.dtype(dtype)
    if dtype not in _DTYPES:
        raise TypeError(f"dtype must be float32 or int32, got {dtype.name}")
    if any(s <= 0 for s in shape):
        raise ValueError(f"shape must have all dimensions >= 1, got {shape}")
    if any(s > MAX_DIM for s in shape):
        raise ValueError(f"shape has a dimension above {MAX_DIM}: {shape}")
    nbytes = math.prod(shape) * dtype.itemsize
    return Tensor(_core._Buffer(device._dev, nbytes), shape, dtype, device, requires_grad)


def zeros(
    shape: ShapeLike, dtype: DTypeLike = np.float32, device: Optional[Device] = None, requires_grad: bool = False
) -> Tensor:
    """Device tensor filled with zeros."""
    t = empty(shape, dtype, device)
    t.zero_()
    t.requires_grad = bool(requires_grad)
    return t


def full(shape: ShapeLike, value: float, device: Optional[Device] = None, requires_grad: bool = False) -> Tensor:
    """float32 device tensor filled with ``value``."""
    t = empty(shape, np.float32, device)
    t.fill_(value)
    t.requires_grad = bool(requires_grad)
    return t


def ones(shape: ShapeLike, device: Optional[Device] = None, requires_grad: bool = False) -> Tensor:
    return full(shape, 1.0, device, requires_grad)


def tensor(
    data: Union[np.ndarray, Tensor],
    device: Optional[Device] = None,
    dtype: Optional[DTypeLike] = None,
    requires_grad: bool = False,
) -> Tensor:
    """Upload a NumPy array (float32, or int32) to the device. A Tensor is
    returned as it is when it already lives on ``device`` (or no device is
    given); a Tensor of another device is refused: read it back first."""
    if isinstance(data, Tensor):
        if device is not None and _resolve_device(device) is not data.device:
            raise ValueError(
                f"tensor(): data lives on {data.device!r}, not on {device!r}; copy it across with "
                "pywgtrain.tensor(t.numpy(), device)"
            )
        if dtype is not None and np.dtype(dtype) != data.dtype:
            raise TypeError(f"tensor(): data has dtype {data.dtype.name}, asked for {np.dtype(dtype).name}")
        return data
    if dtype is not None:
        data = np.ascontiguousarray(data, dtype=dtype)
    if not isinstance(data, np.ndarray):
        raise TypeError(f"data must be a numpy.ndarray, got {type(data).__name__}")
    if data.dtype not in _DTYPES:
        raise TypeError(f"data must have dtype float32 or int32, got {data.dtype.name}")
    if data.ndim == 0:  # a scalar: stored as one element, shaped ()
        t = tensor(data.reshape(1), device, requires_grad=requires_grad)
        t.shape = ()
        return t
    _check_array(data, "data", data.dtype)
    if requires_grad and data.dtype != np.float32:
        raise TypeError(f"only float32 tensors can require gradients, got {data.dtype.name}")
    t = empty(data.shape, data.dtype, device, requires_grad)
    t._buf.upload(data.reshape(-1).view(np.uint8))
    t._batch = None  # its contents come from the host, not from the batch
    return t
