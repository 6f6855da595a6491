"""pywgtrain: train models on any GPU from Python through WebGPU (wgpu-native).

NumPy arrays go in and come out; the work runs in WGSL compute kernels.
"""
import os as _os
import tempfile as _tempfile

# Mesa's Vulkan drivers complain on stderr when this is unset (headless boxes, CI).
_os.environ.setdefault("XDG_RUNTIME_DIR", _tempfile.gettempdir())

from ._core import DeviceLostError, GpuError, OutOfMemoryError, ValidationError  # noqa: E402
from .device import Device, default_device, list_adapters  # noqa: E402
from .tensor import Tensor, tensor, zeros, empty  # noqa: E402
from .ops import (  # noqa: E402
    gemm, matmul, linear, adamw_step, clip_grad_norm_, cross_entropy, mse_loss,
)
from . import nn, optim  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "Device", "default_device", "list_adapters", "Tensor", "tensor", "zeros", "empty",
    "gemm", "matmul", "linear", "adamw_step", "clip_grad_norm_", "cross_entropy", "mse_loss",
    "nn", "optim", "GpuError", "ValidationError", "OutOfMemoryError", "DeviceLostError",
]
