"""Functional forms of the ops and losses, named as in ``torch.nn.functional``."""

from ..functions import (  # noqa: F401
    causal_self_attention_qkv,
    cross_entropy,
    dropout,
    embedding,
    gelu,
    layer_norm,
    linear,
    log_softmax,
    mse_loss,
    nll_loss,
    relu,
    scaled_dot_product_attention,
    sigmoid,
    silu,
    softmax,
    tanh,
)

__all__ = [
    "linear",
    "relu",
    "gelu",
    "silu",
    "sigmoid",
    "tanh",
    "softmax",
    "log_softmax",
    "embedding",
    "layer_norm",
    "dropout",
    "cross_entropy",
    "nll_loss",
    "mse_loss",
    "scaled_dot_product_attention",
    "causal_self_attention_qkv",
]
