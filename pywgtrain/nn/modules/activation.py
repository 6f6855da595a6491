"""Activation modules. After a Linear inside a Sequential they run in the
Linear's fused GEMM epilogue."""
from ... import functions as F
from .module import Module


class _Activation(Module):
    fused = None  # the Linear epilogue's name for it (ops.ACTIVATIONS), None if not fusable


class Identity(_Activation):
    def forward(self, x):
        return x


class ReLU(_Activation):
    fused = "relu"

    def forward(self, x):
        return F.relu(x)


class SiLU(_Activation):
    fused = "silu"

    def forward(self, x):
        return F.silu(x)


class GELU(_Activation):
    """``approximate='none'`` (erf, torch's default) or ``'tanh'``."""

    def __init__(self, approximate="none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate
        self.fused = "gelu" if approximate == "none" else "gelu_tanh"

    def forward(self, x):
        return F.gelu(x, self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class Tanh(_Activation):
    def forward(self, x):
        return F.tanh(x)


class Sigmoid(_Activation):
    def forward(self, x):
        return F.sigmoid(x)


class Softmax(Module):
    def __init__(self, dim=-1):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return F.softmax(x, self.dim)


class LogSoftmax(Softmax):
    def forward(self, x):
        return F.log_softmax(x, self.dim)
