"""Loss modules (``torch.nn`` names); each returns a 0-d tensor to call ``backward()`` on."""

from __future__ import annotations

from ... import functions as F
from ...tensor import Labels, Tensor, TensorLike
from .module import Module


class CrossEntropyLoss(Module):
    """Softmax cross-entropy over [batch, classes] logits and int class labels."""

    def __init__(self, ignore_index: int = -100, reduction: str = "mean") -> None:
        super().__init__()
        F._check_reduction(reduction, "CrossEntropyLoss")
        self.ignore_index, self.reduction = ignore_index, reduction

    def forward(self, input: TensorLike, target: Labels) -> Tensor:  # noqa: A002 - torch's names
        return F.cross_entropy(input, target, self.ignore_index, self.reduction)


class NLLLoss(CrossEntropyLoss):
    def forward(self, input: TensorLike, target: Labels) -> Tensor:  # noqa: A002 - torch's names
        return F.nll_loss(input, target, self.ignore_index, self.reduction)


class MSELoss(Module):
    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        F._check_reduction(reduction, "MSELoss")
        self.reduction = reduction

    def forward(self, input: TensorLike, target: TensorLike) -> Tensor:  # noqa: A002 - torch's names
        return F.mse_loss(input, target, self.reduction)
