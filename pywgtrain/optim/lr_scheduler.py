"""Learning-rate schedules as in ``torch.optim.lr_scheduler``: ``step()``
after each optimizer step sets every group's ``lr``; replayed training steps
read it (``Trainer``)."""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Mapping, Sequence, Union, cast

from .optimizer import Optimizer


class LRScheduler:
    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        self.optimizer = optimizer
        for g in optimizer.param_groups:
            g.setdefault("initial_lr", g["lr"])
        self.base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
        self.last_epoch = last_epoch
        self.step()

    def get_lr(self) -> list[float]:
        raise NotImplementedError

    def step(self) -> None:
        self.last_epoch += 1
        lrs = self.get_lr()
        for g, lr in zip(self.optimizer.param_groups, lrs):
            if not (isinstance(lr, numbers.Real) and math.isfinite(lr) and lr >= 0):
                raise ValueError(f"{type(self).__name__}: the schedule gave lr={lr!r} at step {self.last_epoch}")
            g["lr"] = float(lr)
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def get_last_lr(self) -> list[float]:
        return list(self._last_lr)

    def state_dict(self) -> dict[str, Any]:
        return {"last_epoch": self.last_epoch, "base_lrs": list(self.base_lrs)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.last_epoch = int(state["last_epoch"])
        self.base_lrs = list(state["base_lrs"])
        lrs = self.get_lr()
        for g, lr in zip(self.optimizer.param_groups, lrs):
            g["lr"] = float(lr)
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]


class LambdaLR(LRScheduler):
    """lr = base_lr * lr_lambda(step) (one function, or one per group)."""

    def __init__(
        self,
        optimizer: Optimizer,
        lr_lambda: Union[Callable[[int], float], Sequence[Callable[[int], float]]],
        last_epoch: int = -1,
    ) -> None:
        n = len(optimizer.param_groups)
        self.lr_lambdas: list[Callable[[int], float]] = (
            list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else [cast(Callable[[int], float], lr_lambda)] * n
        )
        if len(self.lr_lambdas) != n:
            raise ValueError(f"LambdaLR: {len(self.lr_lambdas)} lr_lambdas for {n} parameter groups")
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [base * fn(self.last_epoch) for base, fn in zip(self.base_lrs, self.lr_lambdas)]


class LinearLR(LRScheduler):
    """Factor going linearly from start_factor to end_factor over total_iters steps."""

    def __init__(
        self,
        optimizer: Optimizer,
        start_factor: float = 1.0 / 3,
        end_factor: float = 1.0,
        total_iters: int = 5,
        last_epoch: int = -1,
    ) -> None:
        if not 0 < start_factor <= 1 or not 0 <= end_factor <= 1:
            raise ValueError("LinearLR: start_factor must be in (0, 1] and end_factor in [0, 1]")
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, int(total_iters)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        t = min(self.last_epoch, self.total_iters) / max(self.total_iters, 1)
        f = self.start_factor + (self.end_factor - self.start_factor) * t
        return [base * f for base in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """eta_min + (base - eta_min) * (1 + cos(pi * t / T_max)) / 2 (the closed form)."""

    def __init__(
        self,
        optimizer: Optimizer,
        T_max: int,  # noqa: N803 - torch's name
        eta_min: float = 0.0,
        last_epoch: int = -1,
    ) -> None:
        if int(T_max) < 1:
            raise ValueError(f"CosineAnnealingLR: T_max must be >= 1, got {T_max}")
        self.T_max, self.eta_min = int(T_max), float(eta_min)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        c = (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
        return [self.eta_min + (base - self.eta_min) * c for base in self.base_lrs]


def warmup_cosine(optimizer: Optimizer, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0) -> LambdaLR:
    """Linear warm-up from 0 over ``warmup_steps``, then cosine decay to
    ``min_lr_ratio * lr`` at ``total_steps`` (a LambdaLR)."""
    warmup_steps, total_steps = int(warmup_steps), int(total_steps)
    if warmup_steps < 0 or total_steps < 1 or warmup_steps > total_steps:
        raise ValueError(
            f"warmup_cosine: need 0 <= warmup_steps <= total_steps and total_steps >= 1, got "
            f"{warmup_steps}, {total_steps}"
        )

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        t = min(step - warmup_steps, total_steps - warmup_steps) / max(total_steps - warmup_steps, 1)
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))

    return LambdaLR(optimizer, factor)
