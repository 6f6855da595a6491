"""Neural-network modules whose parameters live on the GPU (``torch.nn``'s shape).

Any model built from pywgtrain ops trains: ``forward`` records the graph,
``loss.backward()`` runs it backwards as recorded GPU work (autograd.py).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..device import Device, resolve_device
from . import functional  # noqa: F401
from . import init  # noqa: F401
from . import utils  # noqa: F401
from . import modules as _modules
from .modules import (  # noqa: F401
    GELU,
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    Dropout,
    Embedding,
    Flatten,
    HuberLoss,
    Identity,
    L1Loss,
    LayerNorm,
    LeakyReLU,
    Linear,
    LogSoftmax,
    Module,
    ModuleDict,
    ModuleList,
    MSELoss,
    MultiheadAttention,
    NLLLoss,
    ReLU,
    RMSNorm,
    Sequential,
    Sigmoid,
    SiLU,
    SmoothL1Loss,
    Softmax,
    Softplus,
    Tanh,
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
    Unflatten,
)
from .parameter import Parameter  # noqa: F401
from . import parallel  # noqa: F401  (torch is imported only when DistributedDataParallel is created)


def MLP(
    sizes: Sequence[int], activation: Optional[str] = "relu", device: Optional[Device] = None, seed: Optional[int] = 0
) -> Sequential:
    """``sizes = [in, hidden..., out]``: Linear layers with ``activation`` fused
    into each but the last, seeded for reproducible initialization. Parameter
    names "0.weight", "1.weight", ... (the checkpoints written so far)."""
    sizes = [int(s) for s in sizes]
    if len(sizes) < 2:
        raise ValueError(f"MLP needs at least [in, out] sizes, got {sizes}")
    rng = np.random.default_rng(seed)
    dev = resolve_device(device)
    layers = [
        Linear(a, b, activation=activation if i < len(sizes) - 2 else None, device=dev, rng=rng)
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]))
    ]
    return Sequential(*layers)


__all__ = [*_modules.__all__, "Parameter", "MLP", "functional", "parallel"]
