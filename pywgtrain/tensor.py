"""Device tensors: a GPU buffer with a shape and a dtype."""
import math

import numpy as np

from . import _core
from .device import Device, default_device

_DTYPES = (np.dtype(np.float32), np.dtype(np.int32))
MAX_DIM = 2**31 - 1  # kernels index with 32-bit integers


class Tensor:
    """A C-contiguous array in GPU memory (float32, or int32 for labels).

    Create with :func:`tensor` / :func:`zeros`; read back with ``.numpy()``.
    """

    __slots__ = ("_buf", "shape", "dtype", "device", "size", "_grad_fn", "__weakref__")

    def __init__(self, buf, shape, dtype, device):
        self._buf = buf
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.device = device
        self.size = math.prod(self.shape)
        self._grad_fn = None  # set by Sequential.forward in training mode

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def nbytes(self):
        return self.size * self.dtype.itemsize

    def numpy(self):
        """Copy to a new NumPy array (waits for the GPU; the GIL is released)."""
        out = np.empty(self.shape, self.dtype)
        self.device.flush()
        self._buf.download(out.reshape(-1).view(np.uint8))
        return out

    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def copy_(self, src):
        """Overwrite with ``src`` (array or Tensor) of the same shape and dtype."""
        if isinstance(src, Tensor):
            _check_same(self, src, "src")
            with self.device._recording() as rec:
                rec.copy(src._buf, 0, self._buf, 0, self.nbytes)
        else:
            arr = _check_array(src, "src", dtype=self.dtype)
            if arr.shape != self.shape:
                raise ValueError(f"src has shape {arr.shape}, expected {self.shape}")
            self.device.flush()  # keep order with work recorded earlier in a batch
            self._buf.upload(arr.reshape(-1).view(np.uint8))
        return self

    def zero_(self):
        with self.device._recording() as rec:
            rec.fill_zero(self._buf, 0, (self.nbytes + 3) // 4 * 4)
        return self

    def clone(self):
        out = empty(self.shape, self.dtype, self.device)
        return out.copy_(self)

    def reshape(self, *shape):
        """A view with a new shape over the same buffer (no copy)."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = list(shape)
        if shape.count(-1) == 1:
            known = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
            shape[shape.index(-1)] = self.size // known if known else 0
        if int(np.prod(shape, dtype=np.int64)) != self.size:
            raise ValueError(f"cannot reshape a tensor of shape {self.shape} into {tuple(shape)}")
        return Tensor(self._buf, shape, self.dtype, self.device)

    def __repr__(self):
        return f"Tensor(shape={self.shape}, dtype={self.dtype.name}, device={self.device.name!r})"

    def __matmul__(self, other):
        from .ops import matmul
        return matmul(self, other)


def _check_array(x, name, dtype=np.float32):
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray or pywgtrain.Tensor, got {type(x).__name__}")
    if x.dtype != np.dtype(dtype):
        raise TypeError(f"{name} must have dtype {np.dtype(dtype).name}, got {x.dtype.name}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (got a strided or Fortran-ordered array); use np.ascontiguousarray")
    if x.ndim == 0:
        raise ValueError(f"{name} must have at least one dimension, got a 0-d array")
    if x.size == 0:
        raise ValueError(f"{name} is empty (shape {x.shape}); zero-size arrays are not supported")
    if any(s > MAX_DIM for s in x.shape):
        raise ValueError(f"{name} has a dimension above {MAX_DIM} (shape {x.shape})")
    return x


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


def empty(shape, dtype=np.float32, device=None):
    """Uninitialized device tensor."""
    device = _resolve_device(device)
    shape = (shape,) if np.isscalar(shape) else tuple(shape)
    dtype = np.dtype(dtype)
    if dtype not in _DTYPES:
        raise TypeError(f"dtype must be float32 or int32, got {dtype.name}")
    if len(shape) == 0 or any(int(s) <= 0 for s in shape):
        raise ValueError(f"shape must have at least one dimension, all >= 1, got {shape}")
    if any(int(s) > MAX_DIM for s in shape):
        raise ValueError(f"shape has a dimension above {MAX_DIM}: {shape}")
    nbytes = math.prod(int(s) for s in shape) * dtype.itemsize
    return Tensor(_core._Buffer(device._dev, nbytes), shape, dtype, device)


def zeros(shape, dtype=np.float32, device=None):
    """Device tensor filled with zeros."""
    return empty(shape, dtype, device).zero_()


def tensor(data, device=None, dtype=None):
    """Upload a NumPy array (float32, or int32) to the device."""
    if isinstance(data, Tensor):
        return data
    if dtype is not None:
        data = np.ascontiguousarray(data, dtype=dtype)
    if not isinstance(data, np.ndarray):
        raise TypeError(f"data must be a numpy.ndarray, got {type(data).__name__}")
    if data.dtype not in _DTYPES:
        raise TypeError(f"data must have dtype float32 or int32, got {data.dtype.name}")
    _check_array(data, "data", data.dtype)
    t = empty(data.shape, data.dtype, device)
    t._buf.upload(data.reshape(-1).view(np.uint8))
    return t
