import math

import numpy as np
import pytest

import pywgtrain as pw
from helpers import assert_close, rand


def numpy_adamw(p, g, m, v, step, lr, betas, eps, wd):
    """torch.optim.AdamW (amsgrad=False) in float64."""
    p, g, m, v = (x.astype(np.float64) for x in (p, g, m, v))
    b1, b2 = betas
    p = p * (1 - lr * wd)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    bc1, bc2 = 1 - b1**step, 1 - b2**step
    p = p - (lr / bc1) * m / (np.sqrt(v) / math.sqrt(bc2) + eps)
    return p, m, v


@pytest.mark.parametrize("n", [1, 7, 33, 129, 1000, 4097, 65 * 1031])
@pytest.mark.parametrize(
    "hp", [dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, wd=1e-2), dict(lr=3e-2, betas=(0.8, 0.99), eps=1e-6, wd=0.0)]
)
def test_adamw_matches_numpy_over_steps(dev, rng, n, hp):
    p = rand(rng, n)
    tp, tm, tv = pw.tensor(p, dev), pw.zeros(n, device=dev), pw.zeros(n, device=dev)
    rp, rm, rv = p.astype(np.float64), np.zeros(n), np.zeros(n)
    for step in range(1, 8):
        g = rand(rng, n)
        pw.adamw_step(
            tp, pw.tensor(g, dev), tm, tv, step, lr=hp["lr"], betas=hp["betas"], eps=hp["eps"], weight_decay=hp["wd"]
        )
        rp, rm, rv = numpy_adamw(rp, g, rm, rv, step, hp["lr"], hp["betas"], hp["eps"], hp["wd"])
    # A value that lands near 0 (n = 1) is the difference of float32 values of
    # the inputs' magnitude (~1): its error scales with that, not with the result.
    for got, want in ((tm, rm), (tv, rv), (tp, rp)):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6 * max(1.0, float(np.abs(p).max())))


def test_adamw_numpy_arrays_updated_in_place(rng):
    p, g = rand(rng, 50), rand(rng, 50)
    m, v = np.zeros(50, np.float32), np.zeros(50, np.float32)
    rp, rm, rv = numpy_adamw(p, g, m, v, 1, 1e-2, (0.9, 0.999), 1e-8, 0.1)
    pw.adamw_step(p, g, m, v, 1, lr=1e-2, weight_decay=0.1)
    assert_close(p, rp)
    assert_close(m, rm)
    assert_close(v, rv)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(lr=-1.0), "Invalid learning rate"),
        (dict(betas=(1.0, 0.999)), "beta parameter at index 0"),
        (dict(betas=(0.9, -0.1)), "beta parameter at index 1"),
        (dict(eps=0.0), "Invalid epsilon"),
        (dict(weight_decay=-1e-2), "weight_decay"),
    ],
)
def test_adamw_rejects_bad_hyperparameters(dev, kwargs, match):
    t = pw.zeros(4, device=dev)
    with pytest.raises(ValueError, match=match):
        pw.adamw_step(t, t.clone(), t.clone(), t.clone(), 1, **kwargs)
    with pytest.raises(ValueError, match=match):
        pw.optim.AdamW([pw.nn.Linear(2, 2, device=dev).weight], **kwargs)


def test_adamw_rejects_aliased_buffers(dev):
    t = pw.zeros(4, device=dev)
    with pytest.raises(ValueError, match="four distinct buffers"):
        pw.adamw_step(t, t, pw.zeros(4, device=dev), pw.zeros(4, device=dev), 1)


def test_adamw_step_count_must_be_positive(dev):
    t = pw.zeros(4, device=dev)
    with pytest.raises(ValueError, match="step must be >= 1"):
        pw.adamw_step(t, t.clone(), t.clone(), t.clone(), 0)


def ref_clip(grads, max_norm):
    norm = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads))
    coef = min(max_norm / (norm + 1e-6), 1.0)
    return norm, [g.astype(np.float64) * coef for g in grads]


@pytest.mark.parametrize("sizes", [[1], [7, 33, 129], [1000, 1, 4097, 65 * 1031]])
@pytest.mark.parametrize("regime", ["above", "below"])
def test_clip_grad_norm_several_buffers(dev, rng, sizes, regime):
    grads = [rand(rng, n) for n in sizes]
    norm = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads))
    max_norm = norm / 3 if regime == "above" else norm * 2
    tg = [pw.tensor(g, dev) for g in grads]
    got = pw.clip_grad_norm_(tg, max_norm)
    want_norm, want = ref_clip(grads, max_norm)
    assert got == pytest.approx(want_norm, rel=1e-5)
    for t, w in zip(tg, want):
        assert_close(t.numpy(), w)
    if regime == "below":  # untouched bit for bit
        for t, g in zip(tg, grads):
            np.testing.assert_array_equal(t.numpy(), g)


def test_clip_numpy_arrays_in_place(rng):
    g = [rand(rng, 100), rand(rng, 3, 5)]
    want_norm, want = ref_clip(g, 0.5)
    assert pw.clip_grad_norm_(g, 0.5) == pytest.approx(want_norm, rel=1e-5)
    for a, w in zip(g, want):
        assert_close(a, w)


def test_clip_nonfinite(dev, rng):
    g = rand(rng, 64)
    g[5] = np.inf
    t = pw.tensor(g, dev)
    assert not math.isfinite(pw.clip_grad_norm_([t], 1.0))
    with pytest.raises(RuntimeError, match="non-finite"):
        pw.clip_grad_norm_([pw.tensor(g, dev)], 1.0, error_if_nonfinite=True)
    g[5] = np.nan
    assert math.isnan(pw.clip_grad_norm_([pw.tensor(g, dev)], 1.0))


def test_clip_rejects_bad_arguments(dev):
    t = pw.zeros(3, device=dev)
    with pytest.raises(ValueError, match="norm_type"):
        pw.clip_grad_norm_([t], 1.0, norm_type=1.0)
    with pytest.raises(ValueError, match="max_norm"):
        pw.clip_grad_norm_([t], -1.0)


def test_adamw_and_clip_past_binding_limit(dev, rng):
    """Vectors longer than one storage binding are processed piecewise on the GPU."""
    limit = dev.limits["max_storage_buffer_binding_size"]
    n = limit // 4 + 1000
    if n * 4 * 5 > 2**31:
        pytest.skip("binding limit too large to exceed in a test on this adapter")
    g = rand(rng, n)
    p = rand(rng, n)
    tp, tg = pw.tensor(p, dev), pw.tensor(g, dev)
    tm, tv = pw.zeros(n, device=dev), pw.zeros(n, device=dev)
    pw.adamw_step(tp, tg, tm, tv, 1, lr=1e-2)
    rp, _, _ = numpy_adamw(p, g, np.zeros(n), np.zeros(n), 1, 1e-2, (0.9, 0.999), 1e-8, 1e-2)
    assert_close(tp.numpy(), rp)
    norm = pw.clip_grad_norm_([tg], 1.0)
    want_norm, want = ref_clip([g], 1.0)
    assert norm == pytest.approx(want_norm, rel=1e-4)
    assert_close(tg.numpy(), want[0])


def _mlp_run(dev, rng_seed, fused, steps, max_grad_norm, skip_bias_grad_at=None):
    model = pw.nn.MLP([12, 24, 4], activation="relu", device=dev, seed=3)
    opt = pw.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, max_grad_norm=max_grad_norm, fused=fused)
    data = np.random.default_rng(rng_seed)
    for s in range(steps):
        opt.zero_grad()
        x = data.standard_normal((9, 12)).astype(np.float32)
        y = data.integers(0, 4, 9)
        pw.nn.CrossEntropyLoss()(model(x), y).backward()
        if s == skip_bias_grad_at:
            model[0].bias.grad = None  # this parameter sits the step out
        opt.step()
    return model, opt


@pytest.mark.parametrize("max_grad_norm", [None, 0.05])
def test_fused_adamw_matches_per_tensor_adamw(dev, max_grad_norm):
    """The flat-arena step (one dispatch) equals tensor-by-tensor updates; without
    clipping bit for bit, with clipping up to the norm's summation order."""
    fused, fopt = _mlp_run(dev, 11, True, 5, max_grad_norm)
    plain, popt = _mlp_run(dev, 11, False, 5, max_grad_norm)
    assert fopt._arena is not None and popt._arena is None
    for (name, p), (_, q) in zip(fused.named_parameters(), plain.named_parameters()):
        if max_grad_norm is None:
            np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=name)
        else:
            assert_close(p.numpy(), q.numpy().astype(np.float64), rtol=1e-5, atol_scale=1e-5)
    if max_grad_norm is not None:
        assert fopt.last_grad_norm() == pytest.approx(popt.last_grad_norm(), rel=1e-6)
    sd_f, sd_p = fopt.state_dict()["state"], popt.state_dict()["state"]
    assert sd_f.keys() == sd_p.keys() and all(sd_f[i]["step"] == 5 for i in sd_f)


def test_fused_adamw_falls_back_when_a_parameter_has_no_grad(dev):
    """A parameter without a gradient is skipped (torch semantics), so that step
    goes tensor by tensor; later steps use the arena again with mixed step counts
    handled per tensor."""
    fused, fopt = _mlp_run(dev, 5, True, 4, 1.0, skip_bias_grad_at=1)
    plain, popt = _mlp_run(dev, 5, False, 4, 1.0, skip_bias_grad_at=1)
    steps = [fopt.state[i]["step"] for i in range(len(fopt.params))]
    assert steps == [4, 3, 4, 4]
    for (_, p), (_, q) in zip(fused.named_parameters(), plain.named_parameters()):
        assert_close(p.numpy(), q.numpy().astype(np.float64), rtol=1e-5, atol_scale=1e-5)


def test_fused_step_has_one_adamw_dispatch(dev, rng):
    """A fused AdamW step with clipping: one norm reduction and one AdamW dispatch (captured to count them)."""
    model = pw.nn.MLP([12, 24, 24, 4], device=dev, seed=1)
    opt = pw.optim.AdamW(model.parameters(), max_grad_norm=1.0)
    pw.nn.CrossEntropyLoss()(model(rand(rng, 8, 12)), rng.integers(0, 4, 8)).backward()
    opt.step()  # the first step creates the moments
    g = pw.Graph()
    with pw.graph(g, dev):
        opt.step()
    names = g.kernel_names()
    assert sum(n.startswith("optim:adamw") for n in names) == 1
    assert (
        sum(
            (n.startswith("reduce:partial_sum;SQUARE=true") or n.startswith("reduce:partial_sum4;SQUARE=true"))
            for n in names
        )
        == 1
    )


def test_parameters_moved_into_the_arena_keep_values_and_identity(dev, rng):
    model = pw.nn.MLP([5, 7, 3], device=dev, seed=2)
    before = {k: v.copy() for k, v in model.state_dict().items()}
    params = model.parameters()
    opt = pw.optim.AdamW(params)
    assert [id(p) for p in model.parameters()] == [id(p) for p in params]
    arena = opt._arena.buffers["param"]
    for name, p in model.named_parameters():
        assert p._buf.shares_memory(arena) and p._buf.offset % dev.limits["min_storage_buffer_offset_alignment"] == 0
        np.testing.assert_array_equal(p.numpy(), before[name], err_msg=name)
    with pytest.raises(ValueError, match="a parameter appears twice"):
        pw.optim.AdamW(params + params[:1])


@pytest.mark.parametrize(
    "fused,capturable,max_grad_norm", [(True, False, None), (False, False, 0.5), (True, True, 0.5)]
)
def test_adam_like_torch(dev, rng, fused, capturable, max_grad_norm):
    """optim.Adam against torch.optim.Adam over 6 steps of fixed gradients: weight_decay an L2
    term added to the gradient (not AdamW's decoupled decay), two parameter groups, clipping by
    the global norm first as clip_grad_norm_ does; a scheduler's lr change is followed."""
    import torch

    shapes = [(7, 5), (33,), (4, 3)]
    init = [rand(rng, *s) for s in shapes]
    grads = [[rand(rng, *s) for s in shapes] for _ in range(6)]
    ps = [pw.nn.Parameter(a, dev) for a in init]
    ts = [torch.tensor(a.astype(np.float64), requires_grad=True) for a in init]
    kw = dict(lr=3e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)
    opt = pw.optim.Adam(
        [{"params": ps[:2]}, {"params": ps[2:], "weight_decay": 0.0}],
        max_grad_norm=max_grad_norm, fused=fused, capturable=capturable, **kw,
    )  # fmt: skip
    topt = torch.optim.Adam([{"params": ts[:2]}, {"params": ts[2:], "weight_decay": 0.0}], **kw)
    for step, gs in enumerate(grads):
        if step == 3:
            for g in opt.param_groups + topt.param_groups:
                g["lr"] *= 0.5
        for p, t, g in zip(ps, ts, gs):
            p.grad = pw.tensor(g, dev)
            t.grad = torch.tensor(g.astype(np.float64))
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(ts, max_grad_norm)
        opt.step()
        topt.step()
    for p, t in zip(ps, ts):
        assert_close(p.numpy(), t.detach().numpy(), rtol=2e-5, atol_scale=2e-5)
    assert opt.state_dict()["param_groups"][0]["weight_decay"] == 0.1


def test_adam_default_has_no_weight_decay(dev):
    opt = pw.optim.Adam([pw.nn.Parameter(np.ones(3, np.float32), dev)])
    assert opt.param_groups[0]["weight_decay"] == 0.0 and opt.param_groups[0]["lr"] == 1e-3


SGD_CASES = [
    dict(momentum=0.0),
    dict(momentum=0.9, weight_decay=0.05),
    dict(momentum=0.9, dampening=0.3),
    dict(momentum=0.8, nesterov=True, weight_decay=0.01),
    dict(momentum=0.5, maximize=True),
]


@pytest.mark.parametrize("kw", SGD_CASES)
def test_sgd_like_torch(dev, rng, kw):
    """optim.SGD against torch.optim.SGD over 5 steps (two groups, the second with its own
    lr; lr halved midway as a scheduler would), then its state_dict: a copy loaded into a fresh
    optimizer continues exactly as the original."""
    import torch

    shapes = [(7, 5), (33,), (4, 3)]
    init = [rand(rng, *s) for s in shapes]
    grads = [[rand(rng, *s) for s in shapes] for _ in range(7)]
    ps = [pw.nn.Parameter(a, dev) for a in init]
    ts = [torch.tensor(a.astype(np.float64), requires_grad=True) for a in init]
    opt = pw.optim.SGD([{"params": ps[:2]}, {"params": ps[2:], "lr": 0.05}], lr=0.1, **kw)
    topt = torch.optim.SGD([{"params": ts[:2]}, {"params": ts[2:], "lr": 0.05}], lr=0.1, **kw)

    def step(opt, params, gs):
        for p, g in zip(params, gs):
            p.grad = pw.tensor(g, dev)
        opt.step()

    for i, gs in enumerate(grads[:5]):
        if i == 3:
            for g in opt.param_groups + topt.param_groups:
                g["lr"] *= 0.5
        step(opt, ps, gs)
        for t, g in zip(ts, gs):
            t.grad = torch.tensor(g.astype(np.float64))
        topt.step()
    for p, t in zip(ps, ts):
        assert_close(p.numpy(), t.detach().numpy(), rtol=1e-5, atol_scale=1e-5)
    sd = opt.state_dict()
    assert (0 in sd["state"]) == (kw["momentum"] > 0)
    twins = [pw.nn.Parameter(p.numpy(), dev) for p in ps]
    twin = pw.optim.SGD([{"params": twins[:2]}, {"params": twins[2:], "lr": 0.05}], lr=0.1, **kw)
    twin.load_state_dict(sd)
    for gs in grads[5:]:
        step(opt, ps, gs)
        step(twin, twins, gs)
    for p, q in zip(ps, twins):
        np.testing.assert_array_equal(p.numpy(), q.numpy())


def test_sgd_rejects_bad_arguments(dev):
    p = [pw.nn.Parameter(np.ones(3, np.float32), dev)]
    with pytest.raises(ValueError, match="lr"):
        pw.optim.SGD(p, lr=-1.0)
    with pytest.raises(ValueError, match="Nesterov"):
        pw.optim.SGD(p, lr=0.1, nesterov=True)
    opt = pw.optim.SGD(p, lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match=r"momentum_buffer has shape \(4,\), expected \(3,\)"):
        opt.load_state_dict(
            {"state": {0: {"momentum_buffer": np.zeros(4)}}, "param_groups": opt.state_dict()["param_groups"]}
        )
    opt.param_groups[0]["lr"] = float("nan")
    p[0].grad = pw.tensor(np.ones(3, np.float32), dev)
    with pytest.raises(ValueError, match="lr must be a finite"):
        opt.step()
    assert np.all(p[0].numpy() == 1.0)


def test_nn_utils_clipping_like_torch(dev, rng):
    """pw.nn.utils.clip_grad_norm_ / clip_grad_value_ under torch.nn.utils' names, on parameters."""
    import torch

    grads = [rand(rng, 5, 3) * 3, rand(rng, 7) * 3]
    grads[1][2] = np.nan
    ps = [pw.nn.Parameter(np.zeros(g.shape, np.float32), dev) for g in grads]
    ts = [torch.zeros(g.shape, dtype=torch.float64, requires_grad=True) for g in grads]
    for p, t, g in zip(ps, ts, grads):
        p.grad = pw.tensor(g, dev)
        t.grad = torch.from_numpy(g.astype(np.float64))
    pw.nn.utils.clip_grad_value_(ps, 0.7)
    torch.nn.utils.clip_grad_value_(ts, 0.7)
    for p, t in zip(ps, ts):
        np.testing.assert_array_equal(np.isnan(p.grad.numpy()), np.isnan(t.grad.numpy()))
        np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=1e-6)
    assert pw.nn.utils.clip_grad_norm_ is pw.clip_grad_norm_
    with pytest.raises(ValueError, match="clip_value"):
        pw.nn.utils.clip_grad_value_(ps, -1.0)
