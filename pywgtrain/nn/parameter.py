"""Trainable tensors."""

from __future__ import annotations

from typing import Optional, Union

import numpy as np

from ..device import Device
from ..tensor import Tensor, tensor


class Parameter(Tensor):
    """A float32 leaf tensor with ``requires_grad=True`` that modules register
    when assigned as an attribute (``torch.nn.Parameter``)."""

    __slots__ = ()

    def __init__(
        self, data: Union[Tensor, np.ndarray], device: Optional[Device] = None, requires_grad: bool = True
    ) -> None:
        if isinstance(data, Tensor):
            if device is not None and device is not data.device:
                raise ValueError(f"Parameter: data lives on {data.device!r}, not on {device!r}")
            t = data
        else:
            t = tensor(np.ascontiguousarray(data, dtype=np.float32), device)
        if t.dtype != np.float32:
            raise TypeError(f"Parameter must be float32, got {t.dtype.name}")
        super().__init__(t._buf, t.shape, t.dtype, t.device, requires_grad)
        if t._whole:
            self._store = t._store  # shares memory and version counter with data, as torch.nn.Parameter does

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()
