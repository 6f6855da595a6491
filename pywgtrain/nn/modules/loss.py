"""Loss modules (``torch.nn`` names); each returns a 0-d tensor to call ``backward()`` on."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ... import functions as F
from ...ops import host_batch, label_array
from ...tensor import Labels, Tensor, TensorLike
from .module import Module


class _Loss(Module):
    """The base of the loss modules (torch's ``_Loss``): ``reduction``, and ``check_target``."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        F._check_reduction(reduction, type(self).__name__)
        self.reduction = reduction

    def check_target(
        self, target: Any, input_shape: Optional[tuple[int, ...]] = None, name: str = "target"
    ) -> np.ndarray:
        """A host ``target`` as the contiguous array this loss takes, checked as its forward
        checks it against an input of ``input_shape`` (None: not known yet, the checks that
        need it are left out), so that a caller (``Trainer``) can refuse a bad batch before
        any work is recorded. ``name`` names the target in the errors. By default: float32
        values or integer ids, nothing cast silently."""
        return host_batch(target, name)


class CrossEntropyLoss(_Loss):
    """Softmax cross-entropy over [batch, classes] logits and int class labels
    (``F.cross_entropy``: class weights, ignore_index, label smoothing)."""

    def __init__(
        self,
        weight: Optional[TensorLike] = None,
        *,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__(reduction)
        self.weight = weight
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing

    def forward(self, input: TensorLike, target: Labels) -> Tensor:  # noqa: A002 - torch's names
        return F.cross_entropy(
            input,
            target,
            self.weight,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            label_smoothing=self.label_smoothing,
        )

    def check_target(
        self, target: Any, input_shape: Optional[tuple[int, ...]] = None, name: str = "target"
    ) -> np.ndarray:
        """Integer class labels in ``[0, classes)`` (the input's last dimension) or equal to
        ``ignore_index``: device labels out of range are not checked (that would take a GPU
        round trip) and would turn the loss into NaN."""
        classes = input_shape[-1] if input_shape is not None and len(input_shape) == 2 else None
        return label_array(target, classes, self.ignore_index)


class NLLLoss(CrossEntropyLoss):
    def __init__(
        self, weight: Optional[TensorLike] = None, *, ignore_index: int = -100, reduction: str = "mean"
    ) -> None:
        super().__init__(weight, ignore_index=ignore_index, reduction=reduction)

    def forward(self, input: TensorLike, target: Labels) -> Tensor:  # noqa: A002 - torch's names
        return F.nll_loss(input, target, self.weight, ignore_index=self.ignore_index, reduction=self.reduction)


class MSELoss(_Loss):
    def forward(self, input: TensorLike, target: TensorLike) -> Tensor:  # noqa: A002 - torch's names
        return F.mse_loss(input, target, self.reduction)


class L1Loss(_Loss):
    def forward(self, input: TensorLike, target: TensorLike) -> Tensor:  # noqa: A002 - torch's names
        return F.l1_loss(input, target, self.reduction)


class SmoothL1Loss(_Loss):
    def __init__(self, reduction: str = "mean", beta: float = 1.0) -> None:
        super().__init__(reduction)
        self.beta = beta

    def forward(self, input: TensorLike, target: TensorLike) -> Tensor:  # noqa: A002 - torch's names
        return F.smooth_l1_loss(input, target, self.reduction, self.beta)


class HuberLoss(_Loss):
    def __init__(self, reduction: str = "mean", delta: float = 1.0) -> None:
        super().__init__(reduction)
        self.delta = delta

    def forward(self, input: TensorLike, target: TensorLike) -> Tensor:  # noqa: A002 - torch's names
        return F.huber_loss(input, target, self.reduction, self.delta)


class BCEWithLogitsLoss(_Loss):
    """Sigmoid and binary cross-entropy in one stable form; ``weight`` (broadcast to the
    input) and ``pos_weight`` (along its last dimension) are tensors or arrays, as torch's."""

    def __init__(
        self, weight: Optional[TensorLike] = None, reduction: str = "mean", pos_weight: Optional[TensorLike] = None
    ) -> None:
        super().__init__(reduction)
        self.weight, self.pos_weight = weight, pos_weight

    def forward(self, input: TensorLike, target: TensorLike) -> Tensor:  # noqa: A002 - torch's names
        return F.binary_cross_entropy_with_logits(input, target, self.weight, self.reduction, self.pos_weight)
