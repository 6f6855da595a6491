"""Float16 weight shadows: a fused AdamW writes each parameter's float16 copy in the update's
dispatch and autocast reads it instead of casting (tensor.HalfShadow). The copy equals a cast
of the master bit for bit after every step, a run with shadows gives the cast path's losses
and parameters bit for bit, a parameter written any other way is never served stale (eager,
captured, replayed), a skipped GradScaler step leaves the copy alone, and the steady-state
captured step records no cast of a parameter."""

import numpy as np
import pytest

import pywgtrain as pw
from helpers import backward_and_step, rand
from pywgtrain import _core
from pywgtrain.amp import GradScaler
from pywgtrain.models import GPT, GPTConfig
from pywgtrain.train import Trainer
from test_gpt import CFG
from test_optim import numpy_adamw

F16 = np.dtype(np.float16)
AWKWARD = [(1,), (7,), (33,), (129,), (7, 33), (5, 13)]


def bits(a):
    return np.asarray(a, F16).view(np.uint16)


def copy_of(p):
    """The shadow's copy of p as it is (it must be current: reading never casts then)."""
    sh = p.half_shadow
    assert sh is not None and sh.current()
    with p.device._recording() as rec:
        return sh.read(rec).numpy()


def shadows_off(params):
    """The cast path: parameters without shadows (autocast casts them, AdamW writes no twin)."""
    for p in params:
        p.untyped_storage().half_shadow = None


def read_all(dev, rng, params):
    """Autocast reads every parameter once (weights of a linear, or its bias for 1-D ones): the
    first read makes the twin and casts the parameter into it."""
    with pw.autocast():
        for p in params:
            if p.ndim == 2:
                pw.linear(pw.tensor(rand(rng, 3, p.shape[1]), dev), p)
            else:
                pw.linear(pw.tensor(rand(rng, 3, 2), dev), pw.tensor(rand(rng, p.shape[0], 2), dev), p)
    assert all(p.half_shadow.current() for p in params)


def _set_grads(dev, opt, grads, scale=1.0):
    opt.zero_grad()
    total = None
    for p, g in zip(opt.params, grads):
        term = (p * pw.tensor(g * scale, dev)).sum()
        total = term if total is None else total + term
    total.backward()


@pytest.mark.parametrize("n", [1, 7, 33, 129, 1000, 4097])
@pytest.mark.parametrize("clipped", [False, True])
@pytest.mark.parametrize("capturable", [False, True])
def test_adamw_half_kernel_matches_numpy(dev, rng, n, clipped, capturable):
    """The _half entries against float64 AdamW, the copy equal to the new float32 parameters
    rounded to float16 bit for bit (poisoned first; an odd count's last word keeps its high half)."""
    p = rand(rng, n)
    tp, tm, tv = pw.tensor(p, dev), pw.zeros(n, device=dev), pw.zeros(n, device=dev)
    rp, rm, rv = p.astype(np.float64), np.zeros(n), np.zeros(n)
    words = (n + 1) // 2 + 1  # a word past the copy, poisoned: it must stay as it was
    half = pw.tensor(np.full(2 * words, np.nan, F16), dev)
    steps = pw.zeros((1, _core.ADAM_SLOT_WORDS), dtype=np.int32, device=dev)
    lrs, no_inf = pw.tensor(np.array([3e-2], np.float32), dev), pw.zeros((1,), device=dev)
    clip = pw.tensor(np.array([2.0, 0.5], np.float32), dev) if clipped else None
    for step in range(1, 5):
        g = rand(rng, n)
        with dev.batch() as rec:
            cb = None if clip is None else clip._buf
            if capturable:
                _core.adamw_prepare(rec, steps._buf, 0, 1, no_inf._buf, 0.8, 0.99, 1e-6, 0.1, lrs._buf, 0)
                _core.adamw_device(
                    rec, tp._buf, pw.tensor(g, dev)._buf, tm._buf, tv._buf, n, 0.8, 0.99, 1e-6, 0.1,
                    steps._buf, 0, no_inf._buf, cb, half._buf,
                )  # fmt: skip
            else:
                _core.adamw(
                    rec, tp._buf, pw.tensor(g, dev)._buf, tm._buf, tv._buf, n, 3e-2, 0.8, 0.99, 1e-6, 0.1, step,
                    cb, half._buf,
                )  # fmt: skip
        rp, rm, rv = numpy_adamw(rp, g * (0.5 if clipped else 1.0), rm, rv, step, 3e-2, (0.8, 0.99), 1e-6, 0.1)
        got = tp.numpy()
        np.testing.assert_allclose(got, rp, rtol=1e-5, atol=1e-6 * max(1.0, float(np.abs(p).max())))
        copy = half.numpy()
        np.testing.assert_array_equal(bits(copy[:n]), bits(got.astype(F16)))
        assert np.isnan(copy[n:]).all()  # an odd count's neighbour and the word past it: untouched


def test_adamw_half_refuses_a_short_copy(dev):
    p, g, m, v = (pw.zeros(8, device=dev) for _ in range(4))
    half = pw.zeros(4, dtype=np.float16, device=dev)
    with pytest.raises(ValueError, match="float16 copy"):
        with dev.batch() as rec:
            _core.adamw(rec, p._buf, g._buf, m._buf, v._buf, 8, 1e-3, 0.9, 0.999, 1e-8, 0.0, 1, None, half._buf)


@pytest.mark.parametrize("capturable", [False, True])
def test_copy_equals_the_cast_master_after_every_step(dev, rng, capturable):
    """Awkward parameter sizes (odd spans), the whole twin poisoned after the first read: every
    step's kernel writes each copy, equal to master.astype(float16) bit for bit."""
    params = [pw.tensor(rand(rng, *s), dev, requires_grad=True) for s in AWKWARD]
    opt = pw.optim.AdamW(params, lr=3e-2, weight_decay=0.1, capturable=capturable, max_grad_norm=5.0)
    assert all(p.half_shadow is not None and not p.half_shadow.current() for p in params)
    read_all(dev, rng, params)
    for p in params:
        np.testing.assert_array_equal(bits(copy_of(p)), bits(p.numpy().astype(F16)))
    twin = opt._arena.span("param_half", 0, len(params))
    twin.copy_(np.full(twin.shape, np.nan, F16))
    for _ in range(4):
        _set_grads(dev, opt, [rand(rng, *s) for s in AWKWARD])
        opt.step()
        for p in params:
            np.testing.assert_array_equal(bits(copy_of(p)), bits(p.numpy().astype(F16)))


def _gpt_run(dev, seed, data, shadows, capturable=False, scaler=None, edit=None):
    model = GPT(GPTConfig(**CFG), device=dev, seed=seed)
    opt = pw.optim.AdamW(list(model.parameters()), lr=3e-3, max_grad_norm=1.0, capturable=capturable)
    if not shadows:
        shadows_off(list(model.parameters()))
    losses = []
    for i, d in enumerate(data):
        if edit is not None:
            edit(i, model)
        opt.zero_grad()
        with pw.autocast():
            loss = GPT.loss(model(np.ascontiguousarray(d[:, :-1])), np.ascontiguousarray(d[:, 1:]))
        backward_and_step(loss, opt, scaler)
        losses.append(loss.item())
    return losses, [p.numpy() for p in list(model.parameters())], model


@pytest.mark.parametrize("capturable", [False, True])
def test_training_with_shadows_equals_the_cast_path_bit_for_bit(dev, rng, capturable):
    seed = int(rng.integers(1 << 30))
    data = rng.integers(0, CFG["vocab_size"], (5, 3, 13)).astype(np.int32)
    scaler = (lambda: GradScaler(init_scale=2.0**10)) if capturable else (lambda: None)
    got, got_params, model = _gpt_run(dev, seed, data, True, capturable, scaler())
    want, want_params, _ = _gpt_run(dev, seed, data, False, capturable, scaler())
    assert got == want
    for a, b in zip(got_params, want_params):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    assert any(p.half_shadow.reads for p in list(model.parameters()))  # the shadows were used


def _edit_in_place(i, model):
    """Between steps, write parameters the ways a user can: an in-place op, copy_, a module's
    load_state_dict."""
    with pw.no_grad():
        if i == 2:
            model.transformer["h"][0].attn.c_attn.weight.mul_(0.5)
        elif i == 3:
            w = model.lm_head.weight
            w.copy_(w.numpy()[::-1].copy())
        elif i == 4:
            sd = model.state_dict()
            model.load_state_dict({k: np.asarray(v) * np.float32(0.9) for k, v in sd.items()})


def test_a_parameter_written_between_steps_is_never_served_stale(dev, rng):
    """In-place ops, copy_ and load_state_dict between steps: losses and parameters equal those
    of the cast path under the same edits, and every copy matches its master afterwards."""
    seed = int(rng.integers(1 << 30))
    data = rng.integers(0, CFG["vocab_size"], (6, 3, 13)).astype(np.int32)
    got, got_params, model = _gpt_run(dev, seed, data, True, edit=_edit_in_place)
    want, want_params, _ = _gpt_run(dev, seed, data, False, edit=_edit_in_place)
    assert got == want
    for a, b in zip(got_params, want_params):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    for p in list(model.parameters()):
        if p.half_shadow.current():
            np.testing.assert_array_equal(bits(copy_of(p)), bits(p.numpy().astype(F16)))


def test_a_stale_copy_is_refreshed_by_the_read(dev, rng):
    w = pw.nn.Parameter(pw.tensor(rand(rng, 33, 7), dev))
    opt = pw.optim.AdamW([w], lr=1e-2)
    x = pw.tensor(rand(rng, 5, 7), dev)
    with pw.autocast():
        pw.linear(x, w).sum().backward()
    opt.step()
    assert w.half_shadow.current()
    with pw.no_grad():
        w[3].fill_(7.0)  # through a view: the storage's version moves
    assert not w.half_shadow.current()
    with pw.autocast():
        y = pw.linear(x, w)
    assert w.half_shadow.current()
    np.testing.assert_array_equal(bits(copy_of(w)), bits(w.numpy().astype(F16)))
    want = x.numpy().astype(F16).astype(np.float64) @ w.numpy().astype(F16).astype(np.float64).T
    np.testing.assert_allclose(y.numpy().astype(np.float64), want, rtol=2e-3, atol=2e-3)


def test_a_backward_that_saved_the_old_copy_refuses(dev, rng):
    """The copy is rewritten in place by a refresh: a graph that saved it raises, as for any
    in-place write of a saved tensor, instead of computing with the new values."""
    w = pw.nn.Parameter(pw.tensor(rand(rng, 6, 8), dev))
    pw.optim.AdamW([w])
    x = pw.tensor(rand(rng, 4, 8), dev, requires_grad=True)
    with pw.autocast():
        y = pw.linear(x, w)
    with pw.no_grad():
        w.mul_(2.0)
    with pw.autocast():
        pw.linear(x, w)  # refreshes the copy y's backward reads
    with pytest.raises(RuntimeError, match="in-?place"):
        y.sum().backward()


def test_a_skipped_step_leaves_the_copy_unchanged(dev, rng):
    params = [pw.tensor(rand(rng, *s), dev, requires_grad=True) for s in AWKWARD]
    opt = pw.optim.AdamW(params, lr=3e-2, capturable=True)
    scaler = GradScaler(init_scale=4.0)
    read_all(dev, rng, params)
    scaler.scale(pw.tensor(np.ones(1, np.float32), dev))  # the scale exists on the device
    for bad in (False, True, False):
        before = [(p.numpy(), copy_of(p)) for p in params]
        grads = [rand(rng, *s) for s in AWKWARD]
        if bad:
            grads[2][5] = np.inf
        _set_grads(dev, opt, grads, scale=4.0)
        scaler.step(opt)
        scaler.update()
        for p, (master, copy) in zip(params, before):
            now = copy_of(p)
            np.testing.assert_array_equal(bits(now), bits(p.numpy().astype(F16)))
            if bad:
                np.testing.assert_array_equal(p.numpy().view(np.uint32), master.view(np.uint32))
                np.testing.assert_array_equal(bits(now), bits(copy))


def _trainer_run(dev, seed, data, shadows, edit=None):
    model = GPT(GPTConfig(**CFG), device=dev, seed=seed)
    opt = pw.optim.AdamW(list(model.parameters()), lr=3e-3, max_grad_norm=1.0, capturable=True)
    if not shadows:
        shadows_off(list(model.parameters()))
    trainer = Trainer(model, opt, GPT.loss, autocast=True, scaler=GradScaler(init_scale=2.0**10))
    losses = []
    for i, d in enumerate(data):
        if edit is not None:
            edit(i, model)
        losses.append(trainer.step(np.ascontiguousarray(d[:, :-1]), np.ascontiguousarray(d[:, 1:])).item())
    return losses, trainer


def _casts(graph):
    return sum(name.startswith("cast:f32_to_f16") for name in graph.kernel_names())


def test_trainer_replays_read_the_copy_and_record_no_parameter_cast(dev, rng):
    """Trainer(autocast, GradScaler, capturable AdamW): captured steps give the eager cast
    path's losses, also with parameters written between replays (each replay refreshes what
    changed); the captured step casts no parameter."""
    seed = int(rng.integers(1 << 30))
    data = rng.integers(0, CFG["vocab_size"], (7, 2, 13)).astype(np.int32)
    got, trainer = _trainer_run(dev, seed, data, True, edit=_edit_in_place)
    want, _, _ = _gpt_run(dev, seed, data, False, True, GradScaler(init_scale=2.0**10), edit=_edit_in_place)
    np.testing.assert_array_equal(got, want)
    _, cast_trainer = _trainer_run(dev, seed, data[:3], False)
    read = [p for p in list(trainer.model.parameters()) if p.half_shadow.reads]
    assert read and _casts(trainer.graph) == _casts(cast_trainer.graph) - len(read)
    assert len(trainer.graph) == len(cast_trainer.graph) - len(read)


def test_a_captured_step_that_writes_the_masters_keeps_the_copies_honest(dev, rng):
    """A pw.graph holding forward, backward and a capturable AdamW step: replays write master
    and copy; a parameter written between replays is refreshed first. Replays give an eager
    loop's losses, and afterwards autocast (eager) reads current copies."""
    seed = int(rng.integers(1 << 30))
    data = rng.integers(0, CFG["vocab_size"], (6, 2, 13)).astype(np.int32)
    model = GPT(GPTConfig(**CFG), device=dev, seed=seed)
    opt = pw.optim.AdamW(list(model.parameters()), lr=3e-3, max_grad_norm=1.0, capturable=True)
    x = pw.tensor(np.ascontiguousarray(data[0, :, :-1]), dev)
    y = pw.tensor(np.ascontiguousarray(data[0, :, 1:]), dev)

    def step():
        opt.zero_grad()
        with pw.autocast():
            loss = GPT.loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    got = [step().item()]  # eager: the shadows are made
    g = pw.Graph()
    with pw.graph(g):
        out = step()
    got.append(out.item())
    for i, d in enumerate(data[2:], start=2):
        _edit_in_place(i, model)
        x.copy_(np.ascontiguousarray(d[:, :-1]))
        y.copy_(np.ascontiguousarray(d[:, 1:]))
        g.replay()
        got.append(out.item())
    read = [p for p in list(model.parameters()) if p.half_shadow.reads]  # embeddings: never
    assert len(read) >= 4 * CFG["n_layer"]
    for p in read:
        np.testing.assert_array_equal(bits(copy_of(p)), bits(p.numpy().astype(F16)))
    want, _, _ = _gpt_run(dev, seed, [data[0], data[0], *data[2:]], False, True, edit=_edit_in_place)
    np.testing.assert_array_equal(got, want)


def test_a_replay_that_writes_a_master_retires_its_copy(dev, rng):
    """A graph that writes a parameter but not its copy (an in-place op captured): after each
    replay the host moves the parameter's version, so the next autocast read casts afresh."""
    w = pw.nn.Parameter(pw.tensor(rand(rng, 9, 7), dev))
    pw.optim.AdamW([w])
    x = pw.tensor(rand(rng, 3, 7), dev)
    read_all(dev, rng, [w])
    g = pw.Graph()
    with pw.graph(g), pw.no_grad():
        w.mul_(0.5)
    for _ in range(2):
        with pw.autocast():
            pw.linear(x, w)  # the copy matches the master again
        g.replay()
        assert not w.half_shadow.current()
        with pw.autocast():
            y = pw.linear(x, w)
        np.testing.assert_array_equal(bits(copy_of(w)), bits(w.numpy().astype(F16)))
        want = x.numpy().astype(F16).astype(np.float64) @ w.numpy().astype(F16).astype(np.float64).T
        np.testing.assert_allclose(y.numpy().astype(np.float64), want, rtol=2e-3, atol=2e-3)


def test_no_reference_cycle_outlives_the_optimizer_or_the_parameter(dev, rng):
    """Shadows refer to the storage and the arena weakly: dropping the optimizer frees its arena
    and dropping the parameter frees its shadow, without the cycle collector; a shadow outlives
    its optimizer (copies made after have memory of their own)."""
    import gc
    import weakref

    x = pw.tensor(rand(rng, 3, 7), dev)
    gc.disable()
    try:
        w, v = (pw.nn.Parameter(pw.tensor(rand(rng, 5, 7), dev)) for _ in range(2))
        opt = pw.optim.AdamW([w, v])
        read_all(dev, rng, [w])
        arena, shadow = weakref.ref(opt._arena), weakref.ref(w.half_shadow)
        del opt
        assert arena() is None
        for p in (w, v):  # w's copy lives in the old twin, v's is made now
            with pw.no_grad():
                p.mul_(0.5)
            with pw.autocast():
                pw.linear(x, p)
            np.testing.assert_array_equal(bits(copy_of(p)), bits(p.numpy().astype(F16)))
        del w
        assert shadow() is None
    finally:
        gc.enable()
