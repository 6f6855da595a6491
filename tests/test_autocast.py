"""pywgtrain.autocast against torch.autocast(dtype=torch.float16): the dtype each op computes in
(torch's CUDA lists; CPU torch, the twin here, agrees on the ones checked against it), recorded
casts that autograd sees, the parameter cast cache, and a GPT twin's logits and 20 training
steps within 1e-2."""

import threading

import numpy as np
import pytest
import torch

import pywgtrain as pw
from pywgtrain.models import GPT, GPTConfig
from test_gpt import CFG, rel, twin

TF = torch.nn.functional
F16, F32 = np.dtype(np.float16), np.dtype(np.float32)


def rand(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def test_output_dtypes_follow_torch(dev, rng):
    x, w, b = rand(rng, 4, 8), rand(rng, 3, 8), rand(rng, 3)
    q = rand(rng, 1, 2, 5, 4)
    labels = np.array([0, 1, 2, 0], np.int32)
    px, pw_, pb, pq = (pw.tensor(a, dev) for a in (x, w, b, q))
    tx, tw, tb, tq = (torch.from_numpy(a) for a in (x, w, b, q))
    with pw.autocast(), torch.autocast("cpu", dtype=torch.float16):
        py, ty = pw.linear(px, pw_, pb), TF.linear(tx, tw, tb)
        # ops whose dtype CPU torch's lists give as CUDA's
        pairs = {
            "linear": (py, ty),
            "matmul": (px @ px.T, tx @ tx.T),
            "bmm": (pw.bmm(px.reshape(1, 4, 8), px.reshape(1, 4, 8), trans_b=True), torch.bmm(tx[None], tx.T[None])),
            "sdpa": (
                pw.nn.functional.scaled_dot_product_attention(pq, pq, pq, is_causal=True),
                TF.scaled_dot_product_attention(tq, tq, tq, is_causal=True),
            ),
            "cross_entropy": (pw.cross_entropy(py, labels), TF.cross_entropy(ty, torch.from_numpy(labels).long())),
            "mse_loss": (pw.mse_loss(py, py.detach()), TF.mse_loss(ty, ty.detach())),
            "add f16+f32": (py + px[:, :3], ty + tx[:, :3]),
            "gelu": (pw.gelu(py), TF.gelu(ty)),
            "mean": (py.mean(), ty.mean()),
            "embedding": (pw.embedding(labels, pw_), TF.embedding(torch.from_numpy(labels).long(), tw)),
        }
        for name, (got, want) in pairs.items():
            assert got.dtype == np.dtype(str(want.dtype).removeprefix("torch.")), name
        # torch's CUDA autocast runs these in float32 (CPU's f16 lists leave them in the input's dtype)
        for got in (
            pw.layer_norm(py, (3,)),
            pw.softmax(py, -1),
            pw.log_softmax(py, -1),
            py.sum(),
            py.exp(),
            py.log(),
            py.rsqrt(),
            py**2.0,
        ):
            assert got.dtype == F32
        assert (py * 2.0).dtype == F16 and py.max().dtype == F16 and px.mean().dtype == F32


def test_context_decorator_nesting_and_threads(dev, rng):
    x = pw.tensor(rand(rng, 3, 5), dev)
    assert not pw.is_autocast_enabled()
    seen = []

    def other_thread():
        seen.append((pw.is_autocast_enabled(), (x @ x.T).dtype))

    with pw.autocast("webgpu", dtype=np.float16):
        assert pw.is_autocast_enabled() and (x @ x.T).dtype == F16
        with pw.autocast(enabled=False):
            assert not pw.is_autocast_enabled() and (x @ x.T).dtype == F32
        assert (x @ x.T).dtype == F16
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
    assert seen == [(False, F32)]  # per-thread state
    assert not pw.is_autocast_enabled()

    @pw.autocast(dev)
    def forward(a):
        return a @ a.T

    assert forward(x).dtype == F16 and (x @ x.T).dtype == F32
    with pytest.raises(ValueError, match="only dtype float16"):
        pw.autocast(dtype="float32")
    with pytest.raises(ValueError, match="device_type must be 'webgpu'"):
        pw.autocast("cuda")


def test_refuses_a_device_without_shader_f16(dev, monkeypatch):
    monkeypatch.setattr(pw.Device, "features", property(lambda self: ["timestamp-query"]))
    with pytest.raises(RuntimeError, match="needs the adapter feature 'shader-f16'"):
        with pw.autocast(dev):
            pass
    assert not pw.is_autocast_enabled()
    with pw.autocast(dev, enabled=False):  # disabled: nothing to check
        pass


def test_parameter_casts_are_cached_per_region(dev, rng):
    from pywgtrain.functions import _autocast_state

    w = pw.nn.Parameter(pw.tensor(rand(rng, 6, 8), dev))
    x = pw.tensor(rand(rng, 4, 8), dev)
    with pw.autocast():
        a = pw.linear(x, w)
        cast = _autocast_state.cache[id(w)][3]
        b = pw.linear(x, w)
        assert _autocast_state.cache[id(w)][3] is cast and len(_autocast_state.cache) == 1
        with pw.autocast():  # a nested region shares the outermost one's cache
            pw.linear(x, w)
            assert _autocast_state.cache[id(w)][3] is cast
        with pw.no_grad():
            w.mul_(2.0)  # a new version: cast again
        c = pw.linear(x, w)
        assert _autocast_state.cache[id(w)][3] is not cast
    assert not _autocast_state.cache
    (a.sum() + b.sum() + c.sum()).backward()
    assert w.grad.dtype == F32
    expected = 3 * np.broadcast_to(x.numpy().sum(0), (6, 8))  # the gradient reached w through the cached cast
    np.testing.assert_allclose(w.grad.numpy(), expected, rtol=2e-3, atol=2e-3)


def test_gradients_through_autocast_match_torch(dev, rng):
    x, w1, b1, w2, b2 = rand(rng, 33, 7), rand(rng, 129, 7), rand(rng, 129), rand(rng, 5, 129), rand(rng, 5)
    w2 *= 0.1
    labels = rng.integers(0, 5, 33).astype(np.int32)
    ps = [pw.tensor(a, dev, requires_grad=True) for a in (w1, b1, w2, b2)]
    ts = [torch.from_numpy(a).requires_grad_() for a in (w1, b1, w2, b2)]
    with pw.autocast():
        h = pw.layer_norm(pw.linear(pw.tensor(x, dev), ps[0], ps[1], "gelu"), (129,))
        loss = pw.cross_entropy(pw.linear(h, ps[2], ps[3]), labels)
    with torch.autocast("cpu", dtype=torch.float16):
        th = TF.layer_norm(TF.gelu(TF.linear(torch.from_numpy(x), ts[0], ts[1])).float(), (129,))
        tloss = TF.cross_entropy(TF.linear(th, ts[2], ts[3]), torch.from_numpy(labels).long())
    assert loss.dtype == F32 and tloss.dtype == torch.float32
    assert abs(loss.item() - tloss.item()) <= 1e-2 * abs(tloss.item())
    loss.backward()
    tloss.backward()
    for p, t in zip(ps, ts):
        assert p.grad.dtype == F32
        assert rel(p.grad.numpy(), t.grad.numpy()) < 1e-2


def test_a_cast_gradient_is_widened_into_the_parameter_and_accumulates(dev, rng):
    """A parameter's float16 gradient under autocast reaches its float32 .grad (widened exactly,
    no other rounding) and a second backward adds to it, as torch's cast backward does; an
    explicit .half() adds to a gradient already set."""
    x, w = rand(rng, 33, 7), rand(rng, 5, 7)
    p = pw.tensor(w, dev, requires_grad=True)
    with pw.autocast():
        y = pw.linear(pw.tensor(x, dev), p)
    assert y.dtype == np.float16
    y.sum().backward(retain_graph=True)
    first = p.grad.numpy().copy()
    assert p.grad.dtype == F32
    # dW = ones(33, 5)^T @ f16(x), a float16 product: within the GEMM's rounding of float64.
    ref = np.ones((5, 33)) @ x.astype(np.float16).astype(np.float64)
    assert np.allclose(first, ref, rtol=2e-3, atol=2e-3)
    assert np.array_equal(first, first.astype(np.float16).astype(np.float32))  # widened, not re-rounded
    y.sum().backward()
    np.testing.assert_array_equal(p.grad.numpy(), 2 * first)  # f + f is exact in float32
    # An explicit .half() of a parameter with a gradient already there: added to it.
    q = pw.tensor(w, dev, requires_grad=True)
    q.grad = pw.tensor(np.ones((5, 7), np.float32), dev)
    pw.linear(pw.tensor(x.astype(np.float16), dev), q.half()).float().sum().backward()
    np.testing.assert_array_equal(q.grad.numpy(), first + 1)


@pytest.mark.parametrize("attention", ["plain", "fused"])
def test_gpt_under_autocast_matches_torch_twin(dev, rng, attention):
    """Logits within 1e-2 relative; 20 AdamW steps (autocast around forward and loss, as
    torch's recipe) with losses within 1e-2 relative."""
    model = GPT(GPTConfig(**CFG, attention=attention), device=dev, seed=int(rng.integers(1 << 30)))
    tm = twin(model)
    ids = rng.integers(0, CFG["vocab_size"], (3, 24))
    with pw.autocast():
        got = model(ids)
    with torch.autocast("cpu", dtype=torch.float16):
        want = tm(torch.from_numpy(ids))
    assert got.dtype == F16 and want.dtype == torch.float16
    assert rel(got.numpy(), want.detach().float().numpy()) < 1e-2

    opt = pw.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95))
    topt = torch.optim.AdamW(tm.parameters(), lr=3e-3, betas=(0.9, 0.95))
    data = rng.integers(0, CFG["vocab_size"], (20, 4, 25))
    for i, d in enumerate(data):
        opt.zero_grad()
        with pw.autocast():
            loss = GPT.loss(model(d[:, :-1].astype(np.int32)), d[:, 1:].astype(np.int32))
        loss.backward()
        opt.step()
        topt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            logits = tm(torch.from_numpy(d[:, :-1]))
            tloss = TF.cross_entropy(logits.reshape(-1, CFG["vocab_size"]), torch.from_numpy(d[:, 1:]).reshape(-1))
        tloss.backward()
        topt.step()
        assert loss.dtype == F32
        assert abs(loss.item() - tloss.item()) <= 1e-2 * abs(tloss.item()), f"step {i}: {loss.item()} vs {tloss.item()}"


def test_trainer_autocast_replays_what_an_eager_loop_computes(dev, rng):
    """Trainer(autocast=True): captured and replayed steps (casts included) give the eager
    autocast loop's losses."""
    from pywgtrain.train import Trainer

    seed = int(rng.integers(1 << 30))
    data = rng.integers(0, CFG["vocab_size"], (5, 2, 13)).astype(np.int32)
    models = [GPT(GPTConfig(**CFG), device=dev, seed=seed) for _ in range(2)]
    opts = [pw.optim.AdamW(m.parameters(), lr=3e-3) for m in models]
    trainer = Trainer(models[0], opts[0], GPT.loss, autocast=True)
    got = [trainer.step(np.ascontiguousarray(d[:, :-1]), np.ascontiguousarray(d[:, 1:])).item() for d in data]
    assert trainer.graph is not None  # the later steps replayed
    want = []
    for d in data:
        opts[1].zero_grad()
        with pw.autocast():
            loss = GPT.loss(models[1](np.ascontiguousarray(d[:, :-1])), np.ascontiguousarray(d[:, 1:]))
        loss.backward()
        opts[1].step()
        want.append(loss.item())
    np.testing.assert_allclose(got, want, rtol=1e-6)
    with pytest.raises(TypeError, match="autocast must be a bool"):
        Trainer(models[0], opts[0], GPT.loss, autocast="fp16")
