"""Type aliases for the public API's annotations (no runtime behaviour)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence, Union

import numpy as np

if TYPE_CHECKING:
    from .tensor import Tensor

# A float32 operand: a device tensor, or a NumPy array uploaded to its device.
TensorLike = Union["Tensor", np.ndarray]
# Element-wise operands also take Python and NumPy scalars.
Operand = Union["Tensor", np.ndarray, float, np.floating, np.integer]
# A shape: one int or a sequence of ints.
ShapeLike = Union[int, Sequence[int]]
# A reduction's dimensions: None (all), one dimension or several.
Dims = Union[int, Sequence[int], None]
# Integer class labels or token ids: an int32 tensor or an integer array (or list).
Labels = Union["Tensor", np.ndarray, Sequence[int]]
# dtypes the tensors hold (float32, int32), in any form np.dtype() accepts.
DTypeLike = Union[np.dtype, type, str]
