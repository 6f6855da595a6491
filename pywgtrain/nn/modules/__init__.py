from .activation import GELU, Identity, LogSoftmax, ReLU, Sigmoid, SiLU, Softmax, Tanh
from .container import ModuleList, Sequential
from .dropout import Dropout
from .linear import Linear
from .loss import CrossEntropyLoss, MSELoss, NLLLoss
from .module import Module
from .normalization import LayerNorm

__all__ = ["Module", "Linear", "Sequential", "ModuleList", "ReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "Identity",
           "Softmax", "LogSoftmax", "CrossEntropyLoss", "NLLLoss", "MSELoss", "LayerNorm", "Dropout"]
