"""Automatic mixed precision regions, as ``torch.autocast``.

Inside ``with pywgtrain.autocast():`` the ops of ``pywgtrain.functions`` pick
their compute dtype by the lists of torch's CUDA autocast: matrix products,
linear layers and attention run in float16 (their float32 operands cast with
recorded casts, so autograd sees them; a leaf's cast, such as a parameter's,
is made once per outermost region); layer_norm, softmax, log_softmax, the
losses, sum, exp, log, pow and rsqrt run in float32 (float16 operands cast
up); every other op runs in the widest dtype of its operands. The policy itself
lives with the ops (``functions._dtype_rules``); this module holds the
per-thread state and the context manager.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Optional, TypeVar, Union

import numpy as np

from .device import Device, resolve_device

_HALF = np.dtype(np.float16)
FEATURE = "shader-f16"  # the WebGPU feature float16 kernels need

F = TypeVar("F", bound=Callable[..., Any])


class _State(threading.local):
    """This thread's autocast: the region's dtype (None outside or with enabled=False), the
    number of enabled regions open, and the casts of leaves made in the outermost one."""

    def __init__(self) -> None:
        self.dtype: Optional[np.dtype] = None
        self.depth = 0
        self.cache_enabled = True
        self.cache: dict[int, tuple[Any, int, bool, Any]] = {}


_state: _State = _State()


def is_autocast_enabled() -> bool:
    """Whether this thread is inside an enabled autocast region (``torch.is_autocast_enabled``)."""
    return _state.dtype is not None


def _dtype_arg(dtype: Any) -> np.dtype:
    try:
        want = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"autocast: dtype must be 'float16' or np.float16, got {dtype!r}") from None
    if want != _HALF:
        raise ValueError(f"autocast: only dtype float16 is supported, got {want.name}")
    return want


class autocast:
    """``with autocast():`` / ``@autocast()``: run the ops inside in mixed precision
    (torch.autocast). ``device_type``: a Device, ``"webgpu"`` or None (the default
    device); its adapter must offer the ``shader-f16`` feature, checked on entry.
    ``enabled=False`` turns autocast off inside an enclosing region. State is per thread."""

    def __init__(
        self,
        device_type: Union[str, Device, None] = None,
        dtype: Any = "float16",
        enabled: bool = True,
        cache_enabled: bool = True,
    ) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"autocast: enabled must be a bool, got {type(enabled).__name__}")
        if isinstance(device_type, str):
            if device_type != "webgpu":
                raise ValueError(f"autocast: device_type must be 'webgpu', a Device or None, got {device_type!r}")
            device_type = None
        self._device = device_type
        self._dtype = _dtype_arg(dtype)
        self._enabled = enabled
        self._cache_enabled = bool(cache_enabled)
        self._saved: list[tuple[Optional[np.dtype], bool]] = []

    def __enter__(self) -> autocast:
        if self._enabled:
            dev = resolve_device(self._device)
            if FEATURE not in dev.features:
                raise RuntimeError(
                    f"autocast: float16 needs the adapter feature '{FEATURE}', which {dev!r} does not offer; "
                    "run without autocast (float32)"
                )
        s = _state
        self._saved.append((s.dtype, s.cache_enabled))
        if self._enabled:
            s.dtype, s.cache_enabled = self._dtype, self._cache_enabled
            s.depth += 1
        else:
            s.dtype = None
        return self

    def __exit__(self, *exc: Any) -> None:
        s = _state
        s.dtype, s.cache_enabled = self._saved.pop()
        if self._enabled:
            s.depth -= 1
            if s.depth == 0:  # as torch: the cast cache lives as long as the outermost region
                s.cache.clear()

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with autocast(self._device, self._dtype, self._enabled, self._cache_enabled):
                return fn(*args, **kwargs)

        return wrapped  # type: ignore[return-value]
