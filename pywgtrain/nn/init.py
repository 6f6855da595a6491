"""Parameter initialization as ``torch.nn.init``: the same names, arguments, fans and gains.
Values are drawn on the host from ``pywgtrain.random.host_generator`` (seeded from the
device's RNG state, so ``manual_seed`` makes them reproducible) or from ``generator`` (a
``numpy.random.Generator``), then copied into the tensor in place (no gradient recorded)."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ..autograd import no_grad
from ..random import host_generator
from ..tensor import Tensor

_LINEAR = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")


def calculate_gain(nonlinearity: str, param: Optional[float] = None) -> float:
    """The recommended gain for ``nonlinearity`` (torch's table)."""
    if nonlinearity in _LINEAR or nonlinearity == "sigmoid":
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif isinstance(param, bool) or not isinstance(param, (int, float)):
            raise ValueError(f"negative_slope {param} not a valid number")
        else:
            slope = float(param)
        return math.sqrt(2.0 / (1 + slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def _calculate_fan_in_and_fan_out(tensor: Tensor) -> tuple[int, int]:
    if tensor.ndim < 2:
        raise ValueError("Fan in and fan out can not be computed for tensor with fewer than 2 dimensions")
    receptive = math.prod(tensor.shape[2:])
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def _fan(tensor: Tensor, mode: str) -> int:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"Mode {mode} not supported, please use one of fan_in, fan_out")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def _write(tensor: Tensor, values: np.ndarray) -> Tensor:
    if not isinstance(tensor, Tensor):
        raise TypeError(f"init: tensor must be a pywgtrain.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in (np.float32, np.float16):
        raise TypeError(f"init: tensor must be float32 or float16, got {tensor.dtype}")
    with no_grad():
        tensor.copy_(np.asarray(values, dtype=np.float64).astype(tensor.dtype).reshape(tensor.shape))
    return tensor


def _rng(tensor: Tensor, generator: Optional[np.random.Generator]) -> np.random.Generator:
    return generator if generator is not None else host_generator(tensor.device)


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0, generator: Optional[np.random.Generator] = None) -> Tensor:
    return _write(tensor, _rng(tensor, generator).uniform(a, b, tensor.shape))


def normal_(
    tensor: Tensor, mean: float = 0.0, std: float = 1.0, generator: Optional[np.random.Generator] = None
) -> Tensor:
    return _write(tensor, _rng(tensor, generator).normal(mean, std, tensor.shape))


def trunc_normal_(
    tensor: Tensor,
    mean: float = 0.0,
    std: float = 1.0,
    a: float = -2.0,
    b: float = 2.0,
    generator: Optional[np.random.Generator] = None,
) -> Tensor:
    """Normal(mean, std) values restricted to [a, b] (absolute bounds, as torch's), by
    redrawing those outside."""
    if not a < b:
        raise ValueError(f"trunc_normal_: a ({a}) must be less than b ({b})")
    rng = _rng(tensor, generator)
    values = rng.normal(mean, std, tensor.numel())
    for _ in range(1000):
        bad = (values < a) | (values > b)
        if not bad.any():
            break
        values[bad] = rng.normal(mean, std, int(bad.sum()))
    return _write(tensor, np.clip(values, a, b))


def constant_(tensor: Tensor, val: float) -> Tensor:
    return _write(tensor, np.full(tensor.shape, float(val)))


def ones_(tensor: Tensor) -> Tensor:
    return constant_(tensor, 1.0)


def zeros_(tensor: Tensor) -> Tensor:
    return constant_(tensor, 0.0)


def eye_(tensor: Tensor) -> Tensor:
    if tensor.ndim != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    return _write(tensor, np.eye(tensor.shape[0], tensor.shape[1]))


def xavier_uniform_(tensor: Tensor, gain: float = 1.0, generator: Optional[np.random.Generator] = None) -> Tensor:
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(tensor, -bound, bound, generator)


def xavier_normal_(tensor: Tensor, gain: float = 1.0, generator: Optional[np.random.Generator] = None) -> Tensor:
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)), generator)


def kaiming_uniform_(
    tensor: Tensor,
    a: float = 0.0,
    mode: str = "fan_in",
    nonlinearity: str = "leaky_relu",
    generator: Optional[np.random.Generator] = None,
) -> Tensor:
    bound = math.sqrt(3.0) * calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode))
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(
    tensor: Tensor,
    a: float = 0.0,
    mode: str = "fan_in",
    nonlinearity: str = "leaky_relu",
    generator: Optional[np.random.Generator] = None,
) -> Tensor:
    return normal_(tensor, 0.0, calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode)), generator)
