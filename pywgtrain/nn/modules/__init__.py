from .activation import GELU, Identity, LogSoftmax, ReLU, Sigmoid, SiLU, Softmax, Tanh
from .container import ModuleDict, ModuleList, Sequential
from .dropout import Dropout
from .linear import Linear
from .loss import CrossEntropyLoss, MSELoss, NLLLoss
from .module import Module
from .sparse import Embedding
from .normalization import LayerNorm

__all__ = [
    "Module",
    "Linear",
    "Embedding",
    "LayerNorm",
    "Dropout",
    "Sequential",
    "ModuleList",
    "ModuleDict",
    "ReLU",
    "GELU",
    "SiLU",
    "Tanh",
    "Sigmoid",
    "Identity",
    "Softmax",
    "LogSoftmax",
    "CrossEntropyLoss",
    "NLLLoss",
    "MSELoss",
]
