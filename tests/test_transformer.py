"""nn.MultiheadAttention, nn.TransformerEncoderLayer and nn.TransformerEncoder against
torch's, in float64 with the same weights (our state_dict loaded into torch's module):
outputs, attention weights, and the gradients of inputs and parameters; masks in both
forms; state_dict names."""

import numpy as np
import pytest

import pywgtrain as pw

from helpers import rand, same_as_torch, t64

torch = pytest.importorskip("torch")


def torch_twin(ours, theirs):
    """theirs (a torch module) in float64 with ours' weights; same parameter names."""
    state = {k: torch.from_numpy(v.astype(np.float64)) for k, v in ours.state_dict().items()}
    theirs = theirs.double()
    theirs.load_state_dict(state, strict=True)
    return theirs


def compare_grads(ours, theirs, rtol=1e-4, atol=1e-5):
    named = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        same_as_torch(p.grad.numpy(), named[name].grad, rtol, atol)


def torch_mask(mask):
    return None if mask is None else torch.from_numpy(mask if mask.dtype == np.bool_ else mask.astype(np.float64))


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize(
    "case", ["self", "cross", "bool_mask", "float_mask_per_head", "padding", "causal_hint", "unbatched"]
)
@pytest.mark.parametrize("need_weights,average", [(True, True), (True, False), (False, True)])
def test_multihead_attention_like_torch(dev, rng, batch_first, case, need_weights, average):
    e, h, n, lq = 16, 4, 3, 9
    s = 13 if case == "cross" else lq
    ours = pw.nn.MultiheadAttention(e, h, batch_first=batch_first, device=dev, seed=1)
    theirs = torch_twin(ours, torch.nn.MultiheadAttention(e, h, batch_first=batch_first))
    shape_q = (lq, e) if case == "unbatched" else ((n, lq, e) if batch_first else (lq, n, e))
    shape_k = (s, e) if case == "unbatched" else ((n, s, e) if batch_first else (s, n, e))
    q = rand(rng, *shape_q)
    k, v = (q, q) if case != "cross" else (rand(rng, *shape_k), rand(rng, *shape_k))
    kw = {}
    if case == "bool_mask":
        kw["attn_mask"] = rng.random((lq, s)) < 0.3  # True: not allowed
        kw["attn_mask"][:, 0] = False
    elif case == "float_mask_per_head":
        kw["attn_mask"] = rand(rng, n * h, lq, s)
    elif case == "padding":
        kw["key_padding_mask"] = np.zeros((n, s), bool)
        kw["key_padding_mask"][0, -3:] = True
        kw["key_padding_mask"][2, :2] = True
    elif case == "causal_hint":
        kw["attn_mask"] = ~np.tril(np.ones((lq, s), bool))
        kw["is_causal"] = True
    tq = pw.tensor(q, dev, requires_grad=True)
    tk, tv = (tq, tq) if case != "cross" else (pw.tensor(k, dev, requires_grad=True), pw.tensor(v, dev))
    out, w = ours(tq, tk, tv, need_weights=need_weights, average_attn_weights=average, **kw)
    rq = t64(q, grad=True)
    rk, rv = (rq, rq) if case != "cross" else (t64(k, grad=True), t64(v))
    tkw = {name: torch_mask(m) if name != "is_causal" else m for name, m in kw.items()}
    rout, rw = theirs(rq, rk, rv, need_weights=need_weights, average_attn_weights=average, **tkw)
    same_as_torch(out.numpy(), rout, 1e-4, 1e-5)
    if need_weights:
        same_as_torch(w.numpy(), rw, 1e-4, 1e-5)
    else:
        assert w is None and rw is None
    g = rand(rng, *out.shape)
    out.backward(pw.tensor(g, dev))
    rout.backward(t64(g))
    same_as_torch(tq.grad.numpy(), rq.grad, 1e-4, 1e-5)
    if case == "cross":
        same_as_torch(tk.grad.numpy(), rk.grad, 1e-4, 1e-5)
    compare_grads(ours, theirs)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu", "callable"])
def test_encoder_layer_like_torch(dev, rng, norm_first, activation):
    """Training mode with dropout 0 (torch's slow path, which the padded rows' values follow)."""
    d, h, ff, n, t = 16, 2, 24, 3, 7
    act = (lambda x: pw.tanh(x)) if activation == "callable" else activation
    tact = torch.tanh if activation == "callable" else activation
    ours = pw.nn.TransformerEncoderLayer(
        d, h, ff, 0.0, act, batch_first=True, norm_first=norm_first, device=dev, seed=2
    )
    theirs = torch_twin(
        ours, torch.nn.TransformerEncoderLayer(d, h, ff, 0.0, tact, batch_first=True, norm_first=norm_first)
    )
    x = rand(rng, n, t, d)
    pad = np.zeros((n, t), bool)
    pad[1, -2:] = True
    tx, rx = pw.tensor(x, dev, requires_grad=True), t64(x, grad=True)
    out = ours(tx, src_key_padding_mask=pad)
    rout = theirs(rx, src_key_padding_mask=torch.from_numpy(pad))
    same_as_torch(out.numpy(), rout, 1e-4, 1e-5)
    g = rand(rng, n, t, d)
    out.backward(pw.tensor(g, dev))
    rout.backward(t64(g))
    same_as_torch(tx.grad.numpy(), rx.grad, 1e-4, 1e-5)
    compare_grads(ours, theirs)


def test_encoder_stack_like_torch(dev, rng):
    """Two layers starting from the first layer's weights (torch deep-copies it), a final norm,
    a causal mask given with is_causal (the fused kernels run); parameter names as torch's."""
    d, h, n, t = 16, 4, 2, 11
    layer = pw.nn.TransformerEncoderLayer(d, h, 32, 0.0, device=dev, seed=3)
    ours = pw.nn.TransformerEncoder(layer, 2, norm=pw.nn.LayerNorm(d, device=dev))
    tlayer = torch.nn.TransformerEncoderLayer(d, h, 32, 0.0)
    theirs = torch.nn.TransformerEncoder(tlayer, 2, norm=torch.nn.LayerNorm(d), enable_nested_tensor=False)
    assert set(ours.state_dict()) == set(theirs.state_dict())
    theirs = torch_twin(ours, theirs)
    x = rand(rng, t, n, d)
    causal = ~np.tril(np.ones((t, t), bool))
    out = ours(pw.tensor(x, dev), mask=causal, is_causal=True)
    rout = theirs(t64(x), mask=torch.from_numpy(causal), is_causal=True)
    same_as_torch(out.numpy(), rout, 1e-4, 1e-5)
    out.sum().backward()
    rout.sum().backward()
    compare_grads(ours, theirs)


def test_transformer_argument_errors(dev):
    with pytest.raises(ValueError, match="divisible"):
        pw.nn.MultiheadAttention(10, 3, device=dev)
    with pytest.raises(NotImplementedError, match="kdim"):
        pw.nn.MultiheadAttention(8, 2, kdim=4, device=dev)
    mha = pw.nn.MultiheadAttention(8, 2, device=dev)
    x = pw.tensor(np.zeros((3, 2, 8), np.float32), dev)
    with pytest.raises(RuntimeError, match="is_causal"):
        mha(x, x, x, is_causal=True)
    with pytest.raises(ValueError, match="key_padding_mask"):
        mha(x, x, x, key_padding_mask=np.zeros((3, 3), bool))
    with pytest.raises(ValueError, match="activation"):
        pw.nn.TransformerEncoderLayer(8, 2, activation="swish", device=dev)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_like_torch(dev, rng, norm_first):
    """Causal self-attention over the target (given as is_causal with its mask), attention over
    the memory with a padding mask, outputs and every gradient (memory's too)."""
    d, h, ff, n, t, s = 16, 4, 24, 2, 6, 9
    ours = pw.nn.TransformerDecoderLayer(
        d, h, ff, 0.0, "gelu", batch_first=True, norm_first=norm_first, device=dev, seed=4
    )
    theirs = torch_twin(
        ours, torch.nn.TransformerDecoderLayer(d, h, ff, 0.0, "gelu", batch_first=True, norm_first=norm_first)
    )
    tgt, mem = rand(rng, n, t, d), rand(rng, n, s, d)
    causal = ~np.tril(np.ones((t, t), bool))
    pad = np.zeros((n, s), bool)
    pad[1, -4:] = True
    tt, tm = pw.tensor(tgt, dev, requires_grad=True), pw.tensor(mem, dev, requires_grad=True)
    rt, rm = t64(tgt, grad=True), t64(mem, grad=True)
    out = ours(tt, tm, tgt_mask=causal, memory_key_padding_mask=pad, tgt_is_causal=True)
    rout = theirs(
        rt, rm, tgt_mask=torch.from_numpy(causal), memory_key_padding_mask=torch.from_numpy(pad), tgt_is_causal=True
    )
    same_as_torch(out.numpy(), rout, 1e-4, 1e-5)
    g = rand(rng, n, t, d)
    out.backward(pw.tensor(g, dev))
    rout.backward(t64(g))
    same_as_torch(tt.grad.numpy(), rt.grad, 1e-4, 1e-5)
    same_as_torch(tm.grad.numpy(), rm.grad, 1e-4, 1e-5)
    compare_grads(ours, theirs)


def test_transformer_like_torch(dev, rng):
    """nn.Transformer (2 + 2 layers, final norms): parameter names as torch's, Xavier-uniform
    matrices, the forward with torch's square subsequent mask, loaded weights."""
    ours = pw.nn.Transformer(16, 4, 2, 2, 32, 0.0, batch_first=True, device=dev, seed=0)
    theirs = torch.nn.Transformer(16, 4, 2, 2, 32, 0.0, batch_first=True)
    assert set(ours.state_dict()) == set(theirs.state_dict())
    w = ours.state_dict()["encoder.layers.0.linear1.weight"]  # [32, 16]: bound sqrt(6 / 48)
    assert np.abs(w).max() <= np.sqrt(6 / 48) and np.abs(w).max() > 0.9 * np.sqrt(6 / 48)
    assert ours.state_dict()["encoder.layers.0.linear1.bias"].any()  # vectors keep Linear's init
    theirs = torch_twin(ours, theirs)
    src, tgt = rand(rng, 2, 7, 16), rand(rng, 2, 5, 16)
    mask = pw.nn.Transformer.generate_square_subsequent_mask(5, dev)
    np.testing.assert_array_equal(mask.numpy(), torch.nn.Transformer.generate_square_subsequent_mask(5).numpy())
    out = ours(pw.tensor(src, dev), pw.tensor(tgt, dev), tgt_mask=mask)
    rout = theirs(
        t64(src), t64(tgt), tgt_mask=torch.nn.Transformer.generate_square_subsequent_mask(5, dtype=torch.float64)
    )
    same_as_torch(out.numpy(), rout, 1e-4, 1e-5)
    out.sum().backward()
    rout.sum().backward()
    compare_grads(ours, theirs)
