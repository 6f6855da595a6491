"""Normalization layers."""

from __future__ import annotations

import numbers
from typing import Optional

import numpy as np

from ... import functions as F
from ..._typing import ShapeLike
from ...device import Device, resolve_device
from ...tensor import Tensor, TensorLike, _shape_arg
from ..parameter import Parameter
from .module import Module


class LayerNorm(Module):
    """Layer normalization over the last dimension (``torch.nn.LayerNorm`` with
    ``normalized_shape`` one int, or a one-element sequence). ``weight`` starts
    at ones and ``bias`` at zeros, as in torch; ``elementwise_affine=False``
    has neither, ``bias=False`` no bias."""

    normalized_shape: tuple[int, ...]
    eps: float
    elementwise_affine: bool
    weight: Optional[Parameter]
    bias: Optional[Parameter]

    def __init__(
        self,
        normalized_shape: ShapeLike,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device: Optional[Device] = None,
    ) -> None:
        super().__init__()
        ns = _shape_arg(normalized_shape, "LayerNorm: normalized_shape")
        if len(ns) != 1 or ns[0] < 1:
            raise ValueError(
                f"LayerNorm: normalized_shape must be one int >= 1 (normalization over the last "
                f"dimension), got {normalized_shape!r}"
            )
        if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not eps >= 0:
            raise ValueError(f"LayerNorm: eps must be a number >= 0, got {eps!r}")
        self.normalized_shape = ns
        self.eps = float(eps)
        self.elementwise_affine = bool(elementwise_affine)
        dev = resolve_device(device)
        self.device = dev
        if self.elementwise_affine:
            self.weight = Parameter(np.ones(ns, np.float32), dev)
            if bias:
                self.bias = Parameter(np.zeros(ns, np.float32), dev)
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, x: TensorLike) -> Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class RMSNorm(Module):
    """Root-mean-square normalization over the trailing ``normalized_shape`` dimensions
    (``torch.nn.RMSNorm``): ``weight`` starts at ones; ``elementwise_affine=False`` has
    none; ``eps`` None is float32's machine epsilon, as torch's."""

    normalized_shape: tuple[int, ...]
    eps: Optional[float]
    elementwise_affine: bool
    weight: Optional[Parameter]

    def __init__(
        self,
        normalized_shape: ShapeLike,
        eps: Optional[float] = None,
        elementwise_affine: bool = True,
        device: Optional[Device] = None,
    ) -> None:
        super().__init__()
        ns = _shape_arg(normalized_shape, "RMSNorm: normalized_shape")
        if len(ns) == 0 or min(ns) < 1:
            raise ValueError(f"RMSNorm: normalized_shape must be ints >= 1, got {normalized_shape!r}")
        if eps is not None and (isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not eps >= 0):
            raise ValueError(f"RMSNorm: eps must be a number >= 0 or None, got {eps!r}")
        self.normalized_shape = ns
        self.eps = None if eps is None else float(eps)
        self.elementwise_affine = bool(elementwise_affine)
        dev = resolve_device(device)
        self.device = dev
        if self.elementwise_affine:
            self.weight = Parameter(np.ones(ns, np.float32), dev)
        else:
            self.register_parameter("weight", None)

    def forward(self, x: TensorLike) -> Tensor:
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
