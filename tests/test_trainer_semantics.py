"""Trainer replays compute what an eager loop computes, whatever changes
between steps: eval()/train(), parameters frozen and unfrozen, learning rate,
weight decay, betas, eps and clipping changed, a module attribute changed,
and a host read inside forward (which ends capturing, with a warning)."""

import re

import numpy as np
import pytest

import pywgtrain as pw
from pywgtrain.train import Trainer

from helpers import eager_step

STEPS = 10


class Net(pw.nn.Module):
    """Linear -> Dropout(0.5) -> Linear; ``read`` makes forward read the host (a logging line)."""

    def __init__(self, dev, read=False):
        super().__init__()
        rng = np.random.default_rng(0)
        self.a = pw.nn.Linear(6, 16, device=dev, rng=rng, activation="relu")
        self.drop = pw.nn.Dropout(0.5)
        self.b = pw.nn.Linear(16, 3, device=dev, rng=rng)
        self.read = read
        self.logged = []

    def forward(self, x):
        h = self.drop(self.a(x))
        if self.read:
            self.logged.append(h.mean().item())
        return self.b(h)


def batches(seed=1):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((8, 6)).astype(np.float32), rng.integers(0, 3, 8)) for _ in range(STEPS)]


def run(dev, changes, trainer, lr=1e-2, read=False, steps_per_submit=1):
    """Losses and final weights of STEPS steps; ``changes[i]``: callables (model, opt) applied before step i."""
    pw.manual_seed(11, dev)
    model = Net(dev, read)
    opt = pw.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, max_grad_norm=1.0)
    loss_fn = pw.nn.CrossEntropyLoss()
    tr = Trainer(model, opt, loss_fn, steps_per_submit=steps_per_submit) if trainer else None
    losses = []
    for i, (x, y) in enumerate(batches()):
        for change in changes.get(i, ()):
            change(model, opt)
        if tr is not None:
            losses.append(tr.step(x, y))
        else:
            losses.append(eager_step(dev, model, opt, loss_fn, x, y))
    return [v.item() for v in losses], model.state_dict(), tr


def assert_same(dev, changes, **kw):
    want, want_sd, _ = run(dev, changes, trainer=False, **kw)
    got, got_sd, tr = run(dev, changes, trainer=True, **kw)
    assert got == want
    for k, v in want_sd.items():
        np.testing.assert_array_equal(got_sd[k], v, err_msg=k)
    return got, tr


def freeze(name, flag=False):
    return lambda m, o: dict(m.named_parameters())[name].requires_grad_(flag)


def group(key, value):
    return lambda m, o: o.param_groups[0].__setitem__(key, value)


def test_eval_after_capture_stops_dropout_in_replays(dev):
    """The issue's case: lr 0, three steps (eager, capture, replay), eval(), a step: no dropout."""
    losses, tr = assert_same(dev, {3: [lambda m, o: m.eval()]}, lr=0.0)
    with pw.no_grad():  # eval forward: deterministic, and lr 0 left the weights as they were
        plain = [pw.nn.CrossEntropyLoss()(tr.model(x), y).item() for x, y in batches()]
    assert losses[3:] == plain[3:]
    assert losses[:3] != plain[:3]  # dropout was on before
    assert tr.graph is not None  # recaptured in eval mode


@pytest.mark.parametrize(
    "changes",
    [
        {3: [lambda m, o: m.eval()], 6: [lambda m, o: m.train()]},
        {2: [lambda m, o: m.drop.eval()], 5: [lambda m, o: m.drop.train()], 7: [lambda m, o: m.eval()]},
        {3: [freeze("a.weight")], 7: [freeze("a.weight", True)]},
        {1: [freeze("b.bias")], 4: [freeze("a.weight"), freeze("b.bias", True)]},
        {3: [group("lr", 3e-2)], 5: [group("weight_decay", 0.0)], 6: [group("betas", (0.5, 0.9))]},
        {4: [group("eps", 1e-3)], 6: [lambda m, o: setattr(o, "max_grad_norm", 0.01)]},
        {4: [lambda m, o: setattr(o, "max_grad_norm", None)]},
        {4: [lambda m, o: setattr(m.drop, "p", 0.2)], 6: [lambda m, o: setattr(m.a, "activation", "gelu")]},
    ],
    ids=[
        "eval-train",
        "submodule-eval",
        "freeze-unfreeze",
        "freeze-two",
        "lr-wd-betas",
        "eps-clip",
        "no-clip",
        "attrs",
    ],
)
def test_trainer_equals_eager_when_state_changes(dev, changes):
    assert_same(dev, changes)
    assert_same(dev, changes, steps_per_submit=3)


def test_frozen_parameter_stays_put_in_replays(dev):
    _, _, tr = run(dev, {}, trainer=True)
    params = dict(tr.model.named_parameters())
    before = {k: p.numpy() for k, p in params.items()}
    params["a.weight"].requires_grad_(False)
    for x, y in batches(2):
        tr.step(x, y)
    assert tr.graph is not None  # replays resumed with the parameter frozen
    np.testing.assert_array_equal(params["a.weight"].numpy(), before["a.weight"])
    for k in ("a.bias", "b.weight", "b.bias"):
        assert not np.array_equal(params[k].numpy(), before[k]), k


def test_host_read_in_forward_runs_eagerly_and_warns(dev):
    want, want_sd, _ = run(dev, {}, trainer=False, read=True)
    with pytest.warns(RuntimeWarning, match=re.escape("test_trainer_semantics.py") + r":\d+ \(.*item\(\)"):
        got, got_sd, tr = run(dev, {}, trainer=True, read=True)
    assert got == want
    for k, v in want_sd.items():
        np.testing.assert_array_equal(got_sd[k], v, err_msg=k)
    assert tr.capture is False and tr._graph is None
    assert len(tr.model.logged) == STEPS  # every step ran the forward (no replays)


def test_freeze_and_hyperparameter_changes_match_torch(dev):
    """Eager semantics are torch's: AdamW skips a parameter without a gradient (no step, no decay)."""
    torch = pytest.importorskip("torch")
    changes = {
        3: [freeze("a.weight")],
        5: [group("lr", 2e-2), group("weight_decay", 0.3)],
        7: [freeze("a.weight", True)],
    }

    got, _, _ = run(dev, changes, trainer=True)
    model = Net(dev)
    tm = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    with torch.no_grad():
        for t, (_, p) in zip(tm.parameters(), model.named_parameters()):
            t.copy_(torch.from_numpy(p.numpy()))
    opt = torch.optim.AdamW(tm.parameters(), lr=1e-2, weight_decay=0.1)
    names = dict(zip(["a.weight", "a.bias", "b.weight", "b.bias"], tm.parameters()))
    for i, (x, y) in enumerate(batches()):
        if i == 3:
            names["a.weight"].requires_grad_(False)
        if i == 5:
            opt.param_groups[0].update(lr=2e-2, weight_decay=0.3)
        if i == 7:
            names["a.weight"].requires_grad_(True)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(tm.eval()(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in tm.parameters() if p.grad is not None], 1.0)
        opt.step()
    # Ours ran with dropout: compare against torch without it by running ours in eval mode.
    ours, ours_sd, _ = run(dev, {0: [lambda m, o: m.eval()], **changes}, trainer=True)
    for k, t in names.items():
        np.testing.assert_allclose(ours_sd[k], t.detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=k)
    assert got != ours  # the dropout run differs from the eval one: both really ran


# -- every loss alike: a loss checks its own host target (check_target) -----------------------
class _RecordingLoss(pw.nn.Module):
    """A loss of the user's own (no pywgtrain loss base) with a check_target of its own."""

    def __init__(self):
        super().__init__()
        self.calls = []
        self.refuse = False

    def check_target(self, target, input_shape=None, name="target"):
        self.calls.append(input_shape)
        if self.refuse:
            raise ValueError(f"{name} refused by the loss")
        return np.ascontiguousarray(target, np.float32)

    def forward(self, input, target):  # noqa: A002 - torch's names
        return pw.nn.functional.mse_loss(input, target)


def test_trainer_asks_any_loss_to_check_its_target_before_anything_changes(dev, rng):
    pw.manual_seed(3, dev)
    model = Net(dev)
    loss_fn = _RecordingLoss()
    tr = Trainer(model, pw.optim.AdamW(model.parameters(), lr=1e-2), loss_fn)
    x, y = rng.standard_normal((8, 6)).astype(np.float32), rng.standard_normal((8, 3)).astype(np.float32)
    tr.step(x, y)  # eager: the output shape is unknown before the forward, known after it
    assert loss_fn.calls == [None, (8, 3)]
    for _ in range(2):  # capture, replay: checked against the known output shape before anything runs
        tr.step(x, y)
    assert loss_fn.calls == [None, (8, 3)] + [None, (8, 3)] * 2
    assert tr.graph is not None
    loss_fn.refuse = True
    before = {k: p.numpy() for k, p in model.named_parameters()}
    for step_x in (x, x[:5]):  # the replay path, and an eager step of a new shape
        with pytest.raises(ValueError, match="y refused by the loss"):
            tr.step(step_x, y[: len(step_x)])
    assert tr.step_count == 3
    for k, p in model.named_parameters():
        np.testing.assert_array_equal(p.numpy(), before[k], err_msg=k)
        assert p.grad is not None, k  # the refused steps left the gradients too


def test_trainer_takes_ignore_index_labels_as_the_loss_does(dev):
    """CrossEntropyLoss checks its labels against the logits' width and its ignore_index,
    so the Trainer takes what the loss takes, and computes what an eager loop computes."""
    data = [(x, np.where(np.arange(8) % 3 == 0, 7, y)) for x, y in batches()]  # 7: ignored rows
    results = []
    for trainer in (False, True):
        pw.manual_seed(11, dev)
        model = Net(dev)
        opt = pw.optim.AdamW(model.parameters(), lr=1e-2)
        loss_fn = pw.nn.CrossEntropyLoss(ignore_index=7)
        tr = Trainer(model, opt, loss_fn) if trainer else None
        losses = [tr.step(x, y) if tr else eager_step(dev, model, opt, loss_fn, x, y) for x, y in data[:4]]
        results.append(([v.item() for v in losses], model.state_dict()))
        if tr is not None:
            bad = data[0][1].copy()
            bad[1] = 8
            with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\) or equal ignore_index=7, got range"):
                tr.step(data[0][0], bad)
    (want, want_sd), (got, got_sd) = results
    assert got == want and all(np.isfinite(want))
    for k, v in want_sd.items():
        np.testing.assert_array_equal(got_sd[k], v, err_msg=k)


def test_trainer_with_class_weights_and_label_smoothing(dev):
    """A loss written out of several ops (class weights gathered per row, label smoothing) is
    captured and replayed by Trainer with the eager loop's losses and weights."""
    data = [(x, np.where(np.arange(8) % 3 == 0, -100, y)) for x, y in batches()]
    results = []
    for trainer in (False, True):
        pw.manual_seed(11, dev)
        model = Net(dev)
        opt = pw.optim.AdamW(model.parameters(), lr=1e-2)
        loss_fn = pw.nn.CrossEntropyLoss(pw.tensor(np.array([0.5, 1.0, 2.0], np.float32), dev), label_smoothing=0.1)
        tr = Trainer(model, opt, loss_fn) if trainer else None
        losses = [tr.step(x, y) if tr else eager_step(dev, model, opt, loss_fn, x, y) for x, y in data[:4]]
        results.append(([v.item() for v in losses], model.state_dict()))
    (want, want_sd), (got, got_sd) = results
    assert got == want and all(np.isfinite(want))
    for k, v in want_sd.items():
        np.testing.assert_array_equal(got_sd[k], v, err_msg=k)


def test_every_loss_module_checks_its_target(dev, rng):
    """Every loss class in pywgtrain.nn has check_target; the default is a host batch's check."""
    losses = [getattr(pw.nn, n) for n in dir(pw.nn) if n.endswith("Loss")]
    assert {c.__name__ for c in losses} >= {"CrossEntropyLoss", "NLLLoss", "MSELoss"}
    for cls in losses:
        assert callable(getattr(cls(), "check_target", None)), cls
    mse = pw.nn.MSELoss()
    with pytest.raises(TypeError, match=r"target must have dtype float32 \(or hold integer ids\), got float64"):
        mse.check_target(rng.standard_normal(4))
    target = rng.standard_normal(4).astype(np.float32)
    np.testing.assert_array_equal(mse.check_target(target, (4,)), target)
    ce = pw.nn.CrossEntropyLoss()
    np.testing.assert_array_equal(ce.check_target(np.array([0, 2, -100], np.int64), (3, 3)), [0, 2, -100])
    assert ce.check_target(np.array([0, 9]), None).dtype == np.int32  # width unknown: dtype only
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\) or equal ignore_index=-100, got range \[0, 3\]"):
        ce.check_target(np.array([0, 3]), (2, 3))
    with pytest.raises(TypeError, match="labels must be integers, got dtype float64"):
        pw.nn.NLLLoss().check_target(np.zeros(2), (2, 3))


def test_trainer_checkpoints_an_sgd_optimizer(dev, tmp_path):
    """Trainer.save / load with optim.SGD's momentum buffers (not AdamW's moments): a run resumed
    from a checkpoint ends where the uninterrupted one does."""
    data = batches()

    def make():
        pw.manual_seed(11, dev)
        model = Net(dev)
        opt = pw.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
        return model, Trainer(model, opt, pw.nn.CrossEntropyLoss())

    model, tr = make()
    for x, y in data[:3]:
        tr.step(x, y)
    path = str(tmp_path / "sgd.safetensors")
    tr.save(path)
    for x, y in data[3:6]:
        tr.step(x, y)
    model2, tr2 = make()
    tr2.load(path)
    for x, y in data[3:6]:
        tr2.step(x, y)
    for (k, v), (_, w) in zip(model.state_dict().items(), model2.state_dict().items()):
        np.testing.assert_array_equal(v, w, err_msg=k)
