"""Optimizers with PyTorch's semantics, updating parameters on the GPU."""

from . import lr_scheduler  # noqa: F401
from .adamw import Adam, AdamW  # noqa: F401
from .optimizer import Optimizer  # noqa: F401
from .sgd import SGD  # noqa: F401

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "lr_scheduler"]
