"""Activation modules. After a Linear inside a Sequential they run in the
Linear's fused GEMM epilogue."""

from __future__ import annotations

from typing import Optional

from ... import functions as F
from ...tensor import Tensor, TensorLike
from .module import Module


class _Activation(Module):
    fused: Optional[str] = None  # the Linear epilogue's name for it (ops.ACTIVATIONS), None if not fusable


class Identity(_Activation):
    def forward(self, x: TensorLike) -> TensorLike:
        return x


class ReLU(_Activation):
    fused = "relu"

    def forward(self, x: TensorLike) -> Tensor:
        return F.relu(x)


class SiLU(_Activation):
    fused = "silu"

    def forward(self, x: TensorLike) -> Tensor:
        return F.silu(x)


class GELU(_Activation):
    """``approximate='none'`` (erf, torch's default) or ``'tanh'``."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate
        self.fused = "gelu" if approximate == "none" else "gelu_tanh"

    def forward(self, x: TensorLike) -> Tensor:
        return F.gelu(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class Tanh(_Activation):
    def forward(self, x: TensorLike) -> Tensor:
        return F.tanh(x)


class Sigmoid(_Activation):
    def forward(self, x: TensorLike) -> Tensor:
        return F.sigmoid(x)


class LeakyReLU(_Activation):
    def __init__(self, negative_slope: float = 0.01) -> None:
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x: TensorLike) -> Tensor:
        return F.leaky_relu(x, self.negative_slope)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}"


class Softplus(_Activation):
    """``log(1 + exp(beta x)) / beta``, linear past ``beta x > threshold`` (torch's)."""

    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, x: TensorLike) -> Tensor:
        return F.softplus(x, self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


class Softmax(Module):
    def __init__(self, dim: Optional[int] = None) -> None:  # None: torch's implicit (deprecated) choice
        super().__init__()
        self.dim = dim

    def forward(self, x: TensorLike) -> Tensor:
        return F.softmax(x, self.dim)


class LogSoftmax(Softmax):
    def forward(self, x: TensorLike) -> Tensor:
        return F.log_softmax(x, self.dim)
