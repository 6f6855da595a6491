"""Functional forms of the ops and losses, named as in ``torch.nn.functional``."""
from ..functions import (  # noqa: F401
    cross_entropy, dropout, embedding, gelu, layer_norm, linear, log_softmax, mse_loss, nll_loss, relu, sigmoid, silu,
    softmax, tanh,
)

__all__ = ["linear", "relu", "gelu", "silu", "sigmoid", "tanh", "softmax", "log_softmax", "embedding",
           "cross_entropy", "nll_loss", "mse_loss", "layer_norm", "dropout"]
