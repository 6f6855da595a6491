"""The optimizer base: parameter groups as in ``torch.optim.Optimizer``."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence, Union

import numpy as np

from ..tensor import Tensor

# What optimizers take: tensors that require grad, or parameter groups (dicts
# with "params" and per-group options).
Params = Union[Iterable[Tensor], Iterable[Mapping[str, Any]]]


class Optimizer:
    """Holds ``param_groups``: dicts with ``"params"`` and per-group
    hyperparameters (defaults filled in). Parameters keep one flat order
    across groups (``self.params``), which the optimizer state is keyed by."""

    def __init__(self, params: Params, defaults: Mapping[str, Any]) -> None:
        given: list[Any] = list(params)
        if not given:
            raise ValueError(f"{type(self).__name__} got an empty parameter list")
        groups = given if isinstance(given[0], dict) else [{"params": given}]
        self.defaults = dict(defaults)
        self.param_groups = []
        self.params = []
        self._group_of = []
        seen = set()
        for gi, g in enumerate(groups):
            if not isinstance(g, dict) or "params" not in g:
                raise TypeError(f"{type(self).__name__}: parameter group {gi} must be a dict with 'params'")
            unknown = set(g) - set(defaults) - {"params"}
            if unknown:
                raise ValueError(f"{type(self).__name__}: parameter group {gi} has unknown options {sorted(unknown)}")
            ps = [g["params"]] if isinstance(g["params"], Tensor) else list(g["params"])
            for p in ps:
                if not isinstance(p, Tensor) or not p.requires_grad:
                    raise TypeError(
                        f"{type(self).__name__}: group {gi} holds {type(p).__name__}, not a tensor that requires grad"
                    )
                if id(p) in seen:
                    raise ValueError(f"{type(self).__name__}: a parameter appears twice (group {gi})")
                seen.add(id(p))
            group = dict(self.defaults)
            group.update({k: v for k, v in g.items() if k != "params"})
            group["params"] = ps
            group.setdefault("initial_lr", group["lr"])
            self.param_groups.append(group)
            self.params += ps
            self._group_of += [gi] * len(ps)
        self.defaults["initial_lr"] = self.defaults.get("lr")
        self.device = self.params[0].device
        self._index = {id(p): i for i, p in enumerate(self.params)}
        bounds, first = [], 0
        for g in self.param_groups:
            bounds.append((first, first + len(g["params"])))
            first += len(g["params"])
        self._group_ranges = bounds

    def _saved_groups(self) -> list[dict[str, Any]]:
        """The groups as ``state_dict()`` holds them: options, and parameter indices for ``params``."""
        return [
            {k: v for k, v in g.items() if k != "params"} | {"params": [self._index[id(p)] for p in g["params"]]}
            for g in self.param_groups
        ]

    def _check_frame(
        self, sd: Mapping[str, Any], extra_options: Sequence[str] = ()
    ) -> tuple[list[tuple[str, Mapping[str, Any]]], list[tuple[int, Any]]]:
        """What every optimizer's ``check_state_dict`` checks alike: a mapping with 'state' and
        'param_groups'; as many groups as here, each a dict with every option of the defaults,
        no other (but 'initial_lr' and ``extra_options``), and ``params`` of this group's count;
        each state's key a parameter index, named once. Returns ``[(where, saved group)]`` and
        ``[(index, saved state)]`` for the optimizer's own checks."""
        if not isinstance(sd, Mapping) or set(sd) != {"state", "param_groups"}:
            keys = sorted(sd) if isinstance(sd, Mapping) else type(sd).__name__
            raise ValueError(f"optimizer state must be a mapping with 'state' and 'param_groups', got {keys}")
        groups = sd["param_groups"]
        if not isinstance(groups, (list, tuple)) or not all(isinstance(g, Mapping) for g in groups):
            raise ValueError(f"optimizer state: param_groups must be a list of dicts, got {groups!r:.200}")
        if len(groups) != len(self.param_groups):
            raise ValueError(
                f"optimizer state has {len(groups)} parameter groups, this optimizer {len(self.param_groups)}"
            )
        options = [k for k in self.defaults if k != "initial_lr"]
        known = {"params", "initial_lr", *options, *extra_options}
        checked_groups = []
        for gi, (saved, mine) in enumerate(zip(groups, self.param_groups)):
            where = f"optimizer state group {gi}"
            unknown = sorted(set(saved) - known)
            if unknown:
                raise ValueError(f"{where} has unknown options {unknown}")
            missing = sorted(k for k in ("params", *options) if k not in saved)
            if missing:
                raise ValueError(f"{where} lacks {missing}")
            ps = saved["params"]
            if not isinstance(ps, (list, tuple)) or len(ps) != len(mine["params"]):
                n = len(ps) if isinstance(ps, (list, tuple)) else ps
                raise ValueError(f"{where} has {n!r} parameters, this optimizer {len(mine['params'])}")
            checked_groups.append((where, saved))
        states = sd["state"]
        if not isinstance(states, Mapping):
            raise ValueError(f"optimizer state: 'state' must be a mapping, got {type(states).__name__}")
        checked_states, seen = [], set()
        for key, st in states.items():
            try:
                i = int(key) if isinstance(key, (str, int, np.integer)) and not isinstance(key, bool) else None
            except ValueError:
                i = None
            if i is None or not 0 <= i < len(self.params):
                raise ValueError(
                    f"optimizer state names parameter {key!r}; this optimizer has parameters 0..{len(self.params) - 1}"
                )
            if i in seen:
                raise ValueError(f"optimizer state names parameter {i} twice")
            seen.add(i)
            checked_states.append((i, st))
        return checked_groups, checked_states

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the gradients (the next backward writes them afresh; no GPU work)."""
        for p in self.params:
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad.zero_()
