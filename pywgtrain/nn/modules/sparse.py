"""Embedding tables."""

from __future__ import annotations

from typing import Optional

import numpy as np

from ... import functions as F
from ...device import Device, resolve_device
from ...tensor import Labels, Tensor
from ..parameter import Parameter
from .module import Module


class Embedding(Module):
    """Rows of ``weight`` [num_embeddings, embedding_dim] picked by integer ids
    (``torch.nn.Embedding``), initialized N(0, 1) like torch from ``seed`` or ``rng``.
    The backward sums rows per id deterministically on the GPU. ``padding_idx``: that row
    starts at zeros and gets no gradient from the lookup, as torch's."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: Optional[int] = None,
        device: Optional[Device] = None,
        seed: Optional[int] = None,
        rng: Optional[np.random.Generator] = None,
    ) -> None:
        super().__init__()
        for name, v in (("num_embeddings", num_embeddings), ("embedding_dim", embedding_dim)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"Embedding: {name} must be an int >= 1, got {v!r}")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx = F._padding_index(padding_idx, num_embeddings, "Embedding")
        rng = rng if rng is not None else np.random.default_rng(seed)
        init = rng.standard_normal((num_embeddings, embedding_dim))
        if self.padding_idx is not None:
            init[self.padding_idx] = 0.0
        self.weight = Parameter(init, resolve_device(device))

    def forward(self, ids: Labels) -> Tensor:
        return F.embedding(ids, self.weight, self.padding_idx)

    def extra_repr(self) -> str:
        pad = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"
