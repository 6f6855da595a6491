"""float16 operands of the element-wise, reduction, normalization and loss ops: float32 math
inside, the result in torch's dtype (float16 when every floating operand is float16 or a Python
scalar, float32 when one is float32), gradients in the operand's dtype. References: float64
NumPy / torch CPU on the float16 inputs, rounded once."""

import numpy as np
import pytest
import torch

import pywgtrain as pw
from helpers import assert_close, rand
from pywgtrain._opcodes import REDUCE

SIZES = (1, 7, 33, 129)
TF = torch.nn.functional


def half(rng, *shape, positive=False):
    x = rng.standard_normal(shape)
    return (np.abs(x) + 0.1 if positive else x).astype(np.float16)


def t64(x):
    return torch.from_numpy(np.asarray(x, np.float64))


def assert_half(got, ref, magnitude=None):
    """got (float16) vs the float64 reference: one rounding to float16 plus float32 error; NaN
    and infinities where the reference has them."""
    got = got.numpy() if isinstance(got, pw.Tensor) else np.asarray(got)
    ref = ref.numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref, np.float64)
    assert got.dtype == np.float16 and got.shape == ref.shape, (got.dtype, got.shape, ref.shape)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(got), nan)
    with np.errstate(over="ignore"):
        ref16 = ref.astype(np.float16)
    inf = np.isinf(ref16)  # also where rounding to float16 overflows
    np.testing.assert_array_equal(got[inf], ref16[inf])
    ok = ~(nan | inf)
    scale = magnitude if magnitude is not None else (np.max(np.abs(ref[ok])) if ok.any() else 1.0)
    np.testing.assert_allclose(got[ok].astype(np.float64), ref[ok], rtol=2.0**-10, atol=max(1e-6 * scale, 2.0**-24))


UNARY = {
    "neg": torch.neg,
    "abs": torch.abs,
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "relu": torch.relu,
    "silu": TF.silu,
    "gelu": TF.gelu,
    "square": torch.square,
}
POSITIVE = ("log", "sqrt", "rsqrt")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_half(dev, rng, name, n):
    x = half(rng, 3, n, positive=name in POSITIVE)
    got = getattr(pw.tensor(x, dev), name)() if name != "gelu" else pw.gelu(pw.tensor(x, dev))
    assert_half(got, UNARY[name](t64(x)))


def test_unary_half_specials_and_scalars(dev):
    x = np.array([0.0, -0.0, 1.0, -1.0, 65504.0, -65504.0, np.inf, -np.inf, np.nan, 6e-8, 11.0], np.float16)
    tx = pw.tensor(x, dev)
    for got, ref in (
        (tx.exp(), torch.exp(t64(x))),  # 11 -> 59874 and 65504 -> inf: overflow on the rounding, as torch
        (tx * 2.0, t64(x) * 2.0),  # a Python scalar keeps float16
        (1.0 - tx, 1.0 - t64(x)),
        (tx / 3.0, t64(x) / 3.0),
        (tx.clamp(-1.0, 2.0), t64(x).clamp(-1.0, 2.0)),
        (tx.pow(2.0), t64(x).pow(2.0)),
        (tx.tanh(), t64(x).tanh()),
    ):
        assert_half(got, ref)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "maximum", "minimum", "pow"])
def test_binary_half_and_promotion(dev, rng, name, n):
    a, b = half(rng, 3, n, positive=name == "pow"), half(rng, n)
    fn, tfn = getattr(pw, name), getattr(torch, name)
    assert_half(fn(pw.tensor(a, dev), pw.tensor(b, dev)), tfn(t64(a), t64(b)))  # broadcast
    # float16 with float32: float32, as torch's promotion
    b32 = b.astype(np.float32) * np.float32(1.0 + 2.0**-15)  # not representable in float16
    got = fn(pw.tensor(a, dev), pw.tensor(b32, dev))
    assert got.dtype == np.float32
    assert_close(got.numpy(), tfn(t64(a), t64(b32)).numpy(), rtol=1e-6)
    assert tfn(torch.from_numpy(a), torch.from_numpy(b32)).dtype == torch.float32  # torch agrees


@pytest.mark.parametrize("n", SIZES)
def test_reductions_half(dev, rng, n):
    x = half(rng, 3, n) * np.float16(8)
    tx, r = pw.tensor(x, dev), t64(x)
    mag = float(np.abs(x.astype(np.float64)).sum())
    assert_half(tx.sum(), r.sum(), mag)
    assert_half(tx.sum(1), r.sum(1), mag)
    assert_half(tx.sum(0, keepdim=True), r.sum(0, keepdim=True), mag)
    assert_half(tx.mean(1), r.mean(1), mag / n)
    assert_half(tx.max(), r.max())
    values, indices = tx.max(1)
    assert_half(values, r.max(1).values)
    np.testing.assert_array_equal(indices.numpy(), r.max(1).indices.numpy())
    if n > 1:
        assert_half(tx.var(1), r.var(1), mag)
        assert_half(tx.std(1), r.std(1))
    assert_half(pw.softmax(tx, -1), torch.softmax(r, -1))
    assert_half(pw.log_softmax(tx, 0), torch.log_softmax(r, 0), mag)


def test_reductions_half_nan_and_inf(dev):
    x = np.array([[1.0, np.nan, 3.0], [np.inf, 2.0, -1.0], [-np.inf, np.inf, 0.0]], np.float16)
    tx, r = pw.tensor(x, dev), t64(x)
    assert_half(tx.sum(1), r.sum(1))
    assert_half(tx.max(1).values, r.max(1).values)
    assert_half(tx.max(), r.max())
    assert_half(pw.softmax(tx, 1), torch.softmax(r, 1))


@pytest.mark.parametrize("n", SIZES)
def test_layer_norm_cross_entropy_embedding_dropout_half(dev, rng, n):
    x, w, b = half(rng, 5, n), half(rng, n), half(rng, n)
    got = pw.layer_norm(pw.tensor(x, dev), (n,), pw.tensor(w, dev), pw.tensor(b, dev))
    assert_half(got, TF.layer_norm(t64(x), (n,), t64(w), t64(b)))
    labels = rng.integers(0, n, 5).astype(np.int32)
    loss = pw.cross_entropy(pw.tensor(x, dev), labels)  # float16 logits: a float16 loss, as torch on CUDA
    assert_half(loss, TF.cross_entropy(t64(x), torch.from_numpy(labels).long()))
    table = half(rng, 9, n)
    ids = rng.integers(0, 9, 13).astype(np.int32)
    assert_half(pw.embedding(ids, pw.tensor(table, dev)), table[ids].astype(np.float64))
    y = pw.dropout(pw.tensor(x, dev), 0.5).numpy()
    assert y.dtype == np.float16
    kept = y != 0
    np.testing.assert_array_equal(y[kept], (x.astype(np.float32) * 2).astype(np.float16)[kept])


def test_gradients_half_match_torch(dev, rng):
    """A chain of float16 ops: gradients come back float16, close to torch's float64 ones. The
    row maximum's gradient goes to the element ours picked (the first of a tie, as torch): float16
    rounding can tie two elements that float64 tells apart, and then float64 has no answer."""
    x, w, v = half(rng, 7, 33), half(rng, 33), half(rng, 7, 1)
    tx, tw, tv = (pw.tensor(a, dev, requires_grad=True) for a in (x, w, v))
    rx, rw, rv = (t64(a).requires_grad_() for a in (x, w, v))

    def chain(F, a, b, c, act, top):
        h = act(a * b + c)
        return (F.softmax(h, -1) * h).sum() + (h - c).exp().mean() + top(h).sum()

    picked = []

    def ours_top(h):
        values, index = h.max(1)
        picked.append(index.numpy())
        np.testing.assert_array_equal(picked[0], np.argmax(h.numpy(), axis=1))
        return values

    chain(pw, tx, tw, tv, pw.gelu, ours_top).backward()
    index = torch.from_numpy(picked[0].astype(np.int64)).unsqueeze(1)
    chain(torch, rx, rw, rv, TF.gelu, lambda h: h.gather(1, index)).backward()
    for got, ref in ((tx, rx), (tw, rw), (tv, rv)):
        assert got.grad.dtype == np.float16
        g, r = got.grad.numpy().astype(np.float64), ref.grad.numpy()
        np.testing.assert_allclose(g, r, rtol=1e-2, atol=1e-2 * np.max(np.abs(r)))


def test_half_matmul_with_autograd_and_batched(dev, rng):
    a, b = half(rng, 33, 129), half(rng, 129, 7)
    ta, tb = pw.tensor(a, dev, requires_grad=True), pw.tensor(b, dev, requires_grad=True)
    ra, rb = t64(a).requires_grad_(), t64(b).requires_grad_()
    out = ta @ tb
    ref = ra @ rb
    assert_half(out, ref.detach(), magnitude=float((np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))).max()))
    g = half(rng, 33, 7)
    (out * pw.tensor(g, dev)).sum().backward()
    (ref * t64(g)).sum().backward()
    for got, r in ((ta, ra), (tb, rb)):
        assert got.grad.dtype == np.float16
        np.testing.assert_allclose(got.grad.numpy(), r.grad.numpy(), rtol=1e-2, atol=1e-2 * r.grad.abs().max().item())
    # batched float16 operands compute in float32 and round once
    x, y = half(rng, 3, 7, 33), half(rng, 3, 33, 5)
    assert_half(pw.bmm(pw.tensor(x, dev), pw.tensor(y, dev)), t64(x) @ t64(y), magnitude=33.0)
    with pytest.raises(TypeError, match="other must be float16 like input, got float32"):
        pw.tensor(a, dev) @ pw.tensor(b.astype(np.float32), dev)
    with pytest.raises(TypeError, match="weight must be float16 like input, got float32"):
        pw.linear(pw.tensor(a, dev), pw.tensor(np.ascontiguousarray(b.T, np.float32), dev))


def test_reshape_of_half_that_requires_grad(dev, rng):
    """Allowed (its backward only reshapes the gradient), unlike the region views (test_f16)."""
    x = half(rng, 6)
    g = pw.tensor(x, dev, requires_grad=True)
    (g.reshape(2, 3) * pw.tensor(np.arange(6, dtype=np.float16).reshape(2, 3), dev)).sum().backward()
    assert g.grad.dtype == np.float16
    np.testing.assert_array_equal(g.grad.numpy(), np.arange(6, dtype=np.float16))


@pytest.mark.slow
def test_half_sum_past_one_binding(dev, rng):
    """A float16 tensor whose float32 copy spans more than one storage binding."""
    n = dev.limits["max_storage_buffer_binding_size"] // 4 + 4099
    x = rng.standard_normal(n).astype(np.float16)
    tx = pw.tensor(x, dev)
    assert_half(tx.sum(), x.astype(np.float64).sum(), float(np.abs(x.astype(np.float64)).sum()))
    y = (tx * 2.0).numpy()
    np.testing.assert_array_equal(y, x * np.float16(2))


# -- the float16 element-wise kernels themselves (elementwise.wgsl with f16 operands) -----------
NAN16 = np.uint16(0x7E55)  # poison: a NaN bit pattern that no kernel produces


def poisoned_half(dev, n):
    return pw.tensor(np.full(n, NAN16, np.uint16).view(np.float16), dev)


def bits(x):
    return np.asarray(x.numpy() if isinstance(x, pw.Tensor) else x).view(np.uint16)


@pytest.mark.parametrize("n", SIZES)
def test_unary_kernel_half_stores_its_elements_only(dev, rng, n):
    """An odd count's last element shares a 4-byte word with the next one: the kernel writes its
    own 2 bytes and leaves the neighbour's bits (also NaN payloads) as they were."""
    x = half(rng, n)
    out = poisoned_half(dev, n + 1)
    with dev._recording() as rec:
        pw._core.unary(rec, pw._opcodes.UNARY["tanh"], pw.tensor(x, dev)._buf, out._buf, n, 0.0, 0.0, 0.0, 9)
    got = out.numpy()
    assert bits(got[n:]) == NAN16
    assert_half(got[:n], np.tanh(x.astype(np.float64)))
    # accumulation (beta 1): the sum in float32, rounded once
    acc = pw.tensor(x, dev)
    with dev._recording() as rec:
        pw._core.unary(rec, pw._opcodes.UNARY["mul_scalar"], pw.tensor(x, dev)._buf, acc._buf, n, 3.0, 0.0, 1.0, 9)
    np.testing.assert_array_equal(acc.numpy(), (x.astype(np.float32) * 4).astype(np.float16))


def test_half_rounding_overflow_and_subnormals(dev):
    """Stores round to nearest even once (as NumPy's float32 -> float16), overflow to +-inf,
    keep subnormals and NaN."""
    x = np.array(
        [
            1.0,
            1.0 + 2.0**-11,
            1.0 + 3 * 2.0**-11,
            65504.0,
            65519.0,
            65520.0,
            -7e4,
            2.0**-24,
            3 * 2.0**-26,
            2.0**-26,
            np.nan,
            -0.0,
        ],
        np.float32,
    )
    out = poisoned_half(dev, x.size)
    with dev._recording() as rec:
        pw._core.unary(rec, pw._opcodes.UNARY["copy"], pw.tensor(x, dev)._buf, out._buf, x.size, 0.0, 0.0, 0.0, 8)
    with np.errstate(over="ignore"):
        ref = x.astype(np.float16)
    np.testing.assert_array_equal(bits(out)[:-2], bits(ref)[:-2])
    assert np.isnan(out.numpy()[-2]) and bits(out)[-1] == 0x8000


def test_fill_half(dev):
    out = poisoned_half(dev, 8)
    with dev._recording() as rec:
        pw._core.fill(rec, out._buf, 7, 0.1, True)
    np.testing.assert_array_equal(out.numpy()[:7], np.full(7, 0.1, np.float16))
    assert bits(out)[7] == NAN16


@pytest.mark.parametrize("shape", [(3,), (7, 33), (3, 5, 129)])
def test_strided_half_views_copy_raw_bits(dev, rng, shape):
    """Strided float16 views (odd offsets, odd sizes, transposes) read and write through the
    16-bit copy: every bit pattern (signaling NaN payloads too) arrives unchanged and the
    elements around a written view keep theirs."""
    raw = rng.integers(0, 2**16, shape, dtype=np.uint16)
    raw.reshape(-1)[: min(3, raw.size)] = [0x7C01, 0xFD55, 0x7E00][: min(3, raw.size)]  # NaNs, signaling first
    x = raw.view(np.float16)
    tx = pw.tensor(x, dev)
    views = [
        (tx[..., 1:], x[..., 1:]),
        (tx[..., ::2], x[..., ::2]),
        (tx.T if tx.ndim == 2 else tx, x.T if x.ndim == 2 else x),
    ]
    if tx.ndim == 3:
        views.append((tx.permute(2, 0, 1)[1:, :, 1:], x.transpose(2, 0, 1)[1:, :, 1:]))
    for view, ref in views:
        if view.numel() == 0:
            continue
        np.testing.assert_array_equal(bits(view.contiguous()), bits(np.ascontiguousarray(ref)))
    # writes: x[..., 1::2] = y keeps every other element's bits
    if shape[-1] > 1:
        dst = pw.tensor(x, dev)
        y = rng.integers(0, 2**16, x[..., 1::2].shape, dtype=np.uint16).view(np.float16)
        dst[..., 1::2] = pw.tensor(y, dev)
        expect = raw.copy()
        expect[..., 1::2] = y.view(np.uint16)
        np.testing.assert_array_equal(bits(dst), expect)


@pytest.mark.parametrize("n", SIZES)
def test_where_half(dev, rng, n):
    a, b = half(rng, 3, n), half(rng, n)
    cond = (rng.random((3, 1)) > 0.5).astype(np.float32)
    got = pw.where(pw.tensor(cond, dev), pw.tensor(a, dev), pw.tensor(b, dev))
    assert_half(got, np.where(cond != 0, a, b).astype(np.float64))
    got = pw.where(pw.tensor(cond.astype(np.float16), dev), pw.tensor(a, dev), 0.1)  # a scalar: float16 result
    assert_half(got, torch.where(torch.from_numpy(cond != 0), torch.from_numpy(a), 0.1).double())
    got = pw.where(pw.tensor(cond, dev), pw.tensor(a, dev), pw.tensor(b.astype(np.float32), dev))
    assert got.dtype == np.float32  # float16 with float32: float32, as torch
    ta, tb = pw.tensor(a, dev, requires_grad=True), pw.tensor(b, dev, requires_grad=True)
    g = half(rng, 3, n)
    pw.where(pw.tensor(cond, dev), ta, tb).backward(pw.tensor(g, dev))
    assert ta.grad.dtype == tb.grad.dtype == np.float16
    np.testing.assert_array_equal(ta.grad.numpy(), np.where(cond != 0, g, 0).astype(np.float16))
    assert_half(tb.grad, np.where(cond != 0, 0, g.astype(np.float64)).sum(0), float(np.abs(g).sum()))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "maximum", "minimum", "pow"])
def test_binary_half_gradients_match_torch_half(dev, rng, name, n):
    """Gradients of float16 operands (one broadcast) against torch CPU's float16 autograd: float16
    gradients, within a few float16 roundings (torch rounds at other points)."""
    a, b = half(rng, 3, n, positive=name == "pow"), half(rng, n)
    if name == "div":
        b = np.where(np.abs(b) < 0.25, np.float16(0.5), b)
    g = half(rng, 3, n)
    ta, tb = pw.tensor(a, dev, requires_grad=True), pw.tensor(b, dev, requires_grad=True)
    out = getattr(pw, name)(ta, tb)
    assert out.dtype == np.float16
    out.backward(pw.tensor(g, dev))
    ra, rb = torch.from_numpy(a).requires_grad_(), torch.from_numpy(b).requires_grad_()
    getattr(torch, name)(ra, rb).backward(torch.from_numpy(g))
    for got, ref in ((ta, ra), (tb, rb)):
        assert got.grad.dtype == np.float16 and ref.grad.dtype == torch.float16
        r = ref.grad.double().numpy()
        np.testing.assert_allclose(got.grad.numpy().astype(np.float64), r, rtol=4e-3, atol=4e-3 * np.abs(r).max())


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_half_gradients_match_torch_half(dev, rng, name):
    x, g = half(rng, 7, 33, positive=name in POSITIVE), half(rng, 7, 33)
    tx = pw.tensor(x, dev, requires_grad=True)
    out = getattr(pw, name)(tx)
    assert out.dtype == np.float16
    out.backward(pw.tensor(g, dev))
    rx = torch.from_numpy(x).requires_grad_()
    UNARY[name](rx).backward(torch.from_numpy(g))
    assert tx.grad.dtype == np.float16
    r = rx.grad.double().numpy()
    np.testing.assert_allclose(tx.grad.numpy().astype(np.float64), r, rtol=4e-3, atol=4e-3 * np.abs(r).max())


def test_half_kernels_refuse_bad_masks_and_sizes(dev):
    x = pw.tensor(np.zeros(7, np.float16), dev)
    with dev._recording() as rec:
        with pytest.raises(ValueError, match="half must be a mask"):
            pw._core.unary(rec, 0, x._buf, pw.empty((7,), np.float16, dev)._buf, 7, 0.0, 0.0, 0.0, 16)
        with pytest.raises(ValueError, match="unary output y holds 7 float16 values, needs 9"):
            pw._core.unary(rec, 0, pw.tensor(np.zeros(9, np.float16), dev)._buf, x._buf, 9, 0.0, 0.0, 0.0, 9)


def test_autocast_gpt_step_keeps_no_float32_copies(dev):
    """What a GPT forward under autocast leaves for backward: float16 activations (torch's
    autocast keeps), no float32 copies of them, so well under the float32 forward's."""
    from pywgtrain.models import GPT, GPTConfig

    cfg = GPTConfig(vocab_size=64, block_size=64, n_layer=2, n_head=4, n_embd=64)
    ids = np.random.default_rng(0).integers(0, 64, (8, 65)).astype(np.int32)
    kept = {}
    for amp in (False, True):
        model = GPT(cfg, device=dev, seed=0)
        x, y = pw.tensor(ids[:, :-1].copy(), dev), pw.tensor(ids[:, 1:].copy(), dev)
        dev.synchronize()
        before = dev.memory_stats()["allocated_bytes"]
        with pw.autocast(enabled=amp):
            loss = GPT.loss(model(x), y)
        kept[amp] = dev.memory_stats()["allocated_bytes"] - before
        loss.backward()
        del model, loss
    assert kept[True] < 0.7 * kept[False], kept


@pytest.mark.parametrize("fused", [False, True])
def test_attention_half_keeps_half(dev, rng, fused):
    """float16 attention: a float16 result and float16 gradients against torch's float64 SDPA
    (the float16 kernels: float32 math inside, each output rounded once)."""
    b, h, t, d = 2, 3, 33, 16
    if fused:
        x = half(rng, b, t, 3 * h * d)
        tx = pw.tensor(x, dev, requires_grad=True)
        out = pw.functions.causal_self_attention_qkv(tx, h)
        rx = t64(x).requires_grad_()
        heads = [z.view(b, t, h, d).transpose(1, 2) for z in rx.split(h * d, 2)]
        ref = TF.scaled_dot_product_attention(*heads, is_causal=True).transpose(1, 2).reshape(b, t, h * d)
        pairs = [(tx, rx)]
    else:
        arrays = [half(rng, b, h, t, d) for _ in range(3)]
        ts = [pw.tensor(a, dev, requires_grad=True) for a in arrays]
        out = pw.nn.functional.scaled_dot_product_attention(*ts, is_causal=True)
        rs = [t64(a).requires_grad_() for a in arrays]
        ref = TF.scaled_dot_product_attention(*rs, is_causal=True)
        pairs = list(zip(ts, rs))
    assert_half(out, ref.detach(), magnitude=float(ref.detach().abs().max()))
    g = half(rng, *out.shape)
    out.backward(pw.tensor(g, dev))
    ref.backward(t64(g))
    for got, r in pairs:
        assert got.grad.dtype == np.float16
        rg = r.grad.numpy()
        np.testing.assert_allclose(got.grad.numpy().astype(np.float64), rg, rtol=4e-3, atol=4e-3 * np.abs(rg).max())


@pytest.mark.parametrize("n", SIZES)
def test_dropout_half_same_mask_as_float32(dev, rng, n):
    """float16 dropout draws the float32 mask of the same seed, scales in float32 and rounds
    once; its gradient is float16 with the same mask."""
    x = half(rng, 3, n)
    x[0, 0] = np.float16(60000.0)  # kept: 60000 * 2 overflows to inf on the rounding, as torch
    results = {}
    for dtype in (np.float32, np.float16):
        pw.manual_seed(77, dev)
        t = pw.tensor(x.astype(dtype), dev, requires_grad=True)
        y = pw.dropout(t, 0.5)
        assert y.dtype == dtype
        y.backward(pw.tensor(np.ones(x.shape, dtype), dev))
        results[dtype] = (y.numpy(), t.grad.numpy())
    (y32, g32), (y16, g16) = results[np.float32], results[np.float16]
    np.testing.assert_array_equal(y32 != 0, y16 != 0)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(y16, y32.astype(np.float16))
    assert g16.dtype == np.float16
    np.testing.assert_array_equal(g16, g32.astype(np.float16))


@pytest.mark.parametrize("n", SIZES)
def test_cross_entropy_reads_half_logits(dev, rng, n):
    """float16 logits go into the fused kernel as they are: the loss equals the float32 loss of
    the same values (float32 under autocast, as torch's float32 list; float16 outside), and the
    float16 gradient is the float32 one rounded once."""
    x = half(rng, 5, n) * np.float16(4)
    labels = rng.integers(0, n, 5).astype(np.int32)
    labels[1] = -100  # ignored
    t32 = pw.tensor(x.astype(np.float32), dev, requires_grad=True)
    ref = pw.cross_entropy(t32, labels)
    ref.backward()
    t16 = pw.tensor(x, dev, requires_grad=True)
    with pw.autocast():
        loss = pw.cross_entropy(t16, labels)
    assert loss.dtype == np.float32
    np.testing.assert_array_equal(loss.numpy(), ref.numpy())
    loss.backward()
    assert t16.grad.dtype == np.float16
    np.testing.assert_array_equal(t16.grad.numpy(), t32.grad.numpy().astype(np.float16))
    out = pw.cross_entropy(pw.tensor(x, dev), labels, reduction="none")
    assert out.dtype == np.float16
    np.testing.assert_array_equal(
        out.numpy(), pw.cross_entropy(t32.detach(), labels, reduction="none").numpy().astype(np.float16)
    )


# -- layer_norm, softmax and log_softmax read float16 inputs (float32 math and results) -------------
ROW_LENGTHS = (1, 7, 33, 129, 768, 1025, 4099)  # 1025: past the short-row softmax on CPU adapters; 4099: past
# LayerNorm's one-workgroup row (256 threads x 16)


def run_kernel(dev, fn, *args):
    with dev._recording() as rec:
        fn(rec, *args)


def poisoned32(dev, n):
    return pw.tensor(np.full(n, np.nan, np.float32), dev)


def with_poisoned_tail(dev, n, dtype, values=None):
    """n elements of dtype (values, else poison) and a poisoned one past them: a float16 kernel
    writes its own 2 bytes only, so its neighbour in the last 4-byte word keeps its bits."""
    poison = np.full(n + 1, NAN16, np.uint16).view(np.float16) if dtype == np.float16 else np.full(n + 1, np.nan)
    a = poison.astype(dtype)
    if values is not None:
        a[:n] = values.ravel()
    return pw.tensor(a, dev)


def close64(got, ref, rtol=1e-5, atol=1e-5, scale=None):
    """float32 math vs the float64 reference: NaN where it has NaN, else within rtol and atol * scale."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    ok = ~np.isnan(ref)
    scale = (np.max(np.abs(ref[ok])) if ok.any() else 1.0) if scale is None else scale
    np.testing.assert_allclose(got[ok], ref[ok], rtol=rtol, atol=atol * max(scale, 1.0))


def raw_ln_half(dev, x, w, b, dy, beta=0.0, dx0=None):
    """The LayerNorm kernels on x (float16 or float32) into poisoned outputs: y, mean, rstd (float32),
    dx (x's dtype; beta 1 adds to dx0), dw, db. A float16 dx is poisoned one element past its end,
    which must keep its bits."""
    rows, cols = x.shape
    half = x.dtype == np.float16
    y, mean, rstd = poisoned32(dev, rows * cols), poisoned32(dev, rows), poisoned32(dev, rows)
    dw, db = poisoned32(dev, cols), poisoned32(dev, cols)
    n = rows * cols
    dx = with_poisoned_tail(dev, n, x.dtype, dx0)
    tx, tw, tb = pw.tensor(x, dev), pw.tensor(w, dev), pw.tensor(b, dev)
    run_kernel(
        dev,
        pw._core.layer_norm_forward,
        tx._buf,
        tw._buf,
        tb._buf,
        y._buf,
        mean._buf,
        rstd._buf,
        rows,
        cols,
        1e-5,
        half,
    )
    args = (tx._buf, tw._buf, mean._buf, rstd._buf, pw.tensor(dy, dev)._buf, dx._buf, dw._buf, db._buf, rows, cols)
    run_kernel(dev, pw._core.layer_norm_backward, *args, beta, 0.0, 0.0, half)
    got = dx.numpy()
    assert bits(got[n:]) == NAN16 if half else np.isnan(got[n:])  # the element past the end is untouched
    return [
        y.numpy().reshape(rows, cols),
        mean.numpy(),
        rstd.numpy(),
        got[:n].reshape(rows, cols),
        dw.numpy(),
        db.numpy(),
    ]


def torch_ln64(x, w, b, dy):
    """float64 torch on the widened inputs: y, mean, rstd, dx, dw, db."""
    xt, wt, bt = (t64(a).requires_grad_() for a in (x, w, b))
    y = TF.layer_norm(xt, (x.shape[-1],), wt, bt, 1e-5)
    y.backward(t64(dy))
    x64 = x.astype(np.float64)
    rstd = 1.0 / np.sqrt(x64.var(-1) + 1e-5)
    return y.detach().numpy(), x64.mean(-1), rstd, xt.grad.numpy(), wt.grad.numpy(), bt.grad.numpy()


@pytest.mark.parametrize("cols", ROW_LENGTHS)
@pytest.mark.parametrize("rows", SIZES)
def test_layer_norm_kernel_reads_half(dev, rng, rows, cols):
    """float16 x: the statistics, y, dw and db equal the float32 kernel's on the widened x bit for bit,
    dx is its float32 dx rounded once; all within float32 error of float64 torch."""
    x, dy = half(rng, rows, cols) * np.float16(3), rand(rng, rows, cols)
    w, b = rand(rng, cols), rand(rng, cols)
    got = raw_ln_half(dev, x, w, b, dy)
    wide = raw_ln_half(dev, x.astype(np.float32), w, b, dy)
    for name, g, f in zip(("y", "mean", "rstd", "dx", "dw", "db"), got, wide):
        want = f.astype(np.float16) if name == "dx" else f
        assert g.dtype == want.dtype, name
        np.testing.assert_array_equal(g, want, err_msg=name)
    ref = torch_ln64(x, w, b, dy)
    for g, r in zip(got[:3] + got[4:], ref[:3] + ref[4:]):  # y, mean, rstd, dw, db
        close64(g, r, rtol=1e-4, atol=1e-5)
    # dx = rstd * (terms that cancel): float32 rounding amplified by rstd (test_layernorm_dropout's check_ln).
    # Rows of length 1 cancel to 0 exactly: where the GPU fuses dy * w - mean(g) into one FMA (NVIDIA
    # does) the product's rounding error, at most half an ulp of |g|, is what remains, times rstd.
    cancelled = float(ref[2].max() * np.max(np.abs(dy * w))) * 2.0**-23  # one product's rounding, x2
    scale = max(float(np.max(np.abs(ref[3]))) * max(1.0, ref[2].max() / 3), cancelled / 1e-5)
    close64(got[3], ref[3], rtol=2.0**-10, atol=1e-5, scale=scale)


def test_layer_norm_kernel_half_accumulates_and_rounds(dev, rng):
    """beta 1 adds the float16 dx it holds in float32 and rounds once; past float16's range it is inf."""
    rows, cols = 33, 129
    x, dy = half(rng, rows, cols), rand(rng, rows, cols) * np.float32(3e4)
    w, b = rand(rng, cols), rand(rng, cols)
    base = half(rng, rows, cols) * np.float16(1000)
    got = raw_ln_half(dev, x, w, b, dy, beta=1.0, dx0=base)[3]
    wide = raw_ln_half(dev, x.astype(np.float32), w, b, dy, beta=1.0, dx0=base.astype(np.float32))[3]
    with np.errstate(over="ignore"):
        want = wide.astype(np.float16)
    assert np.isinf(want).any() and np.isfinite(want).any()  # some sums overflow float16
    np.testing.assert_array_equal(got, want)


def test_layer_norm_kernel_half_nan_and_inf(dev, rng):
    """NaN and infinities in float16 rows give what torch's float32 layer_norm gives on the widened
    rows: a NaN row where a row holds NaN or inf, finite rows unchanged."""
    rows, cols = 5, 33
    x, dy, w, b = half(rng, rows, cols), rand(rng, rows, cols), rand(rng, cols), rand(rng, cols)
    x[0, 3], x[1, 0], x[2, 7], x[2, 9] = np.nan, np.inf, -np.inf, np.inf
    x[3, 5] = np.float16(65504)  # finite: the statistics in float32 keep it
    y = raw_ln_half(dev, x, w, b, dy)[0]
    ref = TF.layer_norm(torch.from_numpy(x.astype(np.float32)), (cols,), torch.from_numpy(w), torch.from_numpy(b))
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref.numpy()))
    assert np.isnan(y[:3]).all() and np.isfinite(y[3:]).all()
    close64(y[3:], ref.numpy()[3:], rtol=1e-4, atol=1e-5)


def test_layer_norm_kernel_refuses_short_half_operands(dev):
    x = pw.tensor(np.zeros((3, 4), np.float16), dev)
    y, m = pw.empty((3, 4), np.float32, dev), pw.empty((3,), np.float32, dev)
    with dev._recording() as rec:
        with pytest.raises(ValueError, match="layer_norm input x holds 12 float16 values, needs 15"):
            pw._core.layer_norm_forward(rec, x._buf, None, None, y._buf, m._buf, m._buf, 3, 5, 1e-5, True)
        with pytest.raises(ValueError, match="layer_norm_backward dx holds 6 float16 values, needs 12"):
            dx = pw.empty((6,), np.float16, dev)
            pw._core.layer_norm_backward(
                rec, x._buf, None, m._buf, m._buf, y._buf, dx._buf, None, None, 3, 4, 0.0, 0.0, 0.0, True
            )


def ln_under_autocast(dev, x, w, b):
    tx = pw.tensor(x, dev, requires_grad=True)
    tw, tb = (pw.tensor(a, dev, requires_grad=True) for a in (w, b))
    with pw.autocast():
        y = pw.layer_norm(tx, (x.shape[-1],), tw, tb)
    return tx, tw, tb, y


@pytest.mark.parametrize("shape", [(1, 7), (7, 33), (3, 11, 129)])
def test_layer_norm_half_under_autocast_matches_torch(dev, rng, shape):
    """Under autocast a float16 input gives a float32 result (torch's float32 list); backward gives
    the float16 input a float16 gradient and the float32 parameters float32 ones, against torch CPU
    on the same dtypes (the float16 input widened in the graph, as its autocast does)."""
    x, w, b = half(rng, *shape), rand(rng, shape[-1]), rand(rng, shape[-1])
    g = rand(rng, *shape)
    tx, tw, tb, y = ln_under_autocast(dev, x, w, b)
    assert y.dtype == np.float32
    y.backward(pw.tensor(g, dev))
    rx = torch.from_numpy(x).requires_grad_()
    rw, rb = (torch.from_numpy(a).requires_grad_() for a in (w, b))
    ry = TF.layer_norm(rx.float(), (shape[-1],), rw, rb)
    ry.backward(torch.from_numpy(g))
    assert_close(y.numpy(), ry.detach().numpy(), rtol=1e-5)
    assert tx.grad.dtype == np.float16 and tw.grad.dtype == np.float32 and tb.grad.dtype == np.float32
    assert_half(tx.grad, rx.grad.double(), magnitude=float(rx.grad.abs().max()) * 4)
    assert_close(tw.grad.numpy(), rw.grad.numpy(), rtol=1e-4, atol_scale=1e-5)
    assert_close(tb.grad.numpy(), rb.grad.numpy(), rtol=1e-5)


def test_layer_norm_half_keeps_the_half_input(dev, rng):
    """No float32 copy of the float16 input: the node reads x itself (no cast between), and the
    forward's peak holds the float32 result and statistics, not a second float32 tensor."""
    rows, cols = 64, 768
    x, w, b = half(rng, rows, cols), rand(rng, cols), rand(rng, cols)
    tx = pw.tensor(x, dev, requires_grad=True)
    tw, tb = (pw.tensor(a, dev, requires_grad=True) for a in (w, b))
    dev.synchronize()
    dev.memory_stats(reset_peak=True)
    before = dev.memory_stats()["allocated_bytes"]
    with pw.autocast():
        y = pw.layer_norm(tx, (cols,), tw, tb)
    dev.synchronize()
    peak = dev.memory_stats()["peak_allocated_bytes"] - before
    assert y.grad_fn.edges[0] is None  # x is the leaf itself, no cast node
    assert y.grad_fn.versions[0][0] is tx._store  # what backward reads: the float16 input
    assert peak < 1.25 * rows * cols * 4, peak  # y (+ 2 rows of statistics); a float32 copy of x doubles it
    # outside autocast, float16 operands give float16, as torch
    out = pw.layer_norm(pw.tensor(x, dev), (cols,), pw.tensor(w.astype(np.float16), dev), None)
    assert out.dtype == np.float16
    with pw.autocast():
        mixed = pw.layer_norm(pw.tensor(x, dev), (cols,), pw.tensor(w.astype(np.float16), dev), None)
    np.testing.assert_array_equal(out.numpy(), mixed.numpy().astype(np.float16))


def raw_softmax(dev, x, dy, log, beta=0.0, dx0=None):
    """softmax / log_softmax kernels on x (float16 or float32) into poisoned outputs: y (float32) and
    dx (x's dtype; beta 1 adds to dx0)."""
    rows, cols = x.shape
    n, half_x = rows * cols, x.dtype == np.float16
    y = poisoned32(dev, n)
    dx = with_poisoned_tail(dev, n, x.dtype, dx0)
    run_kernel(dev, pw._core.softmax, pw.tensor(x, dev)._buf, y._buf, rows, cols, log, half_x)
    tdy = pw.tensor(dy, dev)
    run_kernel(dev, pw._core.softmax_backward, y._buf, tdy._buf, dx._buf, rows, cols, log, beta, half_x)
    got = dx.numpy()
    assert bits(got[n:]) == NAN16 if half_x else np.isnan(got[n:])
    return y.numpy().reshape(rows, cols), got[:n].reshape(rows, cols)


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("cols", ROW_LENGTHS)
@pytest.mark.parametrize("rows", SIZES)
def test_softmax_kernels_read_half(dev, rng, rows, cols, log):
    """float16 x: y equals the float32 kernel's on the widened x bit for bit and dx (float16) its
    float32 dx rounded once; both within float32 error of float64 torch."""
    x, dy = half(rng, rows, cols) * np.float16(4), rand(rng, rows, cols)
    y, dx = raw_softmax(dev, x, dy, log)
    y32, dx32 = raw_softmax(dev, x.astype(np.float32), dy, log)
    np.testing.assert_array_equal(y, y32)
    assert dx.dtype == np.float16
    np.testing.assert_array_equal(dx, dx32.astype(np.float16))
    rx = t64(x).requires_grad_()
    ry = (torch.log_softmax if log else torch.softmax)(rx, -1)
    ry.backward(t64(dy))
    close64(y, ry.detach().numpy(), rtol=1e-5, atol=1e-6)
    close64(dx, rx.grad.numpy(), rtol=2.0**-10, atol=1e-5)


@pytest.mark.parametrize("log", [False, True])
def test_softmax_kernel_half_accumulates_nan_and_inf(dev, rng, log):
    """beta 1 adds the float16 dx it holds in float32 and rounds once; NaN and infinities in the
    float16 rows give torch's float32 results on the widened rows."""
    rows, cols = 7, 33
    x, dy = half(rng, rows, cols), rand(rng, rows, cols)
    x[0, 3], x[1, 0], x[2, 7], x[3, 2], x[3, 9] = np.nan, np.inf, -np.inf, np.inf, np.inf
    base = half(rng, rows, cols)
    y, dx = raw_softmax(dev, x, dy, log, beta=1.0, dx0=base)
    y32, dx32 = raw_softmax(dev, x.astype(np.float32), dy, log, beta=1.0, dx0=base.astype(np.float32))
    np.testing.assert_array_equal(y, y32)
    np.testing.assert_array_equal(dx, dx32.astype(np.float16))
    ref = (torch.log_softmax if log else torch.softmax)(torch.from_numpy(x.astype(np.float32)), -1).numpy()
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(y), np.isinf(ref))
    finite = np.isfinite(ref)
    np.testing.assert_allclose(y[finite], ref[finite], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dim", [-1, 0])
def test_softmax_half_under_autocast_matches_torch(dev, rng, name, dim):
    """Under autocast a float16 input gives a float32 result and a float16 gradient (torch CPU on
    the same dtypes); outside it a float16 result, the float32 one rounded. Along the last
    dimension nothing but the float32 result is made (the node reads it, no cast of x)."""
    x, g = half(rng, 7, 129) * np.float16(3), rand(rng, 7, 129)
    tx = pw.tensor(x, dev, requires_grad=True)
    with pw.autocast():
        y = getattr(pw, name)(tx, dim)
    assert y.dtype == np.float32
    if dim == -1:
        assert y.grad_fn.edges[0] is None
    y.backward(pw.tensor(g, dev))
    rx = torch.from_numpy(x).requires_grad_()
    ry = getattr(torch, name)(rx.float(), dim)
    ry.backward(torch.from_numpy(g))
    assert_close(y.numpy(), ry.detach().numpy(), rtol=1e-5, atol_scale=1e-6)
    assert tx.grad.dtype == np.float16
    assert_half(tx.grad, rx.grad.double(), magnitude=float(rx.grad.abs().max()) * 4)
    out = getattr(pw, name)(pw.tensor(x, dev), dim)
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out.numpy(), y.numpy().astype(np.float16))


REDUCE_SHAPES = [  # (outer, length, inner) of at most 200,000 elements: the larger ones add nothing
    (o, n, i) for o in SIZES for n in ROW_LENGTHS for i in (1, 33) if o * n * i <= 200_000
]


@pytest.mark.parametrize("outer, length, inner", REDUCE_SHAPES)
def test_reduce_kernel_reads_half(dev, rng, outer, length, inner):
    """reduce_axis on float16 x: the float32 kernel's sums and maxima of the widened x, bit for bit,
    within float32 error of float64; the float32 output's neighbours keep their poison."""
    x = half(rng, outer, length, inner) * np.float16(4)
    got = {}
    for dtype in (np.float16, np.float32):
        tx = pw.tensor(x.astype(dtype), dev)
        s, m = poisoned32(dev, outer * inner + 1), poisoned32(dev, outer * inner)
        am = pw.tensor(np.full(outer * inner, -7, np.int32), dev)
        with dev._recording() as rec:
            pw._core.reduce_axis(
                rec, REDUCE["sum"], tx._buf, s._buf, None, outer, length, inner, 0.5, 0.0, dtype == np.float16
            )
            pw._core.reduce_axis(
                rec, REDUCE["max"], tx._buf, m._buf, am._buf, outer, length, inner, 1.0, 0.0, dtype == np.float16
            )
        got[dtype] = (s.numpy(), m.numpy(), am.numpy())
    for a, b in zip(got[np.float16], got[np.float32]):
        np.testing.assert_array_equal(a, b)
    s, m, am = got[np.float16]
    assert np.isnan(s[-1])
    x64 = x.astype(np.float64)
    close64(s[:-1], 0.5 * x64.sum(1).ravel(), rtol=1e-5, atol=1e-6, scale=float(np.abs(x64).sum(1).max()))
    np.testing.assert_array_equal(m, x64.max(1).ravel())
    np.testing.assert_array_equal(am, x64.argmax(1).ravel())


def test_sum_mean_half_read_natively(dev, rng):
    """sum and mean read float16 as it is: under autocast sum gives float32 (torch's float32 list),
    mean float16; outside both give float16; gradients are float16, against torch CPU; the forward
    makes no float32 copy of the input."""
    x = half(rng, 33, 129) * np.float16(4)
    tx = pw.tensor(x, dev, requires_grad=True)
    rx = torch.from_numpy(x).requires_grad_()
    with pw.autocast():
        s, m = tx.sum(1), pw.mean(tx, 0)
    assert s.dtype == np.float32 and m.dtype == np.float16
    assert s.grad_fn.edges[0] is None
    assert_close(s.numpy(), x.astype(np.float64).sum(1), rtol=1e-5)
    assert_half(m, t64(x).mean(0))
    gs, gm = rand(rng, 33), half(rng, 129)
    (s * pw.tensor(gs, dev)).sum().backward()
    (m * pw.tensor(gm, dev)).sum().backward()
    (rx.float().sum(1) * torch.from_numpy(gs)).sum().backward()
    (rx.mean(0) * torch.from_numpy(gm)).sum().backward()
    assert tx.grad.dtype == np.float16
    np.testing.assert_allclose(tx.grad.numpy().astype(np.float64), rx.grad.double().numpy(), rtol=2.0**-9, atol=1e-3)
    out = pw.sum(pw.tensor(x, dev))
    assert out.dtype == np.float16
    assert_half(out, t64(x).sum(), float(np.abs(x.astype(np.float64)).sum()))
    # no float32 copy: the forward's peak is the result's, not a [33, 129] float32 tensor's
    big = pw.tensor(half(rng, 256, 1024), dev)
    dev.synchronize()
    dev.memory_stats(reset_peak=True)
    before = dev.memory_stats()["allocated_bytes"]
    with pw.autocast():
        total = big.sum(1)
    dev.synchronize()
    assert dev.memory_stats()["peak_allocated_bytes"] - before < 256 * 1024 * 2, total.shape


@pytest.mark.slow
def test_layer_norm_and_softmax_half_past_one_binding(dev, rng):
    """Operands past one storage binding run in row blocks; at an odd row length a block's first
    element sits at other offsets in the 2-byte and the 4-byte bindings (x_off / y_off, x_off /
    out_off): the results equal the float32 kernels' on the widened input (their own slow tests
    check those against float64)."""
    cols = 1031
    rows = dev.limits["max_storage_buffer_binding_size"] // 4 // cols + 33
    x, dy = half(rng, rows, cols), rng.standard_normal((rows, cols), dtype=np.float32)
    w, b = rand(rng, cols), rand(rng, cols)
    got = raw_ln_half(dev, x, w, b, dy)
    wide = raw_ln_half(dev, x.astype(np.float32), w, b, dy)
    for g, f in zip(got, wide):
        np.testing.assert_array_equal(g, f.astype(g.dtype))
    del got, wide
    y, dx = raw_softmax(dev, x, dy, True)
    y32, dx32 = raw_softmax(dev, x.astype(np.float32), dy, True)
    np.testing.assert_array_equal(y, y32)
    np.testing.assert_array_equal(dx, dx32.astype(np.float16))


@pytest.mark.parametrize("fused", [False, True])
def test_autocast_attention_saves_no_float32_copies(dev, rng, fused):
    """An autocast attention call on float32 operands: recorded casts to float16 (their
    gradients come back float32), the float16 kernels on them, and no float32 copy of q, k,
    v or the output, neither at the peak of the forward nor kept for backward: what the call
    adds is the float16 casts and output and the float32 lse (plus size-class rounding)."""
    b, h, t, d = 2, 2, 129, 64
    n = b * h * t * d
    if fused:
        xs = [pw.tensor(rng.standard_normal((b, t, 3 * h * d), dtype=np.float32), dev, requires_grad=True)]
        call = lambda: pw.nn.functional.causal_self_attention_qkv(xs[0], h)  # noqa: E731
        half_bytes = 2 * 4 * n  # the cast qkv (3n) and the output (n)
    else:
        xs = [pw.tensor(rng.standard_normal((b, h, t, d), dtype=np.float32), dev, requires_grad=True) for _ in range(3)]
        call = lambda: pw.nn.functional.scaled_dot_product_attention(*xs, is_causal=True)  # noqa: E731
        half_bytes = 2 * 4 * n  # three casts and the output
    dev.synchronize()
    before = dev.memory_stats(reset_peak=True)["allocated_bytes"]
    with pw.autocast():
        out = call()
    dev.synchronize()
    stats = dev.memory_stats()
    assert out.dtype == np.float16
    budget = half_bytes + 4 * b * h * t + 8 * 512  # + lse, + rounding to 512-byte size classes
    assert stats["allocated_bytes"] - before <= budget, (stats, before, budget)
    assert stats["peak_allocated_bytes"] - before <= budget, (stats, before, budget)
    out.backward(pw.tensor(np.ones(out.shape, np.float16), dev))
    assert all(x.grad.dtype == np.float32 for x in xs)


@pytest.mark.parametrize("t", SIZES)
def test_attention_half_nan_and_inf_like_torch(dev, rng, t):
    """float16 attention with a NaN key row in one head and an infinite query element in
    another: NaN exactly where torch's float32 SDPA on the widened inputs has it, the rest
    close; gradients NaN wherever torch's are in the head with the NaN key, finite elsewhere."""
    b, h, d = 2, 3, 8
    q, k, v, dy = (half(rng, b, h, t, d) for _ in range(4))
    nan_at = t // 2
    k[0, 1, nan_at] = np.nan
    # The last row's scores are +-inf, key 0's +inf: NaN (inf - inf), as torch's softmax gives.
    # (A row of -inf scores only is fully masked to torch's math kernel, which returns 0 there,
    # and NaN to ours in float32 and float16 alike: not tested.)
    q[1, 2, t - 1, 0] = np.inf
    k[1, 2, 0, 0] = abs(k[1, 2, 0, 0]) + np.float16(0.5)
    ts = [torch.tensor(a.astype(np.float32), requires_grad=True) for a in (q, k, v)]
    # torch's default CPU kernel treats a row whose only visible key is NaN (t = 1) as fully
    # masked and returns 0 there; its math kernel, like ours, NaN (test_nan_semantics.py).
    backend = torch.nn.attention.SDPBackend.MATH if t == 1 else torch.nn.attention.SDPBackend.FLASH_ATTENTION
    with torch.nn.attention.sdpa_kernel(backend):
        want = TF.scaled_dot_product_attention(*ts, is_causal=True)
    want.backward(torch.tensor(dy.astype(np.float32)))
    tq, tk, tv = (pw.tensor(a, dev, requires_grad=True) for a in (q, k, v))
    out = pw.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
    out.backward(pw.tensor(dy, dev))
    got, ref = out.numpy(), want.detach().numpy()
    assert got.dtype == np.float16
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    ok = ~np.isnan(ref)
    np.testing.assert_allclose(got[ok].astype(np.float64), ref[ok], rtol=4e-3, atol=4e-3 * np.abs(ref[ok]).max())
    for ours, r in zip((tq, tk, tv), ts):
        g, gt = ours.grad.numpy(), r.grad.numpy()
        assert g.dtype == np.float16
        clean = np.ones((b, h), bool)
        clean[0, 1] = clean[1, 2] = False  # the heads with the NaN key and the infinite query
        # (an absolute floor of 4e-3: dq and dk vanish at T = 1 up to float32 rounding)
        np.testing.assert_allclose(
            g[clean].astype(np.float64), gt[clean], rtol=4e-3, atol=4e-3 * max(np.abs(gt[clean]).max(), 1.0)
        )
        assert np.isnan(g[0, 1]).any() == np.isnan(gt[0, 1]).any()
