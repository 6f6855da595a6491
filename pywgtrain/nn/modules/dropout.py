"""Dropout layers."""

from __future__ import annotations

import numbers

from ... import functions as F
from ...tensor import Tensor, TensorLike
from .module import Module


class Dropout(Module):
    """Zeroes each element with probability ``p`` while training and scales
    the rest by ``1 / (1 - p)`` (``torch.nn.Dropout``); the identity after
    ``.eval()``. Masks come from the device's GPU random state
    (``pywgtrain.random``; ``pywgtrain.manual_seed`` seeds it)."""

    p: float
    inplace: bool

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, numbers.Real):
            raise TypeError(f"Dropout: p must be a real number, got {p!r}")
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        if inplace:
            raise ValueError("Dropout: inplace=True is not supported")
        self.p = float(p)
        self.inplace = False

    def forward(self, x: TensorLike) -> Tensor:
        return F.dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"
