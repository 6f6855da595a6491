"""SGD with PyTorch's semantics (momentum, dampening, Nesterov, weight decay), updating
parameters on the GPU with element-wise ops."""

from __future__ import annotations

import math
from typing import Any, Mapping, Union

import numpy as np

from .._checked import CheckedState
from ..autograd import no_grad
from ..nn.modules.module import float32_values
from ..tensor import tensor
from .optimizer import Optimizer, Params


def _check_sgd_group(group: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A group's hyperparameters, checked as torch checks them (plus finiteness)."""
    out = {}
    for name in ("lr", "momentum", "dampening", "weight_decay"):
        v = group[name]
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v):
            raise ValueError(f"{where}: {name} must be a finite real number, got {v!r}")
        if v < 0.0:
            raise ValueError(f"{where}: invalid {name} value: {v} (must be >= 0)")
        out[name] = float(v)
    for name in ("nesterov", "maximize"):
        if not isinstance(group[name], (bool, np.bool_)):
            raise ValueError(f"{where}: {name} must be a bool, got {group[name]!r}")
        out[name] = bool(group[name])
    if out["nesterov"] and (out["momentum"] <= 0.0 or out["dampening"] != 0.0):
        raise ValueError(f"{where}: Nesterov momentum requires a momentum and zero dampening")
    return out


class SGD(Optimizer):
    """``torch.optim.SGD``: per parameter with a gradient ``d = grad (+ weight_decay p)``
    (negated with ``maximize``); with ``momentum``, the buffer starts as ``d`` and then becomes
    ``momentum buf + (1 - dampening) d``, and ``d`` is the buffer (``d + momentum buf`` with
    ``nesterov``); then ``p -= lr d``. Element-wise ops on the GPU, parameter by parameter;
    ``state_dict()`` holds each ``momentum_buffer`` as torch's does."""

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
    ) -> None:
        defaults = dict(
            lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov,
            maximize=maximize,
        )  # fmt: skip
        _check_sgd_group(defaults, "SGD")
        super().__init__(params, defaults)
        for gi, g in enumerate(self.param_groups):
            _check_sgd_group(g, f"SGD group {gi}")
        self.state: list[dict[str, Any]] = [{} for _ in self.params]

    def step(self) -> None:
        """One update of every parameter that has a gradient."""
        hypers = [_check_sgd_group(g, f"SGD group {gi}") for gi, g in enumerate(self.param_groups)]
        with no_grad():
            for i, p in enumerate(self.params):
                if p.grad is None:
                    continue
                h = hypers[self._group_of[i]]
                d = -p.grad if h["maximize"] else p.grad
                if h["weight_decay"]:
                    d = d + p * h["weight_decay"]
                if h["momentum"]:
                    buf = self.state[i].get("momentum_buffer")
                    if buf is None:
                        buf = self.state[i]["momentum_buffer"] = d.clone()
                    else:
                        buf.mul_(h["momentum"])
                        buf.add_(d * (1.0 - h["dampening"]) if h["dampening"] else d)
                    d = d + buf * h["momentum"] if h["nesterov"] else buf
                p.sub_(d * h["lr"])

    def state_dict(self) -> dict[str, Any]:
        state = {
            i: {"momentum_buffer": st["momentum_buffer"].numpy()}
            for i, st in enumerate(self.state)
            if "momentum_buffer" in st
        }
        return {"state": state, "param_groups": self._saved_groups()}

    def check_state_dict(self, sd: Mapping[str, Any]) -> CheckedState:
        """Validate a ``state_dict()`` of this optimizer without changing anything: the group count
        and sizes, each group's hyperparameters, each state's parameter index and momentum buffer
        (float32-compatible, the parameter's shape)."""
        groups, states = self._check_frame(sd)
        out_groups = []
        for where, saved in groups:
            group = _check_sgd_group(saved, where)
            if "initial_lr" in saved:
                group["initial_lr"] = float(saved["initial_lr"])
            out_groups.append(group)
        state = {}
        for i, st in states:
            if not isinstance(st, Mapping) or set(st) != {"momentum_buffer"}:
                raise ValueError(f"optimizer state {i} must hold exactly 'momentum_buffer'")
            state[i] = {
                "momentum_buffer": float32_values(
                    st["momentum_buffer"], self.params[i].shape, f"optimizer state {i}.momentum_buffer"
                )
            }
        return CheckedState(self, {"state": state, "param_groups": out_groups})

    def load_state_dict(self, sd: Union[Mapping[str, Any], CheckedState]) -> None:
        """Apply a state (checked first unless it is this optimizer's ``CheckedState``)."""
        checked = (sd if isinstance(sd, CheckedState) else self.check_state_dict(sd)).value_for(self)
        for g, saved in zip(self.param_groups, checked["param_groups"]):
            g.update(saved)
        self.state = [{} for _ in self.params]
        for i, st in checked["state"].items():
            self.state[i]["momentum_buffer"] = tensor(st["momentum_buffer"], self.params[i].device)
