"""Device tensors: a GPU buffer with a shape, a dtype and an autograd record."""

from __future__ import annotations

import math
import numbers
import threading
import weakref
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union, overload

import numpy as np

from . import _core
from ._opcodes import BINARY
from ._typing import Dims, DTypeLike, ShapeLike
from .autograd import Node, is_grad_enabled
from .autograd import backward as _run_backward
from .device import Device, resolve_device

if TYPE_CHECKING:
    from typing import TypeGuard  # Python 3.10+; annotations only

# The ops (pywgtrain.functions) sit above this module: they create and check
# Tensors, so the methods below cannot import them. functions.py registers
# itself here when it is imported, as kernels register with a dispatcher.
F: Any = None


Scalar = float  # a Python number in Tensor's method signatures (where `float` names the method)


def _size_args(size: tuple[Any, ...]) -> tuple[int, ...]:
    """Sizes given as ints or as one sequence (torch's ``*size``)."""
    return tuple(int(n) for n in (size[0] if len(size) == 1 and not isinstance(size[0], int) else size))


def _register_ops(module: ModuleType) -> None:
    global F
    F = module


_ADD, _SUB, _MUL, _DIV = BINARY["add"], BINARY["sub"], BINARY["mul"], BINARY["div"]
_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int32))
_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))  # those autograd differentiates
_HALF = np.dtype(np.float16)
_DTYPE_NAMES = "float32, float16 or int32"
MAX_DIM = 2**31 - 1  # kernels index with 32-bit integers


if TYPE_CHECKING:  # mypy cannot see into the extension; it reads the fields from __init__
    _TensorFields = object
else:
    _TensorFields = _core._TensorFields


class Tensor(_TensorFields):
    """An array in GPU memory (float32, float16, or int32 for labels and ids).

    Create with :func:`tensor` / :func:`zeros` / :func:`empty`; read back with
    ``.numpy()`` or ``.item()``. Float tensors take part in autograd:
    ``requires_grad``, ``.grad``, ``.backward()``, ``.detach()`` behave as in
    PyTorch; the ops (``+ - * / @ **``, ``.exp()``, ``.sum(dim)``, ...) are
    listed in ``docs/ops.md``. Shape ops return views sharing memory, as in
    PyTorch (``reshape``, ``view``, slicing, ``narrow``, ``select``,
    ``transpose``/``.T``/``permute``, ``expand``, ``unsqueeze``/``squeeze``,
    ``split``/``chunk``); in-place methods write the tensor and the storage it
    views, and bump its version counter. Kernels read strided views through a
    contiguous copy they make themselves.
    """

    if not TYPE_CHECKING:
        __slots__ = ()  # the fields are _core._TensorFields'
    shape: tuple[int, ...]
    dtype: np.dtype
    device: Device
    requires_grad: bool
    grad: Optional[Tensor]

    def __init__(
        self, buf: _core._Buffer, shape: Sequence[int], dtype: DTypeLike, device: Device, requires_grad: bool = False
    ) -> None:
        self._store = _core._Storage(buf)
        self._offset = 0  # elements from the start of the storage
        self._strides = None  # element strides; None: contiguous (row-major)
        self._base = None  # the tensor this one is a view of (PyTorch's ._base)
        self.shape = shape if _is_int_tuple(shape) else tuple(int(s) for s in shape)
        self.dtype = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
        self.device = device
        self._numel = math.prod(self.shape)
        self._whole = True  # it is its storage (bound whole, also where the buffer is larger than it)
        self.requires_grad = bool(requires_grad)
        self.grad = None
        self._node = None  # the op that produced this tensor (autograd), None for leaves
        self._grad_home: Optional[Tensor] = None  # grad_home: where a new .grad lives
        self._batch = device._current_batch_token() if device is not None else None
        self._retains_grad = False
        self._view_of = None  # views: their base's grad_fn when they were made

    # -- memory --------------------------------------------------------------
    @property
    def _buf(self) -> _core._Buffer:
        """A buffer holding exactly this tensor's elements in row-major order,
        bindable by the kernels: the storage itself, an aligned view of it, or
        (strided or unaligned views) a fresh copy recorded now."""
        if self._whole:
            return self._store.buf
        return self._view_buffer()

    @property
    def _bindable(self) -> bool:
        """Whether kernels can bind this tensor's memory as it is: contiguous, at an aligned offset."""
        return self._whole or (
            self._strides is None and self._offset * self.dtype.itemsize % self.device._cache.offset_align == 0
        )

    def _view_buffer(self):
        store = self._store
        if self._bindable:
            return store.buf.view(self._offset * self.dtype.itemsize, self.nbytes)
        out = _core._Buffer(self.device._dev, self.nbytes)
        shape = list(self.shape) or [1]
        with self.device._recording() as rec:
            _core.strided_copy(
                rec,
                store.buf,
                self._offset,
                list(self.stride()) or [1],
                out,
                0,
                _contiguous_strides(shape),
                shape,
                0.0,
                self._half_copy,
            )
        return out

    @property
    def _half_copy(self) -> int:
        """The strided copy's element-type mask for a copy of this tensor's dtype (2-byte
        elements move as raw 16-bit patterns; tensor_ops.hpp HalfMask: src and dst)."""
        return 9 if self.dtype == _HALF else 0

    @overload
    def stride(self) -> tuple[int, ...]: ...
    @overload
    def stride(self, dim: int) -> int: ...
    def stride(self, dim: Optional[int] = None) -> Union[tuple[int, ...], int]:
        """Element strides, as ``torch.Tensor.stride``."""
        st = self._strides if self._strides is not None else tuple(_contiguous_strides(self.shape))
        return st if dim is None else st[dim]

    def storage_offset(self) -> int:
        return self._offset

    def is_contiguous(self) -> bool:
        return self._strides is None

    def untyped_storage(self) -> _core._Storage:
        """The memory this tensor views, shared with its views and with tensors ``set_`` to it
        (``torch.Tensor.untyped_storage``); compare storages with ``is``."""
        return self._store

    def is_set_to(self, tensor: Tensor) -> bool:
        """Whether both tensors view the same storage at the same offset, shape and strides
        (``torch.Tensor.is_set_to``)."""
        return (
            isinstance(tensor, Tensor)
            and self._store is tensor._store
            and self._offset == tensor._offset
            and self.shape == tensor.shape
            and self.stride() == tensor.stride()
        )

    def set_(self, source: Tensor) -> Tensor:
        """Make this tensor view ``source``'s memory (``torch.Tensor.set_(source)``): its storage,
        offset, strides and shape, which it shares from then on, while the tensor object, its
        ``requires_grad``, ``.grad`` and ``grad_home`` stay. Views taken of this tensor before keep
        the old memory, as in PyTorch. An in-place change: the storage's version counter is
        bumped (the counter belongs to the storage here, so it is ``source``'s).

        Same dtype and device. As in PyTorch, a leaf that requires grad takes it only under
        ``no_grad()``; a tensor with autograd history, a view, and (with grad mode on) a
        ``source`` that requires grad are refused: ``set_`` is not differentiable."""
        if not isinstance(source, Tensor):
            raise TypeError(f"set_: source must be a pywgtrain.Tensor, got {type(source).__name__}")
        if source.device is not self.device:
            raise ValueError(f"set_: source lives on {source.device!r}, this tensor on {self.device!r}")
        if source.dtype != self.dtype:
            raise TypeError(f"set_: source has dtype {source.dtype.name}, this tensor {self.dtype.name}")
        if self._base is not None:
            raise RuntimeError("set_: this tensor is a view of another; set_ its base instead, or a clone()")
        if self._node is not None:
            raise RuntimeError("set_: this tensor has autograd history (a grad_fn); set_ a detach()ed tensor")
        graph = is_grad_enabled()
        self._check_inplace("set_", graph)
        if graph and source.requires_grad:
            raise RuntimeError(
                "set_: source requires grad and set_ is not differentiable; wrap it in pywgtrain.no_grad() "
                "or pass source.detach()"
            )
        self._store, self._offset, self._strides = source._store, source._offset, source._strides
        self.shape, self._numel, self._whole = source.shape, source._numel, source._whole
        self._batch = source._batch  # the memory's pending writer, if any
        self._bump_version()
        return self

    def move_storage_(self, dest: Tensor) -> Tensor:
        """Move this tensor's memory into ``dest``'s: copy the values there, then this tensor's
        storage, and so every tensor viewing it (views taken before included), reads and writes
        ``dest``'s memory (no PyTorch counterpart: a fused optimizer gathers the parameters into
        one buffer this way, and a user's views of a parameter keep following it). This tensor
        must cover its whole storage; ``dest`` must be contiguous, of its shape, dtype and
        device, and cover its own storage. An in-place change (version bumped); under
        ``no_grad()`` for a leaf that requires grad, as any in-place write."""
        if not isinstance(dest, Tensor):
            raise TypeError(f"move_storage_: dest must be a pywgtrain.Tensor, got {type(dest).__name__}")
        if dest.device is not self.device or dest.shape != self.shape or dest.dtype != self.dtype:
            raise ValueError(
                f"move_storage_: dest must have this tensor's shape {self.shape}, dtype {self.dtype.name} and "
                f"device {self.device!r}; got {dest.shape}, {dest.dtype.name}, {dest.device!r}"
            )
        if not self._whole or self._base is not None or not dest._whole:
            raise RuntimeError("move_storage_: both tensors must cover their whole storage (not views)")
        self._check_inplace("move_storage_", is_grad_enabled())
        dest.copy_(self.detach())
        self._store.buf = dest._store.buf
        self._batch = dest._batch  # the copy just recorded is the memory's pending writer
        self._bump_version()
        return self

    @property
    def grad_home(self) -> Optional[Tensor]:
        """Where ``backward()`` writes this leaf's gradient while ``.grad`` is None, which then
        becomes ``.grad`` (no copy): a contiguous tensor of this shape, dtype and device, such
        as a view of an optimizer's flat gradient buffer. None (default): backward makes a new
        tensor. A gradient that exists is accumulated into ``.grad``, wherever it lives."""
        return self._grad_home

    @grad_home.setter
    def grad_home(self, home: Optional[Tensor]) -> None:
        if home is not None:
            if not isinstance(home, Tensor):
                raise TypeError(f"grad_home must be a pywgtrain.Tensor or None, got {type(home).__name__}")
            if self._node is not None:
                raise RuntimeError("grad_home: only a leaf's gradient is kept (this tensor has a grad_fn)")
            if home.device is not self.device or home.shape != self.shape or home.dtype != self.dtype:
                raise ValueError(
                    f"grad_home must have this tensor's shape {self.shape}, dtype {self.dtype.name} and device "
                    f"{self.device!r}; got {home.shape}, {home.dtype.name}, {home.device!r}"
                )
            if not home._bindable or home.requires_grad:
                raise ValueError(
                    "grad_home is written by kernels: it must be contiguous at an aligned offset and not require grad"
                )
        self._grad_home = home

    @property
    def half_shadow(self) -> Optional[HalfShadow]:
        """The float16 copy of this tensor that its writer keeps (:class:`HalfShadow`; a fused
        ``AdamW`` keeps one per parameter), or None. It belongs to the memory: the tensor must
        cover its whole storage, as a parameter does; a view has none."""
        sh = self._store.half_shadow
        return sh if sh is not None and self._whole and sh.numel == self._numel else None

    @property
    def _version(self) -> int:
        return self._store.version

    def _bump_version(self) -> None:
        self._store.version += 1

    # -- description ---------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    def dim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self._numel * self.dtype.itemsize

    @property
    def is_leaf(self) -> bool:
        return self._node is None

    @property
    def grad_fn(self) -> Optional[Node]:
        return self._node

    def numel(self) -> int:
        return self._numel

    @overload
    def size(self) -> tuple[int, ...]: ...
    @overload
    def size(self, dim: int) -> int: ...
    def size(self, dim: Optional[int] = None) -> Union[tuple[int, ...], int]:
        """The shape (``torch.Tensor.size``), or one dimension's length; ``numel()`` counts elements."""
        if dim is None:
            return self.shape
        if type(dim) is not int and (isinstance(dim, bool) or not isinstance(dim, numbers.Integral)):
            raise TypeError(f"size(): dim must be an int, got {type(dim).__name__}")
        if not -self.ndim <= dim < self.ndim:
            raise IndexError(f"size(): dim {dim} is out of range for a tensor of {self.ndim} dimensions")
        return self.shape[dim]

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
    def numpy(self, *, out: Optional[np.ndarray] = None) -> np.ndarray:
        """Copy to a NumPy array and return it (waits for the GPU; the GIL is
        released): a new array, or ``out`` (this shape and dtype, C-contiguous,
        writable), so that a loop reading the same tensor reuses one array.
        New arrays of 4 MiB and more take memory from a process-wide pool that
        gets it back when the array (and every view of it) is gone: a fresh
        allocation's pages, faulted in and zeroed during the copy, would halve
        the download's speed (``pywgtrain.host_memory_stats()``)."""
        if out is not None:
            _check_out(out, self.shape, self.dtype, "numpy")
        if self._batch is not None:
            self._batch.check()  # RuntimeError when the work that was to write this tensor was discarded
        if out is None:
            out = _host_array(self.shape, self.dtype)
        buf = self._buf  # a strided view records its contiguous copy here: before the flush submits it
        self.device.flush()
        buf.download(out.reshape(-1).view(np.uint8))
        return out

    def item(self) -> Union[float, int]:
        if self._numel != 1:
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
        if self._numel != 1:
            raise RuntimeError(f"the truth value of a tensor with {self._numel} elements is ambiguous")
        return bool(self.item())

    # -- in-place writes ------------------------------------------------------
    def _check_inplace(self, what: str, graph: bool) -> None:
        """Refuse what PyTorch refuses, before anything is written. ``graph``:
        the write is recorded by autograd (grad mode on and the tensor or the
        written value requires grad)."""
        if self._strides is not None and any(st == 0 and n > 1 for st, n in zip(self._strides, self.shape)):
            raise RuntimeError(
                f"{what}: unsupported operation: more than one element of the written-to tensor refers to a "
                "single memory location (an expanded tensor); clone() it first"
            )
        if not graph:
            return
        if self.requires_grad and self._node is None:
            raise RuntimeError(
                f"{what}: a leaf tensor that requires grad is used in an in-place operation; "
                "wrap it in pywgtrain.no_grad() or use the out-of-place form"
            )
        base = self._base
        if base is not None and base.requires_grad and base._node is None:
            raise RuntimeError(
                f"{what}: a view of a leaf tensor that requires grad is used in an in-place operation; "
                "wrap it in pywgtrain.no_grad() or use the out-of-place form"
            )

    def _write(self, src: Tensor) -> None:
        """Record the copy of ``src`` (this tensor's shape and dtype) into this
        tensor's memory and bump the version counter (no autograd)."""
        shape = list(self.shape) or [1]
        with self.device._recording() as rec:
            if self._bindable and self.dtype != _HALF:  # (2-byte sizes: no whole-word buffer copy)
                if self.dtype == np.float32:
                    _core.unary(rec, 0, src._buf, self._buf, self._numel, 0.0, 0.0, 0.0)
                else:
                    rec.copy(src._buf, 0, self._buf, 0, self.nbytes)
            else:
                _core.strided_copy(
                    rec,
                    src._buf,
                    0,
                    _contiguous_strides(shape),
                    self._store.buf,
                    self._offset,
                    list(self.stride()) or [1],
                    shape,
                    0.0,
                    self._half_copy,
                )
        self._bump_version()

    def _adopt(self, result: Tensor) -> None:
        """Make this tensor the autograd result of ``result``'s op (an in-place op recorded by
        autograd, whose values are already written); a view passes the change on to its base."""
        if self._base is not None:
            F._rebase_view(self, result)
            return
        self._node = result._node
        self.requires_grad = result.requires_grad

    def copy_(self, src: Union[Tensor, np.ndarray]) -> Tensor:
        """Overwrite with ``src`` (array or Tensor) broadcast to this shape, same dtype.
        Differentiable with respect to ``src`` as in PyTorch."""
        if not isinstance(src, Tensor):
            if not isinstance(src, np.ndarray):
                raise TypeError(f"copy_: src must be a numpy.ndarray or pywgtrain.Tensor, got {type(src).__name__}")
            if src.dtype != self.dtype:
                raise TypeError(f"copy_: src must have dtype {self.dtype.name}, got {_dtype_name(src.dtype)}")
            if src.shape != self.shape:
                raise ValueError(f"copy_: src has shape {src.shape}, expected {self.shape}")
            # (float16: uploads write whole 4-byte words, so only into a whole tensor)
            if (self._whole if self.dtype == _HALF else self._strides is None) and not (
                is_grad_enabled() and self.requires_grad
            ):
                self._check_inplace("copy_", False)
                self.device.flush()  # keep order with work recorded earlier in a batch
                self._store.buf.upload(
                    np.ascontiguousarray(src).reshape(-1).view(np.uint8), self._offset * src.itemsize
                )
                self._bump_version()
                self._batch = None
                return self
            src = tensor(np.array(src, order="C"), self.device)  # strided, or recorded by autograd
        if src.device is not self.device:
            raise ValueError(f"copy_: src lives on {src.device!r}, expected {self.device!r}")
        if src.dtype != self.dtype:
            raise ValueError(f"copy_: src has dtype {src.dtype.name}, expected {self.dtype.name}")
        graph = is_grad_enabled() and (self.requires_grad or src.requires_grad)
        self._check_inplace("copy_", graph)
        value = src if src.shape == self.shape else F.expand(src, self.shape)
        if graph:
            value = F.clone(value)  # the op autograd records: the gradient goes to src only
        self._write(value)
        if graph:  # src's gradient flows through value; the old values get none
            self._adopt(value if value.requires_grad else F._filled(self))
        return self

    def fill_(self, value: float) -> Tensor:
        if self.dtype != np.float32:
            raise TypeError(f"fill_ needs a float32 tensor, got {self.dtype.name}")
        graph = is_grad_enabled() and self.requires_grad
        self._check_inplace("fill_", graph)
        if self._whole:
            with self.device._recording() as rec:
                _core.fill(rec, self._buf, self._numel, float(value))
            self._bump_version()
        else:
            self._write(full(self.shape, value, self.device))
        if graph:
            self._adopt(F._filled(self))
        return self

    def zero_(self) -> Tensor:
        if self.dtype == np.float32:
            return self.fill_(0.0)
        self._check_inplace("zero_", False)
        if self._whole:
            # A recorded fill, not a buffer clear, so captured step graphs can hold it; int32 zeros
            # are float32 zeros' bits.
            half = self.dtype == _HALF
            with self.device._recording() as rec:
                _core.fill(rec, self._buf, self._numel, 0.0, half)
            self._bump_version()
        else:
            self._write(zeros(self.shape, self.dtype, self.device))
        return self

    def __setitem__(self, index: object, value: Union[Tensor, np.ndarray, float]) -> None:
        """``x[index] = value`` for basic indices (ints, slices, None, ...): writes the view."""
        if isinstance(index, (Tensor, np.ndarray, list)):
            raise TypeError("x[index] = value: integer-array (advanced) indices are not supported for assignment")
        view = F.getitem(self, index)
        if view._store is not self._store:
            raise TypeError(f"x[index] = value: index {index!r} does not select a view")
        if isinstance(value, Tensor):
            view.copy_(value)
        elif self.dtype == np.float32 and F._is_scalar(value):
            view.fill_(float(value))
        else:
            view.copy_(np.broadcast_to(np.asarray(value, self.dtype), view.shape))

    def clone(self) -> Tensor:
        if self.dtype == np.float32 or self.dtype == _HALF:
            return F.clone(self)
        out = empty(self.shape, self.dtype, self.device)
        with self.device._recording() as rec:
            rec.copy(self._buf, 0, out._buf, 0, self.nbytes)
        return out

    # -- autograd ------------------------------------------------------------
    def backward(self, gradient: Union[Tensor, np.ndarray, None] = None, retain_graph: Optional[bool] = None) -> None:
        """Accumulate d(self)/d(leaf) into every leaf's ``.grad`` (a scalar, or with ``gradient``).
        ``retain_graph=True`` keeps the graph for another backward, as in PyTorch."""
        if not self.requires_grad:
            raise RuntimeError(
                "backward(): the tensor does not require grad and has no grad_fn (no input of the ops "
                "that made it has requires_grad=True, or it was computed under no_grad())"
            )
        if gradient is None:
            if self._numel != 1:
                raise RuntimeError(
                    f"backward(): grad can be implicitly created only for scalar outputs; this tensor has "
                    f"shape {self.shape}: pass gradient= of that shape"
                )
            gradient = _one(self.device).reshape(self.shape)
            if self.dtype == _HALF:
                gradient = F.to_dtype(gradient, _HALF)
        else:
            if not isinstance(gradient, Tensor):
                arr = np.asarray(gradient)
                if arr.dtype != self.dtype:  # refused, not cast, like every op's inputs
                    raise TypeError(f"backward(): gradient must be {self.dtype.name}, got {arr.dtype.name}")
                gradient = tensor(np.ascontiguousarray(arr), self.device)
            if gradient.device is not self.device:
                raise ValueError(f"backward(): gradient lives on {gradient.device!r}, the tensor on {self.device!r}")
            if gradient.shape != self.shape:
                raise ValueError(f"backward(): gradient has shape {gradient.shape}, the tensor {self.shape}")
            if gradient.dtype != self.dtype:
                raise TypeError(f"backward(): gradient must be {self.dtype.name}, got {gradient.dtype.name}")
        _run_backward(self, gradient, retain_graph)

    def retain_grad(self) -> None:
        """Keep this non-leaf tensor's gradient in ``.grad`` during backward (leaves always do)."""
        if not self.requires_grad:
            raise RuntimeError("retain_grad(): can't retain_grad on a tensor that has requires_grad=False")
        if self._node is not None:
            self._retains_grad = True

    @property
    def retains_grad(self) -> bool:
        return self._retains_grad

    def detach(self) -> Tensor:
        """The same memory (and version counter), cut from the graph."""
        out = _make_view(self, self.shape, self.stride(), self._offset)
        out._base = self._base
        return out

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        if self._node is not None and not requires_grad:
            raise RuntimeError("requires_grad_(False) on a non-leaf tensor; use detach()")
        if requires_grad and self.dtype not in _FLOAT_DTYPES:
            raise TypeError(
                f"only floating-point tensors (float32, float16) can require gradients, got {self.dtype.name}"
            )
        self.requires_grad = bool(requires_grad)
        return self

    # -- shape ---------------------------------------------------------------
    def reshape(self, *shape: ShapeLike) -> Tensor:
        """A view with a new shape when the strides allow, else a copy; one dimension may be -1."""
        return F.reshape(self, *shape)

    def view(self, *shape: ShapeLike) -> Tensor:
        """A view with a new shape (RuntimeError where the strides do not allow one, as in PyTorch)."""
        return F.view(self, *shape)

    def select(self, dim: int, index: int) -> Tensor:
        return F.select(self, dim, index)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        return F.flatten(self, start_dim, end_dim)

    def unsqueeze(self, dim: int) -> Tensor:
        return F.unsqueeze(self, dim)

    def squeeze(self, dim: Optional[int] = None) -> Tensor:
        return F.squeeze(self, dim)

    def transpose(self, dim0: int, dim1: int) -> Tensor:
        return F.transpose(self, dim0, dim1)

    def permute(self, *dims: Union[int, Sequence[int]]) -> Tensor:
        return F.permute(self, *dims)

    @property
    def T(self) -> Tensor:
        if self.ndim != 2:
            raise ValueError(f".T needs a 2-D tensor, got shape {self.shape} (use permute)")
        return self.transpose(0, 1)

    def t(self) -> Tensor:
        return self.T

    def contiguous(self) -> Tensor:
        """This tensor when it is contiguous, else a contiguous copy (differentiable)."""
        return self if self._strides is None else F.contiguous(self)

    def expand(self, *shape: ShapeLike) -> Tensor:
        return F.expand(self, *shape)

    def split(self, split_size: Union[int, Sequence[int]], dim: int = 0) -> tuple[Tensor, ...]:
        return F.split(self, split_size, dim)

    def chunk(self, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
        return F.chunk(self, chunks, dim)

    def narrow(self, dim: int, start: int, length: int) -> Tensor:
        return F.narrow(self, dim, start, length)

    def __getitem__(self, index: object) -> Tensor:
        return F.getitem(self, index)

    def new_empty(self, size: ShapeLike, dtype: Optional[DTypeLike] = None) -> Tensor:
        """An uninitialized tensor on this tensor's device, of this dtype unless given (``torch.Tensor.new_empty``)."""
        return empty(size, self.dtype if dtype is None else dtype, self.device)

    # -- ops: each is the function of that name in pywgtrain with this tensor first (docs/ops.md) --
    def neg(self) -> Tensor:
        return F.neg(self)

    def abs(self) -> Tensor:
        return F.abs(self)

    def exp(self) -> Tensor:
        return F.exp(self)

    def log(self) -> Tensor:
        return F.log(self)

    def sqrt(self) -> Tensor:
        return F.sqrt(self)

    def rsqrt(self) -> Tensor:
        return F.rsqrt(self)

    def tanh(self) -> Tensor:
        return F.tanh(self)

    def sigmoid(self) -> Tensor:
        return F.sigmoid(self)

    def relu(self) -> Tensor:
        return F.relu(self)

    def silu(self) -> Tensor:
        return F.silu(self)

    def square(self) -> Tensor:
        return F.square(self)

    def pow(self, exponent: Operand) -> Tensor:
        return F.pow(self, exponent)

    def clamp(self, min: Optional[float] = None, max: Optional[float] = None) -> Tensor:  # noqa: A002 - torch's names
        return F.clamp(self, min, max)

    def add(self, other: Operand, alpha: float = 1) -> Tensor:
        return F.add(self, other, alpha)

    def sub(self, other: Operand, alpha: float = 1) -> Tensor:
        return F.sub(self, other, alpha)

    def mul(self, other: Operand) -> Tensor:
        return F.mul(self, other)

    def div(self, other: Operand) -> Tensor:
        return F.div(self, other)

    def maximum(self, other: Operand) -> Tensor:
        return F.maximum(self, other)

    def minimum(self, other: Operand) -> Tensor:
        return F.minimum(self, other)

    def gt(self, other: Operand) -> Tensor:
        return F.gt(self, other)

    def lt(self, other: Operand) -> Tensor:
        return F.lt(self, other)

    def ge(self, other: Operand) -> Tensor:
        return F.ge(self, other)

    def le(self, other: Operand) -> Tensor:
        return F.le(self, other)

    def eq(self, other: Operand) -> Tensor:
        return F.eq(self, other)

    def ne(self, other: Operand) -> Tensor:
        return F.ne(self, other)

    def to(self, dtype: DTypeLike) -> Tensor:
        """This tensor as ``dtype`` (itself when it already is): float32 <-> float16, rounding to
        nearest even; differentiable, the gradient cast back (``torch.Tensor.to(dtype)``)."""
        return F.to_dtype(self, dtype)

    def half(self) -> Tensor:
        return F.to_dtype(self, np.float16)

    def float(self) -> Tensor:
        return F.to_dtype(self, np.float32)

    def matmul(self, other: TensorLike) -> Tensor:
        out = _core.gemm_fast(_core.GEMM_MATMUL, self, other, None, False, False)  # as the operators below
        return F.matmul(self, other) if out is None else out

    def sum(self, dim: Dims = None, keepdim: bool = False) -> Tensor:
        return F.sum(self, dim, keepdim)

    def mean(self, dim: Dims = None, keepdim: bool = False) -> Tensor:
        return F.mean(self, dim, keepdim)

    def max(self, dim: Optional[int] = None, keepdim: bool = False) -> Any:  # a Tensor, or (values, indices)
        return F.max(self, dim, keepdim)

    def min(self, dim: Optional[int] = None, keepdim: bool = False) -> Any:  # a Tensor, or (values, indices)
        return F.min(self, dim, keepdim)

    def argmax(self, dim: Optional[int] = None, keepdim: bool = False) -> Tensor:
        return F.argmax(self, dim, keepdim)

    def argmin(self, dim: Optional[int] = None, keepdim: bool = False) -> Tensor:
        return F.argmin(self, dim, keepdim)

    def isnan(self) -> Tensor:
        return F.isnan(self)

    def isinf(self) -> Tensor:
        return F.isinf(self)

    def isfinite(self) -> Tensor:
        return F.isfinite(self)

    def masked_fill(self, mask: Any, value: Scalar) -> Tensor:
        return F.masked_fill(self, mask, value)

    def masked_fill_(self, mask: Any, value: Scalar) -> Tensor:
        """In place (through views too; the version counter moves), differentiable as copy_."""
        return self.copy_(F.masked_fill(self, mask, value))

    def tril(self, diagonal: int = 0) -> Tensor:
        return F.tril(self, diagonal)

    def triu(self, diagonal: int = 0) -> Tensor:
        return F.triu(self, diagonal)

    def repeat(self, *sizes: ShapeLike) -> Tensor:
        """``torch.Tensor.repeat``: the tensor tiled ``sizes[i]`` times along each dimension
        (leading sizes add dimensions); a copy."""
        reps = _size_args(sizes)
        if len(reps) < self.ndim:
            raise ValueError(
                f"repeat: {len(reps)} sizes for a tensor of {self.ndim} dimensions (at least as many needed)"
            )
        shape = (1,) * (len(reps) - self.ndim) + self.shape
        inter = [d for n in shape for d in (1, n)]  # [1, n0, 1, n1, ...]: tile by expanding the 1s
        tiled = [d for r, n in zip(reps, shape) for d in (r, n)]
        return self.reshape(inter).expand(*tiled).reshape([r * n for r, n in zip(reps, shape)])

    def expand_as(self, other: Tensor) -> Tensor:
        return self.expand(*other.shape)

    def type_as(self, other: Tensor) -> Tensor:
        return self.to(other.dtype)

    def new_zeros(self, *size: ShapeLike) -> Tensor:
        """Zeros of ``size`` with this tensor's dtype and device."""
        return zeros(_size_args(size), self.dtype, self.device)

    def new_ones(self, *size: ShapeLike) -> Tensor:
        return self.new_full(_size_args(size), 1.0)

    def new_full(self, size: ShapeLike, fill_value: Scalar) -> Tensor:
        return F._constant(_shape_arg(size), fill_value, self.dtype, self.device, "new_full")

    def var(
        self, dim: Dims = None, unbiased: Optional[bool] = None, keepdim: bool = False, correction: Optional[int] = None
    ) -> Tensor:
        return F.var(self, dim, unbiased, keepdim, correction)

    def std(
        self, dim: Dims = None, unbiased: Optional[bool] = None, keepdim: bool = False, correction: Optional[int] = None
    ) -> Tensor:
        return F.std(self, dim, unbiased, keepdim, correction)

    def softmax(self, dim: int = -1) -> Tensor:
        return F.softmax(self, dim)

    def log_softmax(self, dim: int = -1) -> Tensor:
        return F.log_softmax(self, dim)

    def logsumexp(self, dim: Union[int, tuple[int, ...], list[int]], keepdim: bool = False) -> Tensor:
        return F.logsumexp(self, dim, keepdim)

    # The operators try the common case (float32 tensors of one device, bound as they are) in one
    # Cython call first; F's ops take every other call.
    def __add__(self, other: Operand) -> Tensor:
        out = _core.binary_fast(_ADD, self, other)
        return F.add(self, other) if out is None else out

    def __sub__(self, other: Operand) -> Tensor:
        out = _core.binary_fast(_SUB, self, other)
        return F.sub(self, other) if out is None else out

    def __mul__(self, other: Operand) -> Tensor:
        out = _core.binary_fast(_MUL, self, other)
        return F.mul(self, other) if out is None else out

    def __truediv__(self, other: Operand) -> Tensor:
        out = _core.binary_fast(_DIV, self, other)
        return F.div(self, other) if out is None else out

    __neg__ = neg
    __abs__ = abs
    __pow__ = pow
    __matmul__ = matmul

    def __radd__(self, other: Operand) -> Tensor:
        return F.add(other, self)

    def __rsub__(self, other: Operand) -> Tensor:
        return F.sub(other, self)

    def __rmul__(self, other: Operand) -> Tensor:
        return F.mul(other, self)

    def __rtruediv__(self, other: Operand) -> Tensor:
        return F.div(other, self)

    def __rpow__(self, other: Operand) -> Tensor:
        return F.pow(other, self)

    def __rmatmul__(self, other: TensorLike) -> Tensor:
        return F.matmul(other, self)

    def __gt__(self, other: Any) -> Tensor:  # Any: a Tensor, array or number, as torch's stubs
        return F.gt(self, other)

    def __lt__(self, other: Any) -> Tensor:  # Any: a Tensor, array or number, as torch's stubs
        return F.lt(self, other)

    def __ge__(self, other: Any) -> Tensor:  # Any: a Tensor, array or number, as torch's stubs
        return F.ge(self, other)

    def __le__(self, other: Any) -> Tensor:  # Any: a Tensor, array or number, as torch's stubs
        return F.le(self, other)

    def __eq__(self, other: object) -> Tensor:  # type: ignore[override]  # an eq tensor, as torch
        return F.eq(self, other)

    def __ne__(self, other: object) -> Tensor:  # type: ignore[override]
        return F.ne(self, other)

    __hash__ = object.__hash__  # identity: tensors key autograd's tables and sets

    # -- in-place arithmetic ---------------------------------------------------
    def _inplace(self, name: str, other: Operand) -> Tensor:
        graph = is_grad_enabled() and (self.requires_grad or getattr(other, "requires_grad", False))
        self._check_inplace(f"{name}_", graph)
        src = self
        if graph and name in ("mul", "div") and not F._is_scalar(other):
            src = F.clone(self)  # the product's backward reads the original values, which the write replaces
        result = getattr(F, name)(src, other)
        if result.shape != self.shape:
            raise ValueError(
                f"{name}_: the result of shape {result.shape} does not fit the tensor of shape {self.shape}"
            )
        self._write(result)
        if graph:
            self._adopt(result)
        return self

    def add_(self, other: Operand) -> Tensor:
        return self._inplace("add", other)

    def sub_(self, other: Operand) -> Tensor:
        return self._inplace("sub", other)

    def mul_(self, other: Operand) -> Tensor:
        return self._inplace("mul", other)

    def div_(self, other: Operand) -> Tensor:
        return self._inplace("div", other)

    __iadd__ = add_
    __isub__ = sub_
    __imul__ = mul_
    __itruediv__ = div_


class HalfShadow:
    """A float16 copy of a float32 tensor (the master) that the master's writer keeps up to
    date, so that readers who want float16 (autocast's products) read it instead of casting
    the master each time. A fused ``AdamW`` registers one per parameter and writes it in the
    update's dispatch; ``functions`` reads it under autocast.

    The copy counts only while it matches the master: it records the master's version when
    it is written (``read``'s cast, or the writer's ``written()``), and every other write of
    the master (in-place ops, ``copy_``, ``load_state_dict``, ``set_``, ``move_storage_``)
    bumps that version, after which ``read`` casts afresh into it. ``make()`` gives the
    float16 memory (a contiguous float16 tensor of the master's shape and device) on the
    first ``read``, so a master nobody reads in float16 costs nothing. Creating a shadow
    attaches it to the master's storage (``Tensor.half_shadow``), replacing any other; the
    shadow refers to that storage weakly (no reference cycle outlives the master)."""

    def __init__(self, master: Tensor, make: Callable[[], Tensor]) -> None:
        if not isinstance(master, Tensor) or master.dtype != np.float32 or not master._whole:
            raise ValueError("HalfShadow: the master must be a float32 tensor covering its whole storage")
        self._store = weakref.ref(master._store)
        self.shape, self.numel, self.device = master.shape, master._numel, master.device
        self._make = make
        self._copy: Optional[Tensor] = None
        self._matches: Optional[int] = None  # the master's version the copy equals; None: none yet
        self.reads = 0  # read() calls (graphs.graph() tells what a capture read by it)
        master._store.half_shadow = self
        _SHADOWS.add(self)

    @property
    def alive(self) -> bool:
        """Whether the master's storage still exists."""
        return self._store() is not None

    @property
    def master_version(self) -> Optional[int]:
        store = self._store()
        return None if store is None else store.version

    def current(self) -> bool:
        """Whether the copy exists and equals the master rounded to float16."""
        version = self.master_version
        return self._copy is not None and version is not None and self._matches == version

    def read(self, rec: Any) -> Tensor:
        """The copy (a float16 tensor over the shadow's memory), equal to the master: when
        the master was written since the copy was, a cast into it is recorded in ``rec``
        first (a backward that saved the old copy then refuses, as for any in-place write)."""
        self.reads += 1
        store = self._store()
        if store is None:
            raise RuntimeError("HalfShadow.read: the master tensor no longer exists")
        if not self.current():
            if self._copy is None:
                with _SHADOW_LOCK:  # one copy tensor (one version counter) whichever thread reads first
                    if self._copy is None:
                        copy = self._make()
                        if (
                            not isinstance(copy, Tensor)
                            or copy.dtype != _HALF
                            or copy.shape != self.shape
                            or copy.device is not self.device
                            or not copy._bindable
                        ):
                            raise ValueError(
                                f"HalfShadow: make() must give a contiguous float16 tensor of shape {self.shape} "
                                f"on {self.device!r}"
                            )
                        self._copy = copy
            _core.cast(rec, store.buf, self._copy._buf, self.numel, True)
            self._copy._bump_version()
            self._matches = store.version
        assert self._copy is not None
        return self._copy

    def written(self) -> None:
        """The writer has just written the master (and bumped its version) and, in the same
        work, the copy: the copy matches again. Nothing happens before the first ``read``
        (there is no copy to match)."""
        if self._copy is not None:
            self._copy._bump_version()
            self._matches = self.master_version

    def replayed(self, consistent: bool) -> None:
        """A replayed graph wrote the master (graphs.py): the host did not see the write, so
        the version moves as an eager run would have moved it; ``consistent``: the graph also
        rewrote the copy after its last write of the master (then the copy matches)."""
        store = self._store()
        if store is not None:
            store.version += 1
            if consistent:
                self.written()


_SHADOWS: weakref.WeakSet[HalfShadow] = weakref.WeakSet()
_SHADOW_LOCK = threading.Lock()


def half_shadows(device: Device) -> list[HalfShadow]:
    """The live float16 shadows of ``device``'s tensors (graphs.graph() compares them around a
    capture)."""
    return [sh for sh in list(_SHADOWS) if sh.device is device and sh.alive]


def _check_array(x, name, dtype=np.float32):
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray or pywgtrain.Tensor, got {type(x).__name__}")
    if x.dtype != np.dtype(dtype):
        raise TypeError(f"{name} must have dtype {np.dtype(dtype).name}, got {_dtype_name(x.dtype)}")
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


def _check_out(out, shape, dtype, what):
    """``out=`` of a download: refused before anything is read."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{what}(): out must be a numpy.ndarray, got {type(out).__name__}")
    if out.dtype != dtype:
        raise TypeError(f"{what}(): out must have dtype {np.dtype(dtype).name}, got {_dtype_name(out.dtype)}")
    if out.shape != tuple(shape):
        raise ValueError(f"{what}(): out has shape {out.shape}, expected {tuple(shape)}")
    if not out.flags.c_contiguous:
        raise ValueError(f"{what}(): out must be C-contiguous (got a strided or Fortran-ordered array)")
    if not out.flags.writeable:
        raise ValueError(f"{what}(): out is read-only")


HOST_POOL_MIN_BYTES = _core.HOST_POOL_MIN_BYTES


def _host_array(shape, dtype):
    """A new array for a download: pooled host memory from ``HOST_POOL_MIN_BYTES`` on (already
    faulted in when the pool reuses a block), else ``np.empty`` (malloc's heap reuses small blocks)."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < HOST_POOL_MIN_BYTES:
        return np.empty(shape, dtype)
    return np.frombuffer(_core._HostBlock(nbytes), dtype).reshape(shape)


def _dtype_name(dtype):
    """A dtype's name, with its byte order when that is what differs (``>f4`` is also "float32")."""
    return dtype.name if dtype.isnative or dtype.itemsize == 1 else f"{dtype.name} ({dtype.str}, non-native byte order)"


def _contiguous_strides(shape):
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= d
    out.reverse()
    return out


def _make_view(x, shape, strides, offset):
    """A tensor over x's memory with its own shape, element strides and offset
    (no copy, no autograd record: the view ops in functions.py attach that)."""
    v = Tensor.__new__(Tensor)
    v._store, v._offset = x._store, offset
    v.shape = shape = tuple(shape)
    v.dtype, v.device = x.dtype, x.device
    v._numel = math.prod(shape)
    contiguous = all(st == c for st, c, n in zip(strides, _contiguous_strides(shape), shape) if n != 1)
    v._strides = None if contiguous else tuple(strides)
    v._whole = contiguous and offset == 0 and v._numel * x.dtype.itemsize == x._store.nbytes
    v._base = x if x._base is None else x._base
    v._view_of = v._base._node
    v.requires_grad, v.grad, v._node, v._grad_home, v._retains_grad = False, None, None, None, False
    v._batch = x._batch
    return v


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


def _is_int_tuple(shape: object) -> TypeGuard[tuple[int, ...]]:
    """A tuple of plain ints: the common shape, checked without the
    numbers.Integral ABC machinery (every new tensor passes here)."""
    return type(shape) is tuple and all(type(s) is int for s in shape)


def _shape_arg(shape: ShapeLike, name: str = "shape") -> tuple[int, ...]:
    if _is_int_tuple(shape):
        return shape
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        return (int(shape),)
    given: Any = shape  # any iterable; its items are checked below
    try:
        dims = tuple(given)
    except TypeError:
        raise TypeError(f"{name} must be an int or a sequence of ints, got {type(shape).__name__}") from None
    for s in dims:
        if isinstance(s, bool) or not isinstance(s, numbers.Integral):
            raise TypeError(f"{name} must hold ints, got {s!r} in {dims}")
    return tuple(int(s) for s in dims)


_FLOAT32 = np.dtype(np.float32)


def _result(shape: tuple[int, ...], device: Device, dtype: np.dtype = _FLOAT32) -> Tensor:
    """A new tensor for an op's result (a dtype of _DTYPES), whose shape the op
    derived from checked inputs (``empty`` without the argument checks: ops run per call)."""
    numel = math.prod(shape)
    buf = _core._Buffer(device._dev, max(numel * dtype.itemsize, 4))
    return _core._new_tensor(Tensor, buf, shape, dtype, device, numel, device._current_batch_token())


def empty(
    shape: ShapeLike, dtype: DTypeLike = np.float32, device: Optional[Device] = None, requires_grad: bool = False
) -> Tensor:
    """Uninitialized device tensor (``shape`` may be ``()`` for a scalar)."""
    device = resolve_device(device)
    dims = _shape_arg(shape)
    dtype = np.dtype(dtype)
    if dtype not in _DTYPES:
        raise TypeError(f"dtype must be {_DTYPE_NAMES}, got {dtype.name}")
    if any(s <= 0 for s in dims):
        raise ValueError(f"shape must have all dimensions >= 1, got {dims}")
    if any(s > MAX_DIM for s in dims):
        raise ValueError(f"shape has a dimension above {MAX_DIM}: {dims}")
    nbytes = math.prod(dims) * dtype.itemsize
    return Tensor(_core._Buffer(device._dev, nbytes), dims, dtype, device, requires_grad)


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
    """Upload a NumPy array (float32, float16, or int32) to the device. A Tensor is
    returned as it is when it already lives on ``device`` (or no device is
    given); a Tensor of another device is refused: read it back first."""
    if isinstance(data, Tensor):
        if device is not None and resolve_device(device) is not data.device:
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
        raise TypeError(f"data must have dtype {_DTYPE_NAMES}, got {data.dtype.name}")
    if data.ndim == 0:  # a scalar: stored as one element, shaped ()
        t = tensor(data.reshape(1), device, requires_grad=requires_grad)
        t.shape = ()
        return t
    _check_array(data, "data", data.dtype)
    if requires_grad and data.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"only floating-point tensors (float32, float16) can require gradients, got {data.dtype.name}")
    t = empty(data.shape, data.dtype, device, requires_grad)
    t._buf.upload(data.reshape(-1).view(np.uint8))
    t._batch = None  # its contents come from the host, not from the batch
    return t


# A float32 operand: a device tensor, or a NumPy array uploaded to its device.
TensorLike = Union[Tensor, np.ndarray]
# Element-wise operands also take Python and NumPy scalars.
Operand = Union[Tensor, np.ndarray, float, np.floating, np.integer]
# Integer class labels or token ids: an int32 tensor or an integer array (or list).
Labels = Union[Tensor, np.ndarray, Sequence[int]]


def _one(device: Device) -> Tensor:
    """A device constant 1.0 (uploaded once per device, never written: the
    seed gradient of scalar losses, without a fill dispatch per step)."""
    cache = device._cache
    if cache.one is None:
        cache.one = tensor(np.ones(1, np.float32), device)
    return cache.one
