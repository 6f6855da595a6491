"""Modules like PyTorch's: registration by attribute, dotted names, state
dicts that load into the torch equivalent and back; a user-defined model
(residual MLP with a LayerNorm written from mean/var) trains in step with
the same model in PyTorch, eagerly and through Trainer's replayed steps,
with parameter groups, clipping and a warm-up + cosine schedule."""

import numpy as np
import pytest

import pywgtrain as pw
import pywgtrain.nn.functional as F

torch = pytest.importorskip("torch")

STEPS = 20
REL = 1e-4


def _lib(L):
    return (pw.nn, F) if L is pw else (torch.nn, torch.nn.functional)


def make_model(L, dim=24, hidden=40, classes=5, blocks=2, device=None):
    nn, func = _lib(L)

    class LayerNorm(nn.Module):
        """LayerNorm from mean/var ops (the fused kernel is the transformer issue's)."""

        def __init__(self, d):
            super().__init__()
            self.weight = nn.Parameter(np.ones(d, np.float32), device) if L is pw else nn.Parameter(torch.ones(d))
            self.bias = nn.Parameter(np.zeros(d, np.float32), device) if L is pw else nn.Parameter(torch.zeros(d))

        def forward(self, x):
            mu = x.mean(-1, keepdim=True)
            var = x.var(-1, keepdim=True, unbiased=False)
            return (x - mu) / (var + 1e-5).sqrt() * self.weight + self.bias

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = LayerNorm(dim)
            kw = {"device": device} if L is pw else {}
            self.up = nn.Linear(dim, hidden, **kw)
            self.down = nn.Linear(hidden, dim, **kw)

        def forward(self, x):
            return x + self.down(func.gelu(self.up(self.norm(x))))

    class ResidualMLP(nn.Module):
        def __init__(self):
            super().__init__()
            kw = {"device": device} if L is pw else {}
            self.embed = nn.Linear(12, dim, **kw)
            self.blocks = nn.ModuleList([Block() for _ in range(blocks)])
            self.norm = LayerNorm(dim)
            self.head = nn.Linear(dim, classes, **kw)

        def forward(self, x):
            h = self.embed(x)
            for b in self.blocks:
                h = b(h)
            return self.head(self.norm(h))

    return ResidualMLP()


def _groups(L, model):
    decay = [p for n, p in model.named_parameters() if n.endswith("weight") and "norm" not in n]
    rest = [p for n, p in model.named_parameters() if not (n.endswith("weight") and "norm" not in n)]
    return [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]


def _torch_twin(model):
    tmodel = make_model(torch)
    tmodel.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict().items()})
    return tmodel


def test_state_dict_names_and_round_trip(dev):
    model = make_model(pw, device=dev)
    tmodel = make_model(torch)
    assert list(model.state_dict()) == list(tmodel.state_dict())
    # torch -> pywgtrain
    model.load_state_dict(tmodel.state_dict())
    for k, v in tmodel.state_dict().items():
        np.testing.assert_array_equal(model.state_dict()[k], v.numpy(), err_msg=k)
    # pywgtrain -> torch
    fresh = make_model(torch)
    fresh.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict().items()})
    with pytest.raises(KeyError, match="missing keys"):
        model.load_state_dict({"head.weight": np.zeros((5, 24), np.float32)})
    with pytest.raises(ValueError, match="head.weight has shape"):
        sd = model.state_dict()
        sd["head.weight"] = np.zeros((3, 3), np.float32)
        model.load_state_dict(sd)
    names = [n for n, _ in model.named_parameters()]
    assert "blocks.1.up.weight" in names and "blocks.0.norm.bias" in names


def test_module_registration_rules(dev):
    class Bad(pw.nn.Module):
        def __init__(self):
            self.w = pw.nn.Parameter(np.ones(2, np.float32), dev)

    with pytest.raises(AttributeError, match="before Module.__init__"):
        Bad()
    m = pw.nn.Linear(3, 2, device=dev)
    m.extra = pw.nn.Linear(2, 2, device=dev)
    assert [n for n, _ in m.named_parameters()] == ["weight", "bias", "extra.weight", "extra.bias"]
    m.extra = None
    assert [n for n, _ in m.named_parameters()] == ["weight", "bias"]
    tied = pw.nn.Sequential(m, pw.nn.Linear(3, 2, device=dev))
    tied[1].weight = m.weight
    assert len(tied.parameters()) == 3  # the tied weight once
    m.eval()
    assert not m.training and tied.training


def _batches(seed, n=STEPS):
    r = np.random.default_rng(seed)
    return [(r.standard_normal((16, 12)).astype(np.float32), r.integers(0, 5, 16)) for _ in range(n)]


def _torch_losses(tmodel, batches):
    opt = torch.optim.AdamW(_groups(torch, tmodel), lr=3e-3, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _warmup_cosine_factor)
    out = []
    for x, y in batches:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(tmodel(torch.from_numpy(x)), torch.from_numpy(y.astype(np.int64)))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tmodel.parameters(), 0.5)
        opt.step()
        sched.step()
        out.append(loss.item())
    return out


def _warmup_cosine_factor(step):
    import math

    warm, total = 5, STEPS
    if step < warm:
        return (step + 1) / (warm + 1)
    t = min(step - warm, total - warm) / (total - warm)
    return 0.5 * (1 + math.cos(math.pi * t))


def _ours(dev, seed):
    model = make_model(pw, device=dev)
    opt = pw.optim.AdamW(_groups(pw, model), lr=3e-3, betas=(0.9, 0.95), max_grad_norm=0.5)
    sched = pw.optim.lr_scheduler.warmup_cosine(opt, 5, STEPS)
    return model, opt, sched


@pytest.mark.parametrize("trainer", [False, True])
def test_user_module_trains_like_pytorch(dev, trainer):
    """20 AdamW steps with clipping, two parameter groups and warm-up + cosine:
    losses within 1e-4 relative of PyTorch's at every step (eager steps, or
    Trainer's captured and replayed steps)."""
    model, opt, sched = _ours(dev, 0)
    tmodel = _torch_twin(model)
    batches = _batches(1)
    want = _torch_losses(tmodel, batches)
    got = []
    if trainer:
        from pywgtrain.train import Trainer

        t = Trainer(model, opt, pw.nn.CrossEntropyLoss(), steps_per_submit=4)
        pending = []
        for x, y in batches:
            pending.append(t.step(x, y))
            sched.step()
        got = [p.item() for p in pending]
        assert t.graph is not None
    else:
        for x, y in batches:
            opt.zero_grad()
            loss = pw.nn.CrossEntropyLoss()(model(x), y)
            loss.backward()
            opt.step()
            sched.step()
            got.append(loss.item())
    for i, (a, b) in enumerate(zip(got, want)):
        assert abs(a - b) <= REL * abs(b), f"step {i}: {a} vs torch {b}"
    assert sched.get_last_lr()[0] == pytest.approx(3e-3 * _warmup_cosine_factor(STEPS))
    for k, v in tmodel.state_dict().items():
        w = model.state_dict()[k]
        assert np.linalg.norm(w - v.numpy()) <= 1e-3 * max(np.linalg.norm(v.numpy()), 1e-3), k


def test_param_groups_state_dict_round_trip(dev):
    model, opt, _ = _ours(dev, 0)
    x, y = _batches(3, 1)[0]
    pw.nn.CrossEntropyLoss()(model(x), y).backward()
    opt.step()
    sd = opt.state_dict()
    assert [g["weight_decay"] for g in sd["param_groups"]] == [0.1, 0.0]
    model2, opt2, _ = _ours(dev, 0)
    opt2.load_state_dict(sd)
    assert opt2.state_dict()["state"].keys() == sd["state"].keys()
    with pytest.raises(ValueError, match="unknown options"):
        pw.optim.AdamW([{"params": model.parameters(), "momentum": 0.9}])
