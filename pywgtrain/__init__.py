"""pywgtrain: train models on any GPU from Python through WebGPU (wgpu-native).

NumPy arrays go in and come out; the work runs in WGSL compute kernels.
Tensors record their ops for reverse-mode autograd (``loss.backward()``).
"""
from ._core import DeviceLostError, GpuError, OutOfMemoryError, ValidationError
from .device import Device, default_device, list_adapters
from .tensor import Tensor, tensor, zeros, ones, full, empty
from .autograd import no_grad, enable_grad, set_grad_enabled, is_grad_enabled
from .ops import gemm, adamw_step, clip_grad_norm_
from .functions import (
    abs, add, bmm, cat, chunk, clamp, div, exp, gelu, linear, log, log_softmax, matmul, max, maximum, mean,
    minimum, mul, neg, pow, relu, rsqrt, sigmoid, silu, softmax, split, sqrt, square, stack, std, sub, sum, tanh,
    transpose, permute, reshape, var, where, cross_entropy, mse_loss, embedding, layer_norm, dropout,
)
from . import random
from .random import manual_seed, get_rng_state, set_rng_state, initial_seed
from . import nn, optim

__version__ = "0.1.0"

__all__ = [
    "Device", "default_device", "list_adapters", "Tensor", "tensor", "zeros", "ones", "full", "empty",
    "no_grad", "enable_grad", "set_grad_enabled", "is_grad_enabled",
    "gemm", "matmul", "bmm", "linear", "adamw_step", "clip_grad_norm_", "cross_entropy", "mse_loss", "embedding",
    "abs", "add", "cat", "chunk", "clamp", "div", "exp", "gelu", "log", "log_softmax", "max", "maximum", "mean",
    "minimum", "mul", "neg", "pow", "relu", "rsqrt", "sigmoid", "silu", "softmax", "split", "sqrt", "square", "stack",
    "std", "sub", "sum", "tanh", "transpose", "permute", "reshape", "var", "where",
    "layer_norm", "dropout", "random", "manual_seed", "get_rng_state", "set_rng_state", "initial_seed",
    "nn", "optim", "GpuError", "ValidationError", "OutOfMemoryError", "DeviceLostError",
]
