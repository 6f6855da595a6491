"""The optimizer base: parameter groups as in ``torch.optim.Optimizer``."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Union

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

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the gradients (the next backward writes them afresh; no GPU work)."""
        for p in self.params:
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad.zero_()
