"""Decoding with a captured step: the decode kernels (kv_cache_attention,
next_token) against float64 NumPy, and GPT.generate's captured path against
its eager path (tokens, logits, seeded sampling, context restarts)."""

import numpy as np
import pytest

import pywgtrain as pw
from pywgtrain import functions as F
from pywgtrain.models.gpt import GPT, GPTConfig, _forward_cached, _KVCache
from helpers import assert_close, rand


def _attention_reference(qkv, kc, vc, pos, h, scale):
    """float64: out [B, 1, C] over cache rows 0..pos with row pos replaced by the new k, v."""
    b, _, c3 = qkv.shape
    c = c3 // 3
    d = c // h
    q, k, v = (qkv[:, 0, i * c : (i + 1) * c].astype(np.float64).reshape(b, h, d) for i in range(3))
    keys = kc.astype(np.float64).reshape(b, h, -1, d)[:, :, : pos + 1].copy()
    vals = vc.astype(np.float64).reshape(b, h, -1, d)[:, :, : pos + 1].copy()
    keys[:, :, pos], vals[:, :, pos] = k, v
    s = np.einsum("bhd,bhjd->bhj", q, keys) * scale
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhj,bhjd->bhd", p, vals).reshape(b, 1, c)


@pytest.mark.parametrize(
    "b,h,d,cap,pos",
    [
        (1, 1, 1, 1, 0),
        (1, 2, 7, 8, 6),
        (3, 2, 33, 40, 32),
        (2, 3, 64, 129, 128),
        (1, 2, 128, 300, 257),
        (2, 1, 96, 7, 3),
    ],
)
def test_kv_cache_attention_matches_numpy(dev, rng, b, h, d, cap, pos):
    c = h * d
    qkv = rand(rng, b, 1, 3 * c)
    kc = rand(rng, b * h, cap, d)
    vc = rand(rng, b * h, cap, d)
    kc[:, pos + 1 :] = np.nan  # rows past pos are never read
    vc[:, pos + 1 :] = np.nan
    tk, tv = pw.tensor(kc, dev), pw.tensor(vc, dev)
    tpos = pw.tensor(np.array([[pos]], np.int32), dev)
    with pw.no_grad():
        out = F.kv_cache_attention(pw.tensor(qkv, dev), tk, tv, tpos, h)
    assert_close(out.numpy(), _attention_reference(qkv, kc, vc, pos, h, 1.0 / np.sqrt(d)))
    k_new = qkv[:, 0, c : 2 * c].reshape(b * h, d)
    v_new = qkv[:, 0, 2 * c :].reshape(b * h, d)
    kc[:, pos], vc[:, pos] = k_new, v_new
    np.testing.assert_array_equal(tk.numpy(), kc)  # row pos written, every other row as it was
    np.testing.assert_array_equal(tv.numpy(), vc)
    assert tpos.numpy().item() == pos  # read, not moved


def test_kv_cache_attention_scale_and_errors(dev, rng):
    qkv = rand(rng, 1, 1, 12)
    kc, vc = rand(rng, 2, 5, 2), rand(rng, 2, 5, 2)
    tk, tv = pw.tensor(kc, dev), pw.tensor(vc, dev)
    pos = pw.tensor(np.array([2], np.int32), dev)
    with pw.no_grad():
        out = F.kv_cache_attention(pw.tensor(qkv, dev), tk, tv, pos, 2, scale=0.3)
        assert_close(out.numpy(), _attention_reference(qkv, kc, vc, 2, 2, 0.3))
        before = tk.numpy()
        with pytest.raises(ValueError, match="k_cache must have shape"):
            F.kv_cache_attention(pw.tensor(qkv, dev), pw.tensor(rand(rng, 2, 5, 3), dev), tv, pos, 2)
        with pytest.raises(TypeError, match="pos must be int32"):
            F.kv_cache_attention(pw.tensor(qkv, dev), tk, tv, pw.tensor(np.zeros(1, np.float32), dev), 2)
        with pytest.raises(ValueError, match=r"qkv must be \[batch, 1, 3 \* C\]"):
            F.kv_cache_attention(pw.tensor(rand(rng, 1, 2, 12), dev), tk, tv, pos, 2)
        with pytest.raises(ValueError, match="capacity 3000 outside"):
            big = pw.zeros((2, 3000, 2), device=dev)
            F.kv_cache_attention(pw.tensor(qkv, dev), big, big, pos, 2)
        np.testing.assert_array_equal(tk.numpy(), before)  # nothing ran
    w = pw.tensor(qkv, dev, requires_grad=True)
    with pytest.raises(RuntimeError, match="no backward"):
        F.kv_cache_attention(w, tk, tv, pos, 2)


@pytest.mark.parametrize("b,v", [(1, 1), (1, 7), (3, 257), (2, 1000), (1, 50304)])
def test_next_token_matches_numpy(dev, rng, b, v):
    logits = rand(rng, b, v)
    if v > 2:  # ties: the first of equal maxima wins
        logits[:, v - 1] = logits[:, 1] = logits.max() + 1.0
    length, pos = 9, 4
    tok = pw.tensor(np.full((b, 1), -7, np.int32), dev)
    hist0 = np.full((b, length), -1, np.int32)
    hist = pw.tensor(hist0, dev)
    tpos = pw.tensor(np.array([[pos]], np.int32), dev)
    F.next_token(pw.tensor(logits, dev).reshape(b, 1, v), tok, hist, tpos)
    ids = logits.astype(np.float64).argmax(-1)
    np.testing.assert_array_equal(tok.numpy()[:, 0], ids)
    hist0[:, pos + 1] = ids
    np.testing.assert_array_equal(hist.numpy(), hist0)
    assert tpos.numpy().item() == pos + 1


def test_next_token_nan_history_end_and_errors(dev, rng):
    logits = rand(rng, 2, 33)
    logits[1, 20] = logits[1, 5] = np.nan  # NaN counts as the largest, the first one wins (numpy.argmax)
    tok = pw.zeros((2,), np.int32, dev)
    hist = pw.tensor(np.full((2, 3), -1, np.int32), dev)
    pos = pw.tensor(np.array([2], np.int32), dev)  # column 3 is past the history: skipped
    F.next_token(pw.tensor(logits, dev), tok, hist, pos)
    np.testing.assert_array_equal(tok.numpy(), np.argmax(logits, -1))
    np.testing.assert_array_equal(hist.numpy(), np.full((2, 3), -1))
    assert pos.numpy().item() == 3
    with pytest.raises(ValueError, match=r"tok must have shape \(2,\) or \(2, 1\)"):
        F.next_token(pw.tensor(logits, dev), pw.zeros((3,), np.int32, dev), hist, pos)
    with pytest.raises(TypeError, match="hist must be int32"):
        F.next_token(pw.tensor(logits, dev), tok, pw.zeros((2, 3), device=dev), pos)
    assert pos.numpy().item() == 3


def _model(dev, block, seed=0, **kw):
    cfg = GPTConfig(vocab_size=kw.pop("vocab", 61), block_size=block, n_layer=2, n_head=2, n_embd=kw.pop("c", 28), **kw)
    return GPT(cfg, device=dev, seed=seed)


@pytest.mark.parametrize("b,t,n", [(1, 1, 20), (1, 7, 9), (2, 33, 12), (3, 39, 30), (1, 40, 5), (2, 55, 3)])
def test_generate_captured_equals_eager(dev, rng, b, t, n):
    """Greedy tokens of the captured step equal the eager path's: prompts of 1, 7,
    33 tokens, near and at the capacity (40), longer (cropped), runs past the
    context (restarts from the last half)."""
    model = _model(dev, 40)
    ids = rng.integers(0, 61, (b, t))
    captured = model.generate(ids, n, temperature=0.0)
    assert model._decode_step(b).graph is not None
    np.testing.assert_array_equal(captured, model.generate(ids, n, temperature=0.0, capture=False))


def test_generate_captured_replays_one_graph(dev, rng):
    model = _model(dev, 16, seed=1)
    ids = rng.integers(0, 61, (2, 5))
    first = model.generate(ids, 30, temperature=0.0)
    step = model._decode_step(2)
    g = step.graph
    assert g is not None
    entries = {name.split(";")[0] for name in g.kernel_names()}
    assert {"attention:attn_decode", "embedding:next_token"} <= entries
    np.testing.assert_array_equal(model.generate(ids, 30, temperature=0.0), first)
    assert model._decode_step(2).graph is g  # captured once, replayed by the second call
    model.generate(ids[:1], 3, temperature=0.0)  # another batch size: a new step
    assert model._decode_step(1).graph is not g


@pytest.mark.parametrize("b,t", [(1, 1), (3, 7), (2, 33), (1, 38)])
def test_captured_step_logits_match_eager(dev, rng, b, t):
    """The captured step's logits at positions t .. (up to the last cache row 39)
    against the eager cached forward fed the same tokens."""
    model = _model(dev, 40, c=36)
    model.eval()
    ids = rng.integers(0, 61, (b, t)).astype(np.int32)
    with pw.no_grad():
        step = model._decode_step(b)
        step.prefill(ids, True)
        cache = _KVCache(model, b)
        _forward_cached(model, ids, cache)
        for p in range(t, min(t + 6, 40)):
            fed = step.tok.numpy()
            step.run()
            assert step.pos.numpy().item() == p + 1
            ref = _forward_cached(model, fed, cache).numpy()
            assert_close(step.logits.numpy(), ref, rtol=1e-4, atol_scale=1e-4)
            np.testing.assert_array_equal(step.tok.numpy()[:, 0], ref[:, -1].argmax(-1))
            np.testing.assert_array_equal(step.hist.numpy()[:, p + 1], ref[:, -1].argmax(-1))


def test_generate_captured_sampling_matches_eager(dev, rng):
    model = _model(dev, 12, seed=2)
    ids = rng.integers(0, 61, (2, 3))
    a = model.generate(ids, 25, temperature=0.8, top_k=7, seed=5)
    np.testing.assert_array_equal(a, model.generate(ids, 25, temperature=0.8, top_k=7, seed=5, capture=False))


def test_generate_falls_back_to_eager(dev, rng, monkeypatch):
    model = _model(dev, 16)
    with dev.batch():  # a capture is a batch of its own
        assert model._decode_step(1) is None
    assert model._decode_step(1) is not None
    limits = dict(dev.limits, max_storage_buffer_binding_size=2 * 16 * 28 * 4 - 4)  # a cache of batch 2 > 1 binding
    with monkeypatch.context() as m:
        m.setattr(type(dev), "limits", property(lambda self: limits))
        assert model._decode_step(2) is None
        assert model._decode_step(1) is not None
    monkeypatch.setattr(F, "DECODE_MAX_CAPACITY", 8)
    assert model._decode_step(1) is None
    ids = rng.integers(0, 61, (1, 4))
    np.testing.assert_array_equal(
        model.generate(ids, 6, temperature=0.0), model.generate(ids, 6, temperature=0.0, capture=False)
    )


def test_generate_follows_trained_and_moved_parameters(dev, rng):
    """A step of AdamW (which moves the parameters into its arena and changes
    them) between two calls: the second call decodes with the new weights."""
    model = _model(dev, 16, seed=3)
    ids = rng.integers(0, 61, (1, 4))
    before = model.generate(ids, 8, temperature=0.0)
    opt = pw.optim.AdamW(model.parameters(), lr=0.05)
    x = rng.integers(0, 61, (2, 16))
    loss = model.loss(model(x), np.roll(x, -1, 1))
    loss.backward()
    opt.step()
    after = model.generate(ids, 8, temperature=0.0)
    np.testing.assert_array_equal(after, model.generate(ids, 8, temperature=0.0, capture=False))
    assert not np.array_equal(after, before)
