"""``torch.nn.utils``'s gradient clipping under its names."""

from __future__ import annotations

import math
from typing import Iterable, Union

from ..autograd import no_grad
from ..ops import _grad_list, clip_grad_norm_
from ..tensor import Tensor

__all__ = ["clip_grad_norm_", "clip_grad_value_"]


def clip_grad_value_(parameters: Union[Tensor, Iterable[Tensor]], clip_value: float) -> None:
    """Clamp every gradient to [-clip_value, clip_value] in place (``torch.nn.utils.clip_grad_value_``);
    NaN stays NaN. ``parameters``: tensors that require grad (their ``.grad``) or gradients."""
    v = float(clip_value)
    if not (math.isfinite(v) and v >= 0):
        raise ValueError(f"clip_grad_value_: clip_value must be finite and >= 0, got {clip_value}")
    with no_grad():
        for g in _grad_list(parameters):
            if not isinstance(g, Tensor):
                raise TypeError(f"clip_grad_value_: gradients must be pywgtrain Tensors, got {type(g).__name__}")
            g.copy_(g.clamp(-v, v))
