"""PyTorch-shaped modules whose parameters live on the GPU.

A model is a stack of Linear layers, each optionally followed by an
activation, which the layer applies in its fused GEMM epilogue. ``forward``
keeps what backward needs; ``loss.backward()`` runs the whole backward pass
as recorded GPU work. Supported: Linear, ReLU, GELU (erf or tanh), SiLU,
Identity, Sequential, MLP.
"""
import math
from collections import OrderedDict

import numpy as np

from . import _core
from .ops import ACTIVATIONS, _as_tensor, linear, record_cross_entropy, record_mse
from .tensor import Tensor, empty, tensor, _resolve_device


class Parameter(Tensor):
    """A trainable tensor with a ``grad`` tensor of the same shape."""

    __slots__ = ("grad", "_grad_fresh", "_grad_home")

    def __init__(self, data, device):
        t = tensor(np.ascontiguousarray(data, dtype=np.float32), device)
        super().__init__(t._buf, t.shape, t.dtype, device)
        self.grad = None
        self._grad_fresh = True  # next backward overwrites instead of accumulating
        self._grad_home = None  # where a new grad lives (a view of an optimizer's flat arena)

    def _grad_target(self):
        """(grad tensor, beta): beta 0 overwrites, 1 accumulates like torch."""
        if self.grad is None:
            self.grad = self._grad_home if self._grad_home is not None else empty(self.shape, np.float32, self.device)
            self._grad_fresh = True
        beta = 0.0 if self._grad_fresh else 1.0
        self._grad_fresh = False
        return self.grad, beta


class Module:
    training = True

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def named_parameters(self):
        return []

    def zero_grad(self):
        for p in self.parameters():
            p._grad_fresh = True

    def train(self, mode=True):
        self.training = mode
        for m in getattr(self, "layers", []):
            m.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def state_dict(self):
        return OrderedDict((name, p.numpy()) for name, p in self.named_parameters())

    def load_state_dict(self, state):
        params = dict(self.named_parameters())
        missing = sorted(set(params) - set(state))
        unexpected = sorted(set(state) - set(params))
        if missing or unexpected:
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        for name, p in params.items():
            arr = np.asarray(state[name])
            if arr.shape != p.shape:
                raise ValueError(f"load_state_dict: {name} has shape {arr.shape}, the model expects {p.shape}")
            p.copy_(np.ascontiguousarray(arr, dtype=np.float32))

    def __call__(self, x):
        return self.forward(x)


class _Activation(Module):
    name = None

    def __repr__(self):
        return f"{type(self).__name__}()"


class Identity(_Activation):
    name = None


class ReLU(_Activation):
    name = "relu"


class SiLU(_Activation):
    name = "silu"


class GELU(_Activation):
    """``approximate='none'`` (erf, torch's default) or ``'tanh'``."""

    def __init__(self, approximate="none"):
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate
        self.name = "gelu" if approximate == "none" else "gelu_tanh"

    def __repr__(self):
        return f"GELU(approximate={self.approximate!r})"


class Linear(Module):
    """``y = act(x @ W.T + b)``, W: [out, in], initialized like ``torch.nn.Linear``
    (Kaiming-uniform weights, uniform(-1/sqrt(in), 1/sqrt(in)) bias) from ``seed``."""

    def __init__(self, in_features, out_features, activation=None, device=None, seed=None, rng=None):
        if int(in_features) < 1 or int(out_features) < 1:
            raise ValueError(f"Linear needs in_features, out_features >= 1, got {in_features}, {out_features}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(k for k in ACTIVATIONS if k)}, got {activation!r}")
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.activation = activation
        self.device = _resolve_device(device)
        rng = rng if rng is not None else np.random.default_rng(seed)
        bound = 1.0 / math.sqrt(self.in_features)  # kaiming_uniform_(a=sqrt(5)) reduces to this bound
        self.weight = Parameter(rng.uniform(-bound, bound, (self.out_features, self.in_features)), self.device)
        self.bias = Parameter(rng.uniform(-bound, bound, (self.out_features,)), self.device)
        self._input = None
        self._preact = None

    def named_parameters(self):
        return [("weight", self.weight), ("bias", self.bias)]

    def forward(self, x):
        x = _as_tensor(x, "x", self.device)
        keep = self.training and self.activation not in (None, "none")
        preact = empty(x.shape[:-1] + (self.out_features,), np.float32, self.device) if keep else None
        y = linear(x, self.weight, self.bias, self.activation, preact=preact)
        if self.training:
            self._input, self._preact = x, preact
        return y

    def backward(self, dy, need_input_grad=True, dy_is_preact_grad=False, input_act=None):
        """Given d(loss)/dy, accumulate weight/bias grads; return d(loss)/dx.

        ``dy_is_preact_grad``: dy is already the gradient of the pre-activation.
        ``input_act = (preact, activation)`` of the layer that produced x: the
        returned gradient is then carried through that activation in the dX
        GEMM's epilogue (one kernel instead of a GEMM and an elementwise pass)."""
        if self._input is None:
            raise RuntimeError("Linear.backward called without a training-mode forward")
        x = self._input
        rows = x.size // self.in_features
        dev = self.device
        dw, beta_w = self.weight._grad_target()
        db, beta_b = self.bias._grad_target()
        with dev._recording() as rec:
            dz = dy
            if self._preact is not None and not dy_is_preact_grad:
                dz = empty(dy.shape, np.float32, dev)
                _core.activation_backward(rec, dy._buf, self._preact._buf, dz._buf, dy.size, ACTIVATIONS[self.activation])
            # dW[out, in] = dZ^T X ; db = column sums of dZ ; dX = dZ W
            if beta_w == beta_b:  # one GEMM computes both
                _core.linear_weight_grads(rec, dz._buf, x._buf, dw._buf, db._buf, rows, self.out_features,
                                          self.in_features, beta_w)
            else:
                _core.gemm(rec, dz._buf, x._buf, dw._buf, self.out_features, self.in_features, rows, True, False,
                           1.0, beta_w)
                _core.bias_grad(rec, dz._buf, db._buf, rows, self.out_features, beta_b)
            dx = None
            if need_input_grad:
                dx = empty(x.shape, np.float32, dev)
                if input_act is not None:
                    _core.gemm_act_grad(rec, dz._buf, self.weight._buf, input_act[0]._buf, dx._buf, rows,
                                        self.in_features, self.out_features, False, False, ACTIVATIONS[input_act[1]])
                else:
                    _core.gemm(rec, dz._buf, self.weight._buf, dx._buf, rows, self.in_features, self.out_features,
                               False, False, 1.0, 0.0)
        return dx

    def __repr__(self):
        act = f", activation={self.activation!r}" if self.activation else ""
        return f"Linear(in_features={self.in_features}, out_features={self.out_features}{act})"


class Sequential(Module):
    """Linear layers and activations; an activation right after a Linear is fused into it."""

    def __init__(self, *modules):
        layers = []
        for m in modules:
            if isinstance(m, _Activation):
                if m.name is None:
                    continue
                if not layers or not isinstance(layers[-1], Linear) or layers[-1].activation is not None:
                    raise ValueError(f"{m!r} must directly follow a Linear without an activation")
                layers[-1].activation = m.name
            elif isinstance(m, Linear):
                layers.append(m)
            else:
                raise TypeError(f"Sequential supports Linear and activation modules, got {type(m).__name__}")
        if not layers:
            raise ValueError("Sequential needs at least one Linear")
        self.layers = layers
        self.device = layers[0].device

    def named_parameters(self):
        return [(f"{i}.{n}", p) for i, layer in enumerate(self.layers) for n, p in layer.named_parameters()]

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        if self.training:
            x._grad_fn = self.backward
        return x

    def backward(self, dy):
        # Each layer's input gradient leaves its dX GEMM already multiplied by
        # the activation derivative of the layer below.
        dy_is_preact_grad = False
        for i, layer in reversed(list(enumerate(self.layers))):
            below = self.layers[i - 1] if i > 0 else None
            input_act = (below._preact, below.activation) if below is not None and below._preact is not None else None
            dy = layer.backward(dy, need_input_grad=i > 0, dy_is_preact_grad=dy_is_preact_grad, input_act=input_act)
            dy_is_preact_grad = input_act is not None

    def __repr__(self):
        return "Sequential(\n" + "".join(f"  {layer!r}\n" for layer in self.layers) + ")"


def MLP(sizes, activation="relu", device=None, seed=0):
    """``sizes = [in, hidden..., out]``: Linear layers with ``activation`` between
    them and none after the last, seeded for reproducible initialization."""
    sizes = [int(s) for s in sizes]
    if len(sizes) < 2:
        raise ValueError(f"MLP needs at least [in, out] sizes, got {sizes}")
    rng = np.random.default_rng(seed)
    dev = _resolve_device(device)
    layers = [Linear(a, b, activation=activation if i < len(sizes) - 2 else None, device=dev, rng=rng)
              for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]))]
    return Sequential(*layers)


class Loss:
    """A recorded loss: ``item()`` reads it back, ``backward()`` runs the model's backward."""

    def __init__(self, value, grad, source):
        self._value, self._grad, self._source = value, grad, source
        self._lost = None  # why the step that computes it never ran, if it did not

    def item(self):
        if self._lost:
            raise RuntimeError(self._lost)
        return float(self._value.numpy()[0])

    def tensor(self):
        return self._value

    def backward(self):
        if self._source is None:
            raise RuntimeError("backward(): this loss came from a replayed training step, whose backward already ran")
        fn = getattr(self._source, "_grad_fn", None)
        if fn is None:
            raise RuntimeError("backward(): the loss input was not produced by a module in training mode")
        fn(self._grad)
        self._source._grad_fn = None

    def __float__(self):
        return self.item()


class CrossEntropyLoss:
    """Mean softmax cross-entropy over the batch (``torch.nn.CrossEntropyLoss()``)."""

    def __call__(self, logits, labels):
        source, value, grad = record_cross_entropy(logits, labels)
        return Loss(value, grad, source)


class MSELoss:
    """Mean squared error (``torch.nn.MSELoss()``)."""

    def __call__(self, pred, target):
        source, value, grad = record_mse(pred, target)
        return Loss(value, grad, source)
