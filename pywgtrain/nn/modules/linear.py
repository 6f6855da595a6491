"""Linear layers."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ... import functions as F
from ...device import Device, resolve_device
from ...tensor import Tensor, TensorLike
from ..parameter import Parameter
from .module import Module


class Linear(Module):
    """``y = x @ W.T + b`` (``torch.nn.Linear``), W: [out, in], initialized like
    torch (Kaiming-uniform weights, uniform(-1/sqrt(in), 1/sqrt(in)) bias) from
    ``seed`` or ``rng``. ``activation`` ('relu', 'gelu', 'gelu_tanh', 'silu')
    fuses an activation into the same GEMM, as a following activation module
    in a ``Sequential`` does."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device: Optional[Device] = None,
        seed: Optional[int] = None,
        rng: Optional[np.random.Generator] = None,
        activation: Optional[str] = None,
    ) -> None:
        super().__init__()
        for name, v in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"Linear: {name} must be an int >= 1, got {v!r}")
        if activation not in F.ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(k for k in F.ACTIVATIONS if k)}, got {activation!r}")
        self.in_features, self.out_features = in_features, out_features
        self.activation = activation
        dev = resolve_device(device)
        rng = rng if rng is not None else np.random.default_rng(seed)
        bound = 1.0 / math.sqrt(in_features)  # kaiming_uniform_(a=sqrt(5)) reduces to this bound
        self.weight = Parameter(rng.uniform(-bound, bound, (out_features, in_features)), dev)
        if bias:
            self.bias = Parameter(rng.uniform(-bound, bound, (out_features,)), dev)
        else:
            self.register_parameter("bias", None)

    def forward(self, x: TensorLike, activation: Optional[str] = None, residual: Optional[TensorLike] = None) -> Tensor:
        """``residual``: added to the output in the GEMM's epilogue (no activation)."""
        return F.linear(x, self.weight, self.bias, activation or self.activation, residual)

    def extra_repr(self) -> str:
        act = f", activation={self.activation!r}" if self.activation else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}{act}"
