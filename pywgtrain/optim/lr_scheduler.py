"""Learning-rate schedules as in ``torch.optim.lr_scheduler``: ``step()``
after each optimizer step sets every group's ``lr``; replayed training steps
read it (``Trainer``)."""

from __future__ import annotations

import bisect
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


class StepLR(LRScheduler):
    """lr = base_lr * gamma ** (step // step_size)."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1) -> None:
        if int(step_size) < 1:
            raise ValueError(f"StepLR: step_size must be >= 1, got {step_size}")
        self.step_size, self.gamma = int(step_size), float(gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [base * self.gamma ** (self.last_epoch // self.step_size) for base in self.base_lrs]


class MultiStepLR(LRScheduler):
    """lr = base_lr * gamma ** (the number of milestones reached)."""

    def __init__(
        self, optimizer: Optimizer, milestones: Sequence[int], gamma: float = 0.1, last_epoch: int = -1
    ) -> None:
        self.milestones, self.gamma = sorted(int(m) for m in milestones), float(gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [base * self.gamma ** bisect.bisect_right(self.milestones, self.last_epoch) for base in self.base_lrs]


class ExponentialLR(LRScheduler):
    """lr = base_lr * gamma ** step."""

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1) -> None:
        self.gamma = float(gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [base * self.gamma**self.last_epoch for base in self.base_lrs]


class ConstantLR(LRScheduler):
    """lr = base_lr * factor for the first total_iters steps, then base_lr."""

    def __init__(
        self, optimizer: Optimizer, factor: float = 1.0 / 3, total_iters: int = 5, last_epoch: int = -1
    ) -> None:
        if not 0 <= factor <= 1:
            raise ValueError(f"ConstantLR: factor must be in [0, 1], got {factor}")
        self.factor, self.total_iters = float(factor), int(total_iters)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        f = self.factor if self.last_epoch < self.total_iters else 1.0
        return [base * f for base in self.base_lrs]


class SequentialLR(LRScheduler):
    """``schedulers[i]`` from ``milestones[i - 1]`` on, each started afresh at its milestone
    (torch's SequentialLR): the lr at step t is scheduler i's at t - milestones[i - 1]."""

    def __init__(
        self, optimizer: Optimizer, schedulers: Sequence[LRScheduler], milestones: Sequence[int], last_epoch: int = -1
    ) -> None:
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(
                f"SequentialLR: {len(schedulers)} schedulers need {len(schedulers) - 1} milestones, got {len(milestones)}"
            )
        if any(s.optimizer is not optimizer for s in schedulers):
            raise ValueError("SequentialLR: every scheduler must drive this optimizer")
        self.schedulers, self.milestones = list(schedulers), [int(m) for m in milestones]
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        i = bisect.bisect_right(self.milestones, self.last_epoch)
        sched = self.schedulers[i]
        sched.last_epoch = self.last_epoch - (self.milestones[i - 1] if i else 0)
        return sched.get_lr()


class OneCycleLR(LRScheduler):
    """torch's OneCycleLR: lr from max_lr / div_factor up to max_lr over the first pct_start of
    total_steps, then down to that / final_div_factor (three_phase: back to the start first);
    with cycle_momentum, the groups' momentum (AdamW / Adam: betas[0]; SGD: momentum) runs
    the other way between max_momentum and base_momentum (a step captured in a Graph keeps the
    betas of its capture). Cosine or linear annealing. As every scheduler here, a step that
    would set a negative lr raises (linear annealing past total_steps - 1 would)."""

    def __init__(
        self,
        optimizer: Optimizer,
        max_lr: Union[float, Sequence[float]],
        total_steps: int,
        pct_start: float = 0.3,
        anneal_strategy: str = "cos",
        cycle_momentum: bool = True,
        base_momentum: float = 0.85,
        max_momentum: float = 0.95,
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
        three_phase: bool = False,
        last_epoch: int = -1,
    ) -> None:
        if int(total_steps) < 1:
            raise ValueError(f"OneCycleLR: total_steps must be >= 1, got {total_steps}")
        if not 0 <= pct_start <= 1:
            raise ValueError(f"OneCycleLR: pct_start must be in [0, 1], got {pct_start}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"OneCycleLR: anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        groups = optimizer.param_groups
        maxes = (
            [float(m) for m in max_lr]
            if isinstance(max_lr, (list, tuple))
            else [float(cast(float, max_lr))] * len(groups)
        )
        if len(maxes) != len(groups):
            raise ValueError(f"OneCycleLR: {len(maxes)} max_lr values for {len(groups)} parameter groups")
        self.total_steps, self.anneal_cos, self.cycle_momentum = (
            int(total_steps),
            anneal_strategy == "cos",
            cycle_momentum,
        )
        up = float(pct_start * self.total_steps) - 1
        self.phases = (
            [(up, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
             (2 * float(pct_start * self.total_steps) - 2, "max_lr", "initial_lr", "base_momentum", "max_momentum"),
             (self.total_steps - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum")]
            if three_phase else
            [(up, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
             (self.total_steps - 1, "max_lr", "min_lr", "base_momentum", "max_momentum")]
        )  # fmt: skip
        for g, m in zip(groups, maxes):
            g["initial_lr"], g["max_lr"] = m / div_factor, m
            g["min_lr"] = g["initial_lr"] / final_div_factor
            if cycle_momentum:
                if "betas" not in g and "momentum" not in g:
                    raise ValueError("OneCycleLR: cycle_momentum needs an optimizer with betas or momentum")
                g["max_momentum"], g["base_momentum"] = float(max_momentum), float(base_momentum)
        super().__init__(optimizer, last_epoch)

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self.anneal_cos:
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self) -> list[float]:
        t = self.last_epoch
        if t > self.total_steps:
            raise ValueError(f"OneCycleLR: stepped {t} times, past total_steps={self.total_steps}")
        lrs = []
        for g in self.optimizer.param_groups:
            start = 0.0
            for i, (end, lr0, lr1, m0, m1) in enumerate(self.phases):
                if t <= end or i == len(self.phases) - 1:
                    pct = (t - start) / (end - start)
                    lrs.append(self._anneal(g[lr0], g[lr1], pct))
                    if self.cycle_momentum:
                        m = self._anneal(g[m0], g[m1], pct)
                        if "betas" in g:
                            g["betas"] = (m, *tuple(g["betas"])[1:])
                        else:
                            g["momentum"] = m
                    break
                start = end
        return lrs
