"""Optimizers with PyTorch's semantics, updating parameters on the GPU."""

from . import lr_scheduler  # noqa: F401
from .adamw import AdamW  # noqa: F401
from .optimizer import Optimizer  # noqa: F401

__all__ = ["Optimizer", "AdamW", "lr_scheduler"]
