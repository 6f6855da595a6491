"""Learning-rate schedulers against torch.optim.lr_scheduler: the lr of every group (and the
momentum OneCycleLR cycles) at each step of the same schedule, for AdamW and SGD."""

import numpy as np
import pytest

import pywgtrain as pw
from pywgtrain.optim import lr_scheduler as ours_ls

torch = pytest.importorskip("torch")
TLS = torch.optim.lr_scheduler


def pair(dev, kind):
    """Two-group optimizers, ours and torch's, of the same kind and lrs."""
    ps = [pw.nn.Parameter(np.ones(3, np.float32), dev), pw.nn.Parameter(np.ones(2, np.float32), dev)]
    ts = [torch.zeros(3, requires_grad=True), torch.zeros(2, requires_grad=True)]
    if kind == "adamw":
        return (pw.optim.AdamW([{"params": ps[:1]}, {"params": ps[1:], "lr": 0.05}], lr=0.1),
                torch.optim.AdamW([{"params": ts[:1]}, {"params": ts[1:], "lr": 0.05}], lr=0.1))  # fmt: skip
    return (pw.optim.SGD([{"params": ps[:1]}, {"params": ps[1:], "lr": 0.05}], lr=0.1, momentum=0.9),
            torch.optim.SGD([{"params": ts[:1]}, {"params": ts[1:], "lr": 0.05}], lr=0.1, momentum=0.9))  # fmt: skip


def momenta(opt):
    return [g["betas"][0] if "betas" in g else g["momentum"] for g in opt.param_groups]


CASES = {
    "step": lambda m, o: m.StepLR(o, step_size=3, gamma=0.5),
    "multistep": lambda m, o: m.MultiStepLR(o, milestones=[7, 2, 5], gamma=0.3),
    "exponential": lambda m, o: m.ExponentialLR(o, gamma=0.9),
    "constant": lambda m, o: m.ConstantLR(o, factor=0.25, total_iters=4),
    "sequential": lambda m, o: m.SequentialLR(
        o, [m.LinearLR(o, start_factor=0.1, total_iters=3), m.CosineAnnealingLR(o, T_max=8)], milestones=[3]
    ),
    "onecycle": lambda m, o: m.OneCycleLR(o, max_lr=[1.0, 0.5], total_steps=12),
    "onecycle_linear_3": lambda m, o: m.OneCycleLR(
        o, max_lr=0.8, total_steps=12, anneal_strategy="linear", three_phase=True, pct_start=0.25
    ),  # fmt: skip
}


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
@pytest.mark.parametrize("name", list(CASES))
def test_schedule_like_torch(dev, name, kind):
    opt, topt = pair(dev, kind)
    sched, tsched = CASES[name](ours_ls, opt), CASES[name](TLS, topt)
    for step in range(12):  # epochs 0..11 (OneCycleLR's last of 12 steps is 11)
        assert sched.get_last_lr() == pytest.approx(tsched.get_last_lr(), rel=1e-12), (name, step)
        assert momenta(opt) == pytest.approx(momenta(topt), rel=1e-12), (name, step)
        if step < 11:
            topt.step()
            sched.step()
            tsched.step()


def test_onecycle_rejects_steps_past_the_end(dev):
    opt, _ = pair(dev, "sgd")
    sched = ours_ls.OneCycleLR(opt, max_lr=1.0, total_steps=3)
    for _ in range(3):
        sched.step()
    with pytest.raises(ValueError, match="past total_steps"):
        sched.step()
    with pytest.raises(ValueError, match="milestones"):
        ours_ls.SequentialLR(opt, [ours_ls.ConstantLR(opt)], milestones=[2])
