"""Type aliases for the public API's annotations (no runtime behaviour); those
naming Tensor (TensorLike, Operand, Labels) live beside it in tensor.py."""

from __future__ import annotations

from typing import Sequence, Union

import numpy as np

# A shape: one int or a sequence of ints.
ShapeLike = Union[int, Sequence[int]]
# A reduction's dimensions: None (all), one dimension or several.
Dims = Union[int, Sequence[int], None]
# dtypes the tensors hold (float32, int32), in any form np.dtype() accepts.
DTypeLike = Union[np.dtype, type, str]
