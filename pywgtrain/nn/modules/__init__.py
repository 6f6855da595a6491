from .activation import GELU, Identity, LeakyReLU, LogSoftmax, ReLU, Sigmoid, SiLU, Softmax, Softplus, Tanh
from .container import Flatten, ModuleDict, ModuleList, Sequential, Unflatten
from .dropout import Dropout
from .linear import Linear
from .loss import BCEWithLogitsLoss, CrossEntropyLoss, HuberLoss, L1Loss, MSELoss, NLLLoss, SmoothL1Loss
from .module import Module
from .sparse import Embedding
from .normalization import LayerNorm, RMSNorm
from .transformer import (
    MultiheadAttention,
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)

__all__ = [
    "Module",
    "Linear",
    "Embedding",
    "LayerNorm",
    "RMSNorm",
    "Dropout",
    "Sequential",
    "Flatten",
    "Unflatten",
    "ModuleList",
    "ModuleDict",
    "ReLU",
    "LeakyReLU",
    "GELU",
    "SiLU",
    "Tanh",
    "Sigmoid",
    "Identity",
    "Softmax",
    "LogSoftmax",
    "Softplus",
    "CrossEntropyLoss",
    "NLLLoss",
    "MSELoss",
    "L1Loss",
    "SmoothL1Loss",
    "HuberLoss",
    "BCEWithLogitsLoss",
    "MultiheadAttention",
    "TransformerEncoderLayer",
    "TransformerEncoder",
    "TransformerDecoderLayer",
    "TransformerDecoder",
    "Transformer",
]
