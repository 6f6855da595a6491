"""GradScaler (pywgtrain.amp) against torch.amp.GradScaler, and capturable AdamW."""

import json

import numpy as np
import pytest
import torch

import pywgtrain as pw
from helpers import assert_close, backward_and_step, rand
from pywgtrain.amp import GradScaler
from pywgtrain.train import Trainer

SIZES = [6, 33, 7, 3]  # an MLP of awkward widths


def _models(dev, seed, capturable=True, fused=True, lr=1e-2, **opt_kw):
    """A pywgtrain MLP with its AdamW, and torch's copy with torch's AdamW."""
    model = pw.nn.MLP(SIZES, device=dev, seed=seed)
    layers = []
    for i, (a, b) in enumerate(zip(SIZES, SIZES[1:])):
        lin = torch.nn.Linear(a, b)
        lin.weight.data = torch.from_numpy(model[i].weight.numpy().copy())
        lin.bias.data = torch.from_numpy(model[i].bias.numpy().copy())
        layers += [lin, torch.nn.ReLU()]
    tmodel = torch.nn.Sequential(*layers[:-1])
    opt = pw.optim.AdamW(model.parameters(), lr=lr, capturable=capturable, fused=fused, **opt_kw)
    topt = torch.optim.AdamW(tmodel.parameters(), lr=lr)
    return model, opt, tmodel, topt


def _assert_params_equal(model, tmodel, rtol=1e-5, lr=1e-2):
    """Within rtol, plus 1% of one AdamW update (lr): an element whose gradients nearly cancel
    across steps has a normalized update m / sqrt(v) whose relative error float32 rounding of the
    gradients can make large, though never beyond the update's size."""
    for p, q in zip(model.parameters(), tmodel.parameters()):
        want = q.detach().double().numpy()
        np.testing.assert_allclose(p.numpy(), want, rtol=rtol, atol=max(rtol * np.abs(want).max(), 0.01 * lr))


def _poison(grad, kind):
    """One element of a gradient set to inf or NaN (a forced overflow)."""
    value = np.inf if kind == "inf" else np.nan
    if isinstance(grad, torch.Tensor):
        grad.view(-1)[3] = value
    else:
        g = grad.numpy()
        g.reshape(-1)[3] = value
        grad.copy_(g)


# steps (0-based) whose gradients overflow: a single one, three in a row (backoff
# after backoff), a NaN; growth_interval 3 makes the clean runs in between grow it.
OVERFLOWS = {2: "inf", 9: "inf", 10: "inf", 11: "nan", 20: "nan"}


@pytest.mark.parametrize("capturable", [True, False])
@pytest.mark.parametrize("fused", [True, False])
def test_scaler_sequence_matches_torch(dev, rng, capturable, fused):
    """30 steps with forced overflows: the same steps skipped, the same scale after
    each, parameters equal to torch's."""
    model, opt, tmodel, topt = _models(dev, 3, capturable, fused)
    scaler = GradScaler(init_scale=2.0**10, growth_interval=3)
    tscaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
    loss_fn, tloss_fn = pw.nn.CrossEntropyLoss(), torch.nn.CrossEntropyLoss()
    skipped, tskipped = [], []
    for step in range(30):
        x, y = rand(rng, 9, SIZES[0]), rng.integers(0, SIZES[-1], 9)
        opt.zero_grad()
        topt.zero_grad()
        scaler.scale(loss_fn(model(x), y)).backward()
        tscaler.scale(tloss_fn(tmodel(torch.from_numpy(x)), torch.from_numpy(y))).backward()
        if step in OVERFLOWS:
            _poison(model[0].weight.grad, OVERFLOWS[step])
            _poison(tmodel[0].weight.grad, OVERFLOWS[step])
        before = model[2].bias.numpy()
        scaler.step(opt)
        tstep_before = topt.state[tmodel[0].weight]["step"].item() if topt.state else 0
        tscaler.step(topt)
        scaler.update()
        tscaler.update()
        skipped.append(bool(np.array_equal(before, model[2].bias.numpy())))
        tskipped.append(topt.state[tmodel[0].weight]["step"].item() == tstep_before if topt.state else True)
        assert scaler.get_scale() == tscaler.get_scale(), step
    assert skipped == tskipped
    assert [i for i, s in enumerate(skipped) if s] == sorted(OVERFLOWS)
    assert scaler.state_dict() == tscaler.state_dict()
    steps = {st["step"] for st in opt.state_dict()["state"].values()}
    assert steps == {30 - len(OVERFLOWS)} == {int(s["step"]) for s in topt.state.values()}
    _assert_params_equal(model, tmodel)


def test_scale_is_differentiable_and_grads_come_out_scaled(dev, rng):
    x = pw.tensor(rand(rng, 5, 3), dev, requires_grad=True)
    scaler = GradScaler(init_scale=3.0)
    loss = (x * x).sum()
    scaled = scaler.scale(loss)
    assert scaled.shape == loss.shape
    assert scaled.item() == pytest.approx(3.0 * loss.item(), rel=1e-6)
    scaled.backward()
    assert_close(x.grad.numpy(), 6.0 * x.numpy().astype(np.float64))
    pair = scaler.scale([loss, (loss,)])
    assert isinstance(pair, list) and isinstance(pair[1], tuple)
    assert pair[1][0].item() == pytest.approx(3.0 * loss.item(), rel=1e-6)


@pytest.mark.parametrize("kind", ["clean", "inf"])
def test_unscale_then_clip_matches_torch(dev, rng, kind):
    """clip_grad_norm_ after unscale_ sees unscaled gradients; when a gradient is
    non-finite the NaN the clip writes does not reach the skipped step."""
    model, opt, tmodel, topt = _models(dev, 5)
    scaler, tscaler = GradScaler(init_scale=256.0), torch.amp.GradScaler("cpu", init_scale=256.0)
    for step in range(3):
        x, y = rand(rng, 9, SIZES[0]), rng.integers(0, SIZES[-1], 9)
        opt.zero_grad()
        topt.zero_grad()
        scaler.scale(pw.nn.CrossEntropyLoss()(model(x), y)).backward()
        tscaler.scale(torch.nn.CrossEntropyLoss()(tmodel(torch.from_numpy(x)), torch.from_numpy(y))).backward()
        if kind == "inf" and step == 1:
            _poison(model[0].weight.grad, "inf")
            _poison(tmodel[0].weight.grad, "inf")
        scaler.unscale_(opt)
        tscaler.unscale_(topt)
        if kind == "clean":
            for p, q in zip(model.parameters(), tmodel.parameters()):
                assert_close(p.grad.numpy(), q.grad.double().numpy())
        norm = pw.clip_grad_norm_(model.parameters(), 0.05)
        tnorm = torch.nn.utils.clip_grad_norm_(tmodel.parameters(), 0.05).item()
        if np.isfinite(tnorm):
            assert norm == pytest.approx(tnorm, rel=1e-5)
        else:
            assert not np.isfinite(norm)
        scaler.step(opt)
        tscaler.step(topt)
        scaler.update()
        tscaler.update()
        _assert_params_equal(model, tmodel)
    assert scaler.get_scale() == tscaler.get_scale()


def test_fused_clip_with_a_nonfinite_norm_leaves_the_skipped_step_alone(dev, rng):
    """AdamW(max_grad_norm=...) computes a NaN clip coefficient from an inf gradient;
    the skipped step reads none of it."""
    model, opt, _, _ = _models(dev, 6, max_grad_norm=0.1)
    scaler = GradScaler()
    scaler.scale(pw.nn.CrossEntropyLoss()(model(rand(rng, 4, SIZES[0])), rng.integers(0, 3, 4))).backward()
    _poison(model[0].weight.grad, "inf")
    before = [p.numpy() for p in model.parameters()]
    scaler.step(opt)
    scaler.update()
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.numpy(), b)
    assert scaler.get_scale() == 2.0**15
    assert not np.isfinite(opt.last_grad_norm())


def test_scaler_errors_like_torch(dev, rng):
    model, opt, _, _ = _models(dev, 7)
    scaler = GradScaler()
    with pytest.raises(RuntimeError, match="did not use scaler.scale"):
        scaler.step(opt)
    with pytest.raises(RuntimeError, match="did not use scaler.scale"):
        scaler.unscale_(opt)
    scaler.scale(pw.nn.CrossEntropyLoss()(model(rand(rng, 4, SIZES[0])), rng.integers(0, 3, 4))).backward()
    with pytest.raises(RuntimeError, match="No inf checks were recorded"):
        scaler.update()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called on this optimizer"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="after step"):
        scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(opt)
    with pytest.raises(RuntimeError, match="Closure"):
        scaler.step(opt, closure=lambda: None)
    scaler.update()
    scaler.unscale_(opt)  # a new iteration
    for kwargs, match in (
        (dict(growth_factor=1.0), "growth_factor must be > 1.0"),
        (dict(backoff_factor=1.0), "backoff_factor"),
        (dict(init_scale=float("inf")), "scale must be a finite number"),
        (dict(growth_interval=0), "growth_interval"),
        (dict(growth_interval=1.5), "growth_interval"),
    ):
        with pytest.raises(ValueError, match=match):
            GradScaler(**kwargs)
    with pytest.raises(ValueError, match="new_scale"):
        scaler.update(float("nan"))
    with pytest.raises(ValueError, match="capturable"):
        pw.optim.AdamW(model.parameters(), capturable=False).step(found_inf=pw.zeros((1,), device=dev))
    before = opt.state_dict()
    with pytest.raises(ValueError, match="found_inf must be a float32 tensor of shape \\(1,\\)"):
        opt.step(found_inf=pw.zeros((2,), device=dev))
    opt.param_groups[0]["lr"] = -1.0
    with pytest.raises(ValueError, match="learning rate"):
        opt.step()
    opt.param_groups[0]["lr"] = before["param_groups"][0]["lr"]
    after = opt.state_dict()
    assert after["state"][0]["step"] == before["state"][0]["step"]
    np.testing.assert_array_equal(after["state"][0]["exp_avg"], before["state"][0]["exp_avg"])


def test_update_with_new_scale(dev, rng):
    model, opt, _, _ = _models(dev, 8)
    scaler = GradScaler(init_scale=8.0)
    scaler.scale(pw.nn.CrossEntropyLoss()(model(rand(rng, 4, SIZES[0])), rng.integers(0, 3, 4))).backward()
    scaler.step(opt)
    scaler.update(5.0)
    assert scaler.get_scale() == 5.0


def test_disabled_scaler_passes_through(dev, rng):
    model, opt, tmodel, topt = _models(dev, 9, capturable=False)
    scaler = GradScaler(enabled=False)
    assert not scaler.is_enabled() and scaler.get_scale() == 1.0 and scaler.state_dict() == {}
    loss = pw.nn.CrossEntropyLoss()(model(rand(rng, 4, SIZES[0])), rng.integers(0, 3, 4))
    assert scaler.scale(loss) is loss
    loss.backward()
    grads = [p.grad.numpy() for p in model.parameters()]
    scaler.unscale_(opt)
    for p, g in zip(model.parameters(), grads):
        np.testing.assert_array_equal(p.grad.numpy(), g)
    scaler.step(opt)
    scaler.update()
    assert all(st["step"] == 1 for st in opt.state_dict()["state"].values())
    scaler.load_state_dict({})  # ignored, as torch does


def test_scaler_state_dict_round_trip(dev, rng):
    model, opt, _, _ = _models(dev, 10)
    scaler = GradScaler(init_scale=2.0**8, growth_interval=5)
    for _ in range(3):
        opt.zero_grad()
        scaler.scale(pw.nn.CrossEntropyLoss()(model(rand(rng, 4, SIZES[0])), rng.integers(0, 3, 4))).backward()
        scaler.step(opt)
        scaler.update()
    sd = scaler.state_dict()
    tsd = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=5).state_dict()
    assert sd.keys() == tsd.keys()
    assert sd == dict(scale=256.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=5, _growth_tracker=3)
    other = GradScaler()
    other.load_state_dict(sd)
    assert other.state_dict() == sd
    scaler.load_state_dict(dict(sd, scale=16.0, _growth_tracker=1))  # into a live device state
    assert scaler.get_scale() == 16.0 and scaler._get_growth_tracker() == 1
    with pytest.raises(RuntimeError, match="state dict is empty"):
        other.load_state_dict({})
    for bad, match in (
        (dict(sd, scale=-1.0), "scale must be > 0"),
        (dict(sd, _growth_tracker=5), "must be < growth_interval"),
        (dict(sd, growth_interval=2.5), "growth_interval must be an int"),
        ({k: v for k, v in sd.items() if k != "scale"}, "expected the keys"),
    ):
        with pytest.raises(ValueError, match=match):
            other.load_state_dict(bad)
    assert other.state_dict() == sd  # unchanged by the rejected ones


@pytest.mark.parametrize("fused", [True, False])
def test_capturable_adamw_matches_torch_with_groups(dev, rng, fused):
    """Step counts and bias corrections on the GPU: torch's updates, per group lr
    changed between steps, and a parameter that sits a step out."""
    model = pw.nn.MLP(SIZES, device=dev, seed=11)
    tmodel = _models(dev, 11)[2]
    params, tparams = model.parameters(), list(tmodel.parameters())
    groups = [dict(params=params[:2], lr=3e-2), dict(params=params[2:], weight_decay=0.0)]
    tgroups = [dict(params=tparams[:2], lr=3e-2), dict(params=tparams[2:], weight_decay=0.0)]
    opt = pw.optim.AdamW(groups, lr=1e-2, capturable=True, fused=fused)
    topt = torch.optim.AdamW(tgroups, lr=1e-2)
    for step in range(6):
        x, y = rand(rng, 9, SIZES[0]), rng.integers(0, SIZES[-1], 9)
        opt.zero_grad()
        topt.zero_grad()
        pw.nn.CrossEntropyLoss()(model(x), y).backward()
        torch.nn.CrossEntropyLoss()(tmodel(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        if step == 2:
            model[1].bias.grad = None
            tmodel[2].bias.grad = None
        opt.param_groups[1]["lr"] = topt.param_groups[1]["lr"] = 1e-2 * (step + 1)
        opt.step()
        topt.step()
    _assert_params_equal(model, tmodel)
    steps = [opt.state_dict()["state"][i]["step"] for i in range(len(params))]
    assert steps == [int(topt.state[p]["step"]) for p in tparams] == [6, 6, 6, 5, 6, 6]


def _captured_run(dev, rng, steps, capture, scaler=None):
    """`steps` training steps with a LambdaLR changing lr every step: eager, or
    forward + backward + optimizer step (+ scaler) captured after one eager step."""
    model = pw.nn.MLP(SIZES, device=dev, seed=12)
    opt = pw.optim.AdamW(model.parameters(), lr=1e-2, capturable=True)
    sched = pw.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    data = [(rand(rng, 9, SIZES[0]), rng.integers(0, SIZES[-1], 9).astype(np.int32)) for _ in range(steps)]
    x, y = pw.tensor(data[0][0], dev), pw.tensor(data[0][1], dev)

    def step():
        opt.zero_grad()
        loss = pw.nn.CrossEntropyLoss()(model(x), y)
        backward_and_step(loss, opt, scaler)

    step()
    sched.step()
    g = pw.Graph()
    for xs, ys in data[1:]:
        x.copy_(xs)
        y.copy_(ys)
        if not capture:
            step()
        elif len(g) == 0:
            with pw.graph(g, dev):
                step()
        else:
            g.replay()
        sched.step()
    return model, opt


def test_captured_step_with_scheduler_equals_eager(dev, rng):
    """forward, backward and a capturable AdamW step captured once and replayed with a
    LambdaLR changing lr every step == the same steps run eagerly."""
    seed = rng.integers(1 << 30)
    eager, eopt = _captured_run(dev, np.random.default_rng(seed), 7, capture=False)
    captured, copt = _captured_run(dev, np.random.default_rng(seed), 7, capture=True)
    for p, q in zip(captured.parameters(), eager.parameters()):
        assert_close(p.numpy(), q.numpy().astype(np.float64), rtol=1e-6, atol_scale=1e-6)
    assert copt.state_dict()["state"][0]["step"] == eopt.state_dict()["state"][0]["step"] == 7


def test_captured_step_with_scaler_equals_eager(dev, rng):
    """The scaler's scale, unscale_, skip and update inside the captured step (no readback):
    growth after every clean step, as eagerly."""
    seed = rng.integers(1 << 30)
    results = []
    for capture in (False, True):
        scaler = GradScaler(init_scale=2.0**4, growth_interval=2)
        model, opt = _captured_run(dev, np.random.default_rng(seed), 7, capture=capture, scaler=scaler)
        results.append((model, scaler.state_dict()))
    (eager, esd), (captured, csd) = results
    assert esd == csd and esd["scale"] == 2.0**7
    for p, q in zip(captured.parameters(), eager.parameters()):
        assert_close(p.numpy(), q.numpy().astype(np.float64), rtol=1e-6, atol_scale=1e-6)


def test_capturable_state_dict_round_trip(dev, rng):
    """Loaded step counts restart the GPU's bias corrections where torch's are."""
    model, opt, tmodel, topt = _models(dev, 13)

    def run(n):
        for _ in range(n):
            x, y = rand(rng, 9, SIZES[0]), rng.integers(0, SIZES[-1], 9)
            opt.zero_grad()
            topt.zero_grad()
            pw.nn.CrossEntropyLoss()(model(x), y).backward()
            torch.nn.CrossEntropyLoss()(tmodel(torch.from_numpy(x)), torch.from_numpy(y)).backward()
            opt.step()
            topt.step()

    run(3)
    sd = opt.state_dict()
    fresh = pw.optim.AdamW(model.parameters(), lr=1e-2, capturable=True)
    fresh.load_state_dict(sd)
    opt = fresh
    run(3)
    _assert_params_equal(model, tmodel)
    assert opt.state_dict()["state"][0]["step"] == 6


def _trainer_run(dev, capture, batches, path=None):
    model = pw.nn.MLP(SIZES, device=dev, seed=14)
    opt = pw.optim.AdamW(model.parameters(), lr=1e-2, capturable=True)
    scaler = GradScaler(init_scale=2.0**6, growth_interval=2)
    trainer = Trainer(model, opt, pw.nn.CrossEntropyLoss(), capture=capture, scaler=scaler)
    losses = [trainer.step(x, y) for x, y in batches]
    if path is not None:
        trainer.save(path)
    return trainer, [float(v.item()) for v in losses]


def test_trainer_with_scaler_captured_equals_eager(dev, rng, tmp_path):
    """Trainer(scaler=...) replays scale + backward and steps with the scaler without a
    readback; an overflowing batch (inf input) is skipped on the GPU, as eagerly."""
    batches = [(rand(rng, 9, SIZES[0]), rng.integers(0, SIZES[-1], 9)) for _ in range(8)]
    batches[5][0][2, 1] = np.inf
    eager, eager_losses = _trainer_run(dev, False, batches)
    captured, captured_losses = _trainer_run(dev, True, batches, tmp_path / "ck.safetensors")
    assert captured.graph is not None and eager.graph is None
    assert any(n.startswith("elementwise") for n in captured.graph.kernel_names())
    np.testing.assert_array_equal(captured_losses, eager_losses)
    assert not np.isfinite(eager_losses[5])
    for p, q in zip(captured.model.parameters(), eager.model.parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy())
    sd = eager.scaler.state_dict()
    assert captured.scaler.state_dict() == sd
    # 8 steps, one skipped: the scale doubled after steps 1-2, 3-4, backed off at 5, doubled after 6-7
    assert sd["scale"] == 2.0**6 * 2 * 2 / 2 * 2 and sd["_growth_tracker"] == 0
    assert {st["step"] for st in captured.optimizer.state_dict()["state"].values()} == {7}

    resumed, _ = _trainer_run(dev, True, [])
    resumed.load(tmp_path / "ck.safetensors")
    assert resumed.scaler.state_dict() == sd
    assert {st["step"] for st in resumed.optimizer.state_dict()["state"].values()} == {7}
    bad = tmp_path / "bad.safetensors"
    meta = json.loads(pw.serialization.read_safetensors(tmp_path / "ck.safetensors")[1]["pywgtrain"])
    tensors = pw.serialization.read_safetensors(tmp_path / "ck.safetensors")[0]
    meta["scaler"]["backoff_factor"] = 2.0
    with open(bad, "wb") as f:
        pw.serialization.write_safetensors(f, tensors, {"pywgtrain": json.dumps(meta)})
    with pytest.raises(ValueError, match="bad.safetensors: GradScaler: backoff_factor"):
        resumed.load(bad)
    assert resumed.scaler.state_dict() == sd  # unchanged
    other = pw.nn.MLP(SIZES, device=dev, seed=16)
    plain = Trainer(other, pw.optim.AdamW(other.parameters()), pw.nn.CrossEntropyLoss())
    plain.load(tmp_path / "ck.safetensors")  # a Trainer without a scaler ignores its state
    for p, q in zip(other.parameters(), captured.model.parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy())


def test_trainer_scaler_needs_a_capturable_optimizer(dev):
    model = pw.nn.MLP(SIZES, device=dev, seed=15)
    with pytest.raises(ValueError, match="capturable=True"):
        Trainer(model, pw.optim.AdamW(model.parameters()), pw.nn.CrossEntropyLoss(), scaler=GradScaler())
    with pytest.raises(TypeError, match="GradScaler"):
        Trainer(model, pw.optim.AdamW(model.parameters()), pw.nn.CrossEntropyLoss(), scaler=object())


def test_scaler_step_without_gradients_and_two_steps_in_one_capture(dev, rng):
    """No gradient at all: nothing to unscale or update but the tracker (torch's
    behaviour); a capture holding two optimizer steps would replay one lr for both: refused."""
    model, opt, _, _ = _models(dev, 17)
    scaler = GradScaler(growth_interval=2)
    scaler.scale(pw.nn.CrossEntropyLoss()(model(rand(rng, 4, SIZES[0])), rng.integers(0, 3, 4)))
    before = [p.numpy() for p in model.parameters()]
    scaler.step(opt)
    scaler.update()
    assert scaler.state_dict()["_growth_tracker"] == 1
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.numpy(), b)
    pw.nn.CrossEntropyLoss()(model(rand(rng, 4, SIZES[0])), rng.integers(0, 3, 4)).backward()
    opt.step()  # creates the moments eagerly
    g = pw.Graph()
    with pytest.raises(RuntimeError, match="fed twice in one capture"):
        with pw.graph(g, dev):
            opt.step()
            opt.step()
    assert len(g) == 0


AWKWARD = [(1,), (7,), (33,), (129,), (5, 13)]


def _set_grads(dev, opt, grads):
    """Gradients equal to `grads` through a backward pass (so a fused optimizer's land in its arena)."""
    opt.zero_grad()
    total = None
    for p, g in zip(opt.params, grads):
        term = (p * pw.tensor(g, dev)).sum()
        total = term if total is None else total + term
    total.backward()
    if opt._arena is not None:
        assert opt._arena.holds(opt.params)


@pytest.mark.parametrize("fused", [True, False])
def test_capturable_adamw_kernel_matches_numpy(dev, rng, fused):
    """adamw_prepare + adamw_device over awkward sizes against float64 AdamW, moments
    included (assert_close rejects non-finite values: every element written)."""
    from test_optim import numpy_adamw

    params = [pw.tensor(rand(rng, *s), dev, requires_grad=True) for s in AWKWARD]
    ref = [(p.numpy().astype(np.float64), np.zeros(p.shape), np.zeros(p.shape)) for p in params]
    opt = pw.optim.AdamW(params, lr=3e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1, capturable=True, fused=fused)
    for step in range(1, 6):
        grads = [rand(rng, *s) for s in AWKWARD]
        _set_grads(dev, opt, grads)
        opt.step()
        ref = [numpy_adamw(r[0], g, r[1], r[2], step, 3e-2, (0.8, 0.99), 1e-6, 0.1) for r, g in zip(ref, grads)]
    for i, (p, (rp, rm, rv)) in enumerate(zip(params, ref)):
        st = opt.state[i]
        for got, want in ((p, rp), (st["exp_avg"], rm), (st["exp_avg_sq"], rv)):
            assert_close(got.numpy(), want, rtol=1e-5, atol_scale=1e-5, magnitude=max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("fused", [True, False])
def test_unscale_kernel_over_awkward_sizes(dev, rng, fused):
    """g * (1/scale) element for element (scale 3: not a power of two), and the flag set by one
    non-finite element anywhere, whichever tensor holds it."""
    params = [pw.tensor(rand(rng, *s), dev, requires_grad=True) for s in AWKWARD]
    opt = pw.optim.AdamW(params, capturable=True, fused=fused)
    scaler = GradScaler(init_scale=3.0)
    scaler.scale(pw.tensor(np.ones(1, np.float32), dev))  # the scale exists on the device
    for bad in (None, 0, 3, 4):
        grads = [rand(rng, *s) * 100 for s in AWKWARD]
        if bad is not None:
            grads[bad].reshape(-1)[rng.integers(grads[bad].size)] = np.nan if bad % 2 else -np.inf
        _set_grads(dev, opt, grads)
        scaler.unscale_(opt)
        assert float(scaler._found[id(opt)].numpy()[0]) == (0.0 if bad is None else 1.0)
        for p, g in zip(params, grads):
            want = g.astype(np.float64) * np.float32(1 / 3)
            np.testing.assert_allclose(p.grad.numpy(), want, rtol=1e-6, atol=0)
        scaler.update(3.0)  # a new iteration, same scale
