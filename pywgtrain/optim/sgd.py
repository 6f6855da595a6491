"""SGD with PyTorch's semantics (momentum, dampening, Nesterov, weight decay), updating
parameters on the GPU with element-wise ops."""

from __future__ import annotations

import math
from typing import Any, Mapping, Union

import numpy as np

from .._checked import CheckedState
from ..autograd import no_grad
from ..tensor import tensor
from .optimizer import Optimizer, Params

_HYPER = ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize")


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
        groups = [
            {k: v for k, v in g.items() if k != "params"} | {"params": [self._index[id(p)] for p in g["params"]]}
            for g in self.param_groups
        ]
        return {"state": state, "param_groups": groups}

    def check_state_dict(self, sd: Mapping[str, Any]) -> CheckedState:
        """Validate a ``state_dict()`` of this optimizer without changing anything: the group count
        and sizes, each group's hyperparameters, each state's parameter index and momentum buffer
        (float32-compatible, the parameter's shape)."""
        if not isinstance(sd, Mapping) or set(sd) != {"state", "param_groups"}:
            keys = sorted(sd) if isinstance(sd, Mapping) else type(sd).__name__
            raise ValueError(f"optimizer state must be a mapping with 'state' and 'param_groups', got {keys}")
        groups = sd["param_groups"]
        if not isinstance(groups, (list, tuple)) or len(groups) != len(self.param_groups):
            raise ValueError(f"optimizer state must have {len(self.param_groups)} parameter groups")
        out_groups = []
        for gi, (saved, mine) in enumerate(zip(groups, self.param_groups)):
            if not isinstance(saved, Mapping):
                raise ValueError(f"optimizer state group {gi} must be a dict")
            unknown = sorted(set(saved) - {"params", "initial_lr", *_HYPER})
            if unknown:
                raise ValueError(f"optimizer state group {gi} has unknown options {unknown}")
            missing = sorted(k for k in ("params", *_HYPER) if k not in saved)
            if missing:
                raise ValueError(f"optimizer state group {gi} lacks {missing}")
            if len(saved["params"]) != len(mine["params"]):
                raise ValueError(
                    f"optimizer state group {gi} has {len(saved['params'])} parameters, this optimizer "
                    f"{len(mine['params'])}"
                )
            group = _check_sgd_group(saved, f"optimizer state group {gi}")
            if "initial_lr" in saved:
                group["initial_lr"] = float(saved["initial_lr"])
            out_groups.append(group)
        state = {}
        states = sd["state"]
        if not isinstance(states, Mapping):
            raise ValueError("optimizer state: 'state' must be a mapping")
        for key, st in states.items():
            i = int(key) if isinstance(key, (int, np.integer)) or (isinstance(key, str) and key.isdigit()) else -1
            if not 0 <= i < len(self.params):
                raise ValueError(f"optimizer state names parameter {key!r}, this optimizer has {len(self.params)}")
            if not isinstance(st, Mapping) or set(st) != {"momentum_buffer"}:
                raise ValueError(f"optimizer state {i} must hold exactly 'momentum_buffer'")
            buf = np.asarray(st["momentum_buffer"])
            if buf.dtype.kind != "f" or buf.shape != self.params[i].shape:
                raise ValueError(
                    f"optimizer state {i}: momentum_buffer must be a float array of shape {self.params[i].shape}, "
                    f"got {buf.dtype.name} {buf.shape}"
                )
            state[i] = {"momentum_buffer": buf.astype(np.float32)}
        return CheckedState(self, {"state": state, "param_groups": out_groups})

    def load_state_dict(self, sd: Union[Mapping[str, Any], CheckedState]) -> None:
        """Apply a state (checked first unless it is this optimizer's ``CheckedState``)."""
        checked = (sd if isinstance(sd, CheckedState) else self.check_state_dict(sd)).value_for(self)
        for g, saved in zip(self.param_groups, checked["param_groups"]):
            g.update(saved)
        self.state = [{} for _ in self.params]
        for i, st in checked["state"].items():
            self.state[i]["momentum_buffer"] = tensor(st["momentum_buffer"], self.params[i].device)
