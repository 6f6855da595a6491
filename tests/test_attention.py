"""Fused causal self-attention (attention.wgsl): forward and backward against
PyTorch float64 (torch.nn.functional.scaled_dot_product_attention with
is_causal=True and autograd), the strided [B, T, 3C] entry, the raw kernels
with poisoned outputs, and a plain path composed of existing ops (bmm, where,
softmax) that must agree with the fused one."""

import math

import numpy as np
import pytest
import torch

import pywgtrain as pw
import pywgtrain.nn.functional as F
from pywgtrain import _core
from helpers import assert_close, poisoned, rand

RTOL, ATOL = 2e-4, 2e-5  # float32 sums over up to 1024 keys vs float64


def close(actual, expected, factor=1.0):
    """assert_close with an absolute floor of ATOL (inputs are O(1)): gradients that
    vanish mathematically (dq, dk at T = 1: dP - delta = 0) keep float32 rounding."""
    expected = np.asarray(expected, np.float64)
    scale = max(float(np.max(np.abs(expected))), 1e-30)
    assert_close(actual, expected, rtol=RTOL * factor, atol_scale=ATOL * factor * max(scale, 1.0) / scale)


def torch_ref(q, k, v, g):
    """out, dq, dk, dv in float64 (q, k, v, g: [B, H, T, D] arrays)."""
    tq, tk, tv = (torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
    out.backward(torch.tensor(g, dtype=torch.float64))
    return out.detach().numpy(), tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy()


def plain_attention(q, k, v):
    """The same attention from existing differentiable ops: scores through bmm
    with trans_b, the causal mask through where, softmax, bmm."""
    b, h, t, d = q.shape
    q3, k3, v3 = (pw.reshape(x, (b * h, t, d)) for x in (q, k, v))
    s = pw.bmm(q3, k3, trans_b=True) * (1.0 / math.sqrt(d))
    allowed = pw.tensor(np.tril(np.ones((t, t), np.float32)), q.device)
    p = pw.softmax(pw.where(allowed, s, -math.inf), dim=-1)
    return pw.reshape(pw.bmm(p, v3), (b, h, t, d))


def check_all(results, refs):
    for got, want in zip(results, refs):
        close(got, want)


def run_fused(dev, q, k, v, g):
    tq, tk, tv = (pw.tensor(x, dev, requires_grad=True) for x in (q, k, v))
    out = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
    out.backward(pw.tensor(g, dev))
    return out.numpy(), tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy()


# Every T of the default subset meets every head size, at B*H = 1 and 6 in turn.
FAST = [
    (1, 1, t, d) if (i + j) % 2 == 0 else (2, 3, t, d)
    for i, t in enumerate((1, 7, 64, 257))
    for j, d in enumerate((32, 64, 128, 24))
]


@pytest.mark.parametrize("b,h,t,d", FAST + [(1, 1, 1024, 32), (2, 3, 1024, 24), (1, 2, 130, 6), (2, 1, 65, 70)])
def test_forward_backward_vs_torch(dev, rng, b, h, t, d):
    q, k, v, g = (rand(rng, b, h, t, d) for _ in range(4))
    check_all(run_fused(dev, q, k, v, g), torch_ref(q, k, v, g))


# 4-8 s each on a loaded 2-core lavapipe (near the 10 s mark): kept out of the default run.
@pytest.mark.slow
@pytest.mark.parametrize("b,h,t,d", [(2, 3, 1024, 64), (1, 6, 1024, 128)])
def test_forward_backward_vs_torch_long(dev, rng, b, h, t, d):
    q, k, v, g = (rand(rng, b, h, t, d) for _ in range(4))
    check_all(run_fused(dev, q, k, v, g), torch_ref(q, k, v, g))


def qkv_views(b, t, c, h):
    """(off, sb, sh, st) of q, k, v inside [B, T, 3C] and of the [B, T, C] output."""
    d = c // h
    return [(i * c, t * 3 * c, d, 3 * c) for i in range(3)], (0, t * c, d, c)


def split_heads(qkv, h):
    """[B, T, 3C] -> q, k, v as [B, H, T, D] (host copies)."""
    b, t, c3 = qkv.shape
    c = c3 // 3
    return [
        np.ascontiguousarray(qkv[:, :, i * c : (i + 1) * c].reshape(b, t, h, c // h).transpose(0, 2, 1, 3))
        for i in range(3)
    ]


def merge_heads(x):
    b, h, t, d = x.shape
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3)).reshape(b, t, h * d)


@pytest.mark.parametrize(
    "b,t,c,h,max_blocks", [(2, 7, 96, 4, 0), (2, 257, 128, 2, 0), (1, 300, 96, 1, 1), (3, 130, 64, 2, 2)]
)
def test_raw_kernels_strided_qkv(dev, rng, b, t, c, h, max_blocks):
    """The launchers on the GPT layout: q, k, v (and dq, dk, dv) are column
    blocks of one [B, T, 3C] buffer, out and dout [B, T, C]; outputs poisoned
    with NaN first; max_blocks > 0 splits the block loops over dispatches
    (later forward dispatches resume from O and lse, backward ones accumulate)."""
    d = c // h
    qkv, g = rand(rng, b, t, 3 * c), rand(rng, b, t, c)
    (qv, kv, vv), ov = qkv_views(b, t, c, h)
    x, tg = pw.tensor(qkv, dev), pw.tensor(g, dev)
    out, lse = poisoned(dev, (b, t, c)), poisoned(dev, (b * h * t,))
    scale = 1 / math.sqrt(d)
    with dev._recording() as rec:
        _core.attention_forward(
            rec, x._buf, qv, x._buf, kv, x._buf, vv, out._buf, ov, lse._buf, b, h, t, d, scale, max_blocks
        )
    grad, delta = poisoned(dev, (b, t, 3 * c)), poisoned(dev, (b * h * t,))

    def backward(beta):  # dq, dk, dv into grad's column blocks, as q, k, v lie in x
        operands = (x._buf, qv, x._buf, kv, x._buf, vv, out._buf, ov, tg._buf, ov, lse._buf, delta._buf)
        with dev._recording() as rec:
            _core.attention_backward(
                rec, *operands, grad._buf, qv, grad._buf, kv, grad._buf, vv, b, h, t, d, scale, beta, max_blocks
            )

    backward(0.0)
    q, k, v = split_heads(qkv, h)
    ro, rdq, rdk, rdv = torch_ref(q, k, v, split_heads(np.concatenate([g] * 3, axis=2), h)[0])
    close(out.numpy(), merge_heads(ro))
    # lse: log-sum-exp of each row's scaled causal scores.
    s = np.einsum("bhtd,bhsd->bhts", q.astype(np.float64), k.astype(np.float64)) * scale
    s[..., ~np.tril(np.ones((t, t), bool))] = -np.inf
    m = s.max(-1, keepdims=True)
    close(lse.numpy(), (m[..., 0] + np.log(np.exp(s - m).sum(-1))).reshape(-1))
    close(grad.numpy(), np.concatenate([merge_heads(rdq), merge_heads(rdk), merge_heads(rdv)], axis=2))
    # beta = 1 accumulates: the same backward again doubles the gradient.
    backward(1.0)
    close(grad.numpy(), 2 * np.concatenate([merge_heads(rdq), merge_heads(rdk), merge_heads(rdv)], axis=2))


@pytest.mark.parametrize("b,t,c,h", [(2, 65, 96, 4), (1, 257, 128, 1)])
def test_qkv_entry_vs_torch(dev, rng, b, t, c, h):
    """causal_self_attention_qkv([B, T, 3C], n_head) -> [B, T, C], differentiable,
    against torch on the same split; a second backward accumulates into .grad."""
    qkv, g = rand(rng, b, t, 3 * c), rand(rng, b, t, c)
    x = pw.tensor(qkv, dev, requires_grad=True)
    out = F.causal_self_attention_qkv(x, h)
    assert out.shape == (b, t, c)
    out.backward(pw.tensor(g, dev))
    tx = torch.tensor(qkv, dtype=torch.float64, requires_grad=True)
    tq, tk, tv = (y.reshape(b, t, h, c // h).transpose(1, 2) for y in tx.split(c, dim=2))
    to = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True).transpose(1, 2).reshape(b, t, c)
    to.backward(torch.tensor(g, dtype=torch.float64))
    close(out.numpy(), to.detach().numpy())
    want = tx.grad.numpy()
    close(x.grad.numpy(), want)
    F.causal_self_attention_qkv(x, h).backward(pw.tensor(g, dev))
    close(x.grad.numpy(), 2 * want)


@pytest.mark.parametrize("b,h,t,d", [(1, 1, 7, 24), (2, 3, 64, 32), (1, 2, 257, 64)])
def test_plain_path_agrees(dev, rng, b, h, t, d):
    """The attention composed of bmm / where / softmax matches torch and the fused op, forward and backward."""
    q, k, v, g = (rand(rng, b, h, t, d) for _ in range(4))
    tq, tk, tv = (pw.tensor(x, dev, requires_grad=True) for x in (q, k, v))
    out = plain_attention(tq, tk, tv)
    out.backward(pw.tensor(g, dev))
    plain = [out.numpy(), tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy()]
    check_all(plain, torch_ref(q, k, v, g))
    fused = run_fused(dev, q, k, v, g)
    for a, p in zip(fused, plain):
        close(a, p.astype(np.float64))


def test_same_tensor_and_mixed_grads(dev, rng):
    """q is k is v (gradients summed by the sinks), and a backward whose targets
    mix an accumulating .grad with fresh ones."""
    b, h, t, d = 1, 2, 70, 32
    x_np, g = rand(rng, b, h, t, d), rand(rng, b, h, t, d)
    x = pw.tensor(x_np, dev, requires_grad=True)
    out = F.scaled_dot_product_attention(x, x, x, is_causal=True)
    out.backward(pw.tensor(g, dev))
    ro, rdq, rdk, rdv = torch_ref(x_np, x_np, x_np, g)
    close(out.numpy(), ro)
    close(x.grad.numpy(), rdq + rdk + rdv)

    q_np, k_np, v_np = (rand(rng, b, h, t, d) for _ in range(3))
    q = pw.tensor(q_np, dev, requires_grad=True)
    k0, v0 = pw.tensor(k_np, dev), pw.tensor(v_np, dev)  # no grad: the kernel writes scratch for them
    F.scaled_dot_product_attention(q, k0, v0, is_causal=True).backward(pw.tensor(g, dev))
    k, v = pw.tensor(k_np, dev, requires_grad=True), pw.tensor(v_np, dev, requires_grad=True)
    # q.grad accumulates, k and v start fresh
    F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(pw.tensor(g, dev))
    _, rdq, rdk, rdv = torch_ref(q_np, k_np, v_np, g)
    close(q.grad.numpy(), 2 * rdq)
    close(k.grad.numpy(), rdk)
    close(v.grad.numpy(), rdv)


def test_no_grad_forward_only(dev, rng):
    q, k, v = (rand(rng, 2, 2, 33, 64) for _ in range(3))
    with pw.no_grad():
        out = F.scaled_dot_product_attention(
            *(pw.tensor(x, dev, requires_grad=True) for x in (q, k, v)), is_causal=True
        )
    assert out.grad_fn is None
    close(out.numpy(), torch_ref(q, k, v, np.zeros_like(q))[0])


def test_errors(dev, rng):
    sdpa = F.scaled_dot_product_attention
    x = pw.tensor(rand(rng, 1, 2, 8, 16), dev)
    with pytest.raises(TypeError, match="float32"):
        sdpa(x, x, np.zeros((1, 2, 8, 16), np.float64))
    with pytest.raises(TypeError, match="float32"):
        sdpa(x, pw.tensor(np.zeros((1, 2, 8, 16), np.int32), dev), x)
    other = pw.Device()
    with pytest.raises(ValueError, match="lives on"):
        sdpa(x, pw.tensor(rand(rng, 1, 2, 8, 16), other), x)
    with pytest.raises(TypeError, match="scale"):
        sdpa(x, x, x, scale="big")
    qkv = pw.tensor(rand(rng, 2, 5, 48), dev)
    with pytest.raises(ValueError, match="not divisible"):
        F.causal_self_attention_qkv(qkv, 5)
    with pytest.raises(TypeError, match="n_head"):
        F.causal_self_attention_qkv(qkv, 0)
    with pytest.raises(ValueError, match="3 \\* C"):
        F.causal_self_attention_qkv(pw.tensor(rand(rng, 2, 5, 47), dev), 1)
    with pytest.raises(ValueError, match="head size 258"):
        F.causal_self_attention_qkv(pw.tensor(rand(rng, 1, 2, 3 * 258), dev), 1)
    # The launcher: views past the buffer, overlapping output rows, outputs aliasing inputs.
    buf, out, lse = pw.tensor(rand(rng, 64), dev), pw.empty((64,), np.float32, dev), pw.empty((8,), np.float32, dev)
    with dev._recording() as rec:

        def forward(q_view, out_view, out_buf):  # B = H = 1, T = D = 8, k and v at offset 0
            v0 = (0, 0, 0, 8)
            _core.attention_forward(
                rec, buf._buf, q_view, buf._buf, v0, buf._buf, v0, out_buf, out_view, lse._buf, 1, 1, 8, 8, 1.0
            )

        with pytest.raises(ValueError, match="q reaches element"):
            forward((1, 0, 0, 8), (0, 0, 0, 8), out._buf)
        with pytest.raises(ValueError, match="row stride"):
            forward((0, 0, 0, 8), (0, 0, 0, 4), out._buf)
        with pytest.raises(ValueError, match="shares a GPU buffer"):
            forward((0, 0, 0, 8), (0, 0, 0, 8), buf._buf)


# -- float16 kernels ----------------------------------------------------------------------
# float16 q, k, v (dO) read as they are, float32 math inside, each output element rounded
# once to float16: the rounding alone is up to 2^-11 ~ 4.9e-4 relative, and the backward
# reads the rounded O (delta = rowsum(dO * O)), so a few 1e-3 relative, with an absolute
# floor of HALF_ATOL times the reference's largest element, at least 1 (inputs are O(1):
# elements near 0 keep float16 spacing, and gradients that vanish mathematically, dq and dk
# at T = 1, keep float32 rounding).
HALF_RTOL, HALF_ATOL = 4e-3, 2e-3


def half_close(actual, expected):
    actual = np.asarray(actual)
    assert actual.dtype == np.float16, actual.dtype
    expected = np.asarray(expected, np.float64)
    scale = max(float(np.max(np.abs(expected))), 1e-30)
    assert_close(actual.astype(np.float64), expected, rtol=HALF_RTOL, atol_scale=HALF_ATOL * max(scale, 1.0) / scale)


def half_rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float16)


def np_attention(q, k, v, scale):
    """Causal attention and the row log-sum-exp in float64 ([..., T, D] arrays)."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    t = q.shape[-2]
    s = q @ np.swapaxes(k, -1, -2) * scale
    s[..., np.triu(np.ones((t, t), bool), 1)] = -np.inf
    m = s.max(-1, keepdims=True)
    e = np.exp(s - m)
    return (e @ v) / e.sum(-1, keepdims=True), m[..., 0] + np.log(e.sum(-1))


# T 1, 7, 33, 129 (past two tiles); head sizes of the GPT configs (16, 32, 64), two
# 64-column chunks (128) and odd ones (7: scalar loads at odd element offsets);
# B*H 1 and 7.
HALF_SHAPES = [(1, 1, 1, 16), (1, 7, 7, 64), (7, 1, 33, 32), (1, 1, 129, 64), (1, 7, 129, 7), (1, 1, 33, 128)]


@pytest.mark.parametrize("b,h,t,d", HALF_SHAPES)
def test_half_forward_backward(dev, rng, b, h, t, d):
    """float16 SDPA: a float16 result against float64 NumPy on the float16 inputs, float16
    gradients against torch's float64 autograd."""
    q, k, v, g = (half_rand(rng, b, h, t, d) for _ in range(4))
    out, dq, dk, dv = run_fused(dev, q, k, v, g)
    half_close(out, np_attention(q, k, v, 1 / math.sqrt(d))[0])
    for got, want in zip((dq, dk, dv), torch_ref(q, k, v, g)[1:]):
        half_close(got, want)


@pytest.mark.parametrize(
    "b,t,c,h,max_blocks", [(2, 7, 96, 4, 0), (1, 130, 21, 3, 1), (3, 129, 128, 2, 2), (1, 65, 256, 2, 1)]
)
def test_half_raw_kernels_strided_qkv(dev, rng, b, t, c, h, max_blocks):
    """The float16 launchers on the GPT layout (q, k, v and dq, dk, dv column blocks of one
    [B, T, 3C] float16 buffer; C = 21 puts k and v at odd element offsets), outputs poisoned
    with NaN; max_blocks > 0 splits the block loops over dispatches, whose float32 partial
    results go through the scratch and are rounded once by the last; beta = 1 accumulates."""
    d = c // h
    qkv, g = half_rand(rng, b, t, 3 * c), half_rand(rng, b, t, c)
    (qv, kv, vv), ov = qkv_views(b, t, c, h)
    x, tg = pw.tensor(qkv, dev), pw.tensor(g, dev)
    out = pw.tensor(np.full((b, t, c), np.nan, np.float16), dev)
    lse = poisoned(dev, (b * h * t,))
    scale = 1 / math.sqrt(d)
    with dev._recording() as rec:
        _core.attention_forward(
            rec, x._buf, qv, x._buf, kv, x._buf, vv, out._buf, ov, lse._buf, b, h, t, d, scale, max_blocks, True
        )
    grad = pw.tensor(np.full((b, t, 3 * c), np.nan, np.float16), dev)
    delta = poisoned(dev, (b * h * t,))

    def backward(beta):
        operands = (x._buf, qv, x._buf, kv, x._buf, vv, out._buf, ov, tg._buf, ov, lse._buf, delta._buf)
        with dev._recording() as rec:
            _core.attention_backward(
                rec, *operands, grad._buf, qv, grad._buf, kv, grad._buf, vv, b, h, t, d, scale, beta, max_blocks, True
            )

    backward(0.0)
    q, k, v = split_heads(qkv, h)
    ro, rlse = np_attention(q, k, v, scale)
    half_close(out.numpy(), merge_heads(ro))
    close(lse.numpy(), rlse.reshape(-1))
    _, rdq, rdk, rdv = torch_ref(q, k, v, split_heads(np.concatenate([g] * 3, axis=2), h)[0])
    want = np.concatenate([merge_heads(rdq), merge_heads(rdk), merge_heads(rdv)], axis=2)
    half_close(grad.numpy(), want)
    backward(1.0)
    half_close(grad.numpy(), 2 * want)


@pytest.mark.parametrize("b,t,c,h", [(2, 33, 96, 4), (1, 129, 21, 3)])
def test_half_qkv_entry(dev, rng, b, t, c, h):
    """causal_self_attention_qkv on a float16 [B, T, 3C]: float16 out and gradient; a second
    backward accumulates into the float16 .grad."""
    qkv, g = half_rand(rng, b, t, 3 * c), half_rand(rng, b, t, c)
    x = pw.tensor(qkv, dev, requires_grad=True)
    out = F.causal_self_attention_qkv(x, h)
    out.backward(pw.tensor(g, dev))
    q, k, v = split_heads(qkv, h)
    half_close(out.numpy(), merge_heads(np_attention(q, k, v, 1 / math.sqrt(c // h))[0]))
    _, rdq, rdk, rdv = torch_ref(q, k, v, split_heads(np.concatenate([g] * 3, axis=2), h)[0])
    want = np.concatenate([merge_heads(rdq), merge_heads(rdk), merge_heads(rdv)], axis=2)
    half_close(x.grad.numpy(), want)
    F.causal_self_attention_qkv(x, h).backward(pw.tensor(g, dev))
    half_close(x.grad.numpy(), 2 * want)


def test_half_launcher_errors(dev, rng):
    """float16 views are counted in 2-byte elements: a view past the buffer names its element count."""
    buf = pw.tensor(half_rand(rng, 64), dev)
    out, lse = pw.empty((64,), np.float16, dev), pw.empty((8,), np.float32, dev)
    v0 = (0, 0, 0, 8)
    with dev._recording() as rec:
        with pytest.raises(ValueError, match="q reaches element 64, its buffer holds 64 elements of 2 bytes"):
            _core.attention_forward(
                rec,
                buf._buf,
                (57, 0, 0, 0),
                buf._buf,
                v0,
                buf._buf,
                v0,
                out._buf,
                v0,
                lse._buf,
                1,
                1,
                1,
                8,
                1.0,
                0,
                True,
            )


def test_half_split_scratch_past_one_binding(dev, rng):
    """A float16 block loop split over dispatches whose float32 partial results would exceed
    one storage binding is refused, naming the limit, before anything is recorded (the heads
    all read one small buffer: views with sb = sh = 0)."""
    t, d = 128, 128  # two key blocks; max_blocks = 1 makes two dispatches
    h = dev.limits["max_storage_buffer_binding_size"] // (t * d * 4) + 1
    x, g = pw.tensor(half_rand(rng, t, d), dev), pw.tensor(half_rand(rng, t, d), dev)
    out, grads = pw.empty((t, d), np.float16, dev), pw.empty((t, d), np.float16, dev)
    lse, delta = pw.empty((h * t,), np.float32, dev), pw.empty((h * t,), np.float32, dev)
    v = (0, 0, 0, d)
    match = "float32 partial results .* exceed one storage binding"
    with dev._recording() as rec:
        with pytest.raises(ValueError, match=match):
            _core.attention_forward(
                rec, x._buf, v, x._buf, v, x._buf, v, out._buf, v, lse._buf, 1, h, t, d, 1.0, 1, True
            )
        with pytest.raises(ValueError, match=match):
            _core.attention_backward(
                rec,
                *(x._buf, v) * 3,
                out._buf,
                v,
                g._buf,
                v,
                lse._buf,
                delta._buf,
                *(grads._buf, v) * 3,
                1,
                h,
                t,
                d,
                1.0,
                0.0,
                1,
                True,
            )


# -- torch's scaled_dot_product_attention semantics beyond the causal self-attention ------------


def sdpa_ref(q, k, v, g, **kw):
    """torch's SDPA in float64 (its math path) and the gradients of its inputs (None: no grad)."""
    ts = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v)]
    mask = kw.pop("attn_mask", None)
    if mask is not None:
        mask = torch.from_numpy(mask if mask.dtype == np.bool_ else mask.astype(np.float64))
    out = torch.nn.functional.scaled_dot_product_attention(*ts, attn_mask=mask, **kw)
    out.backward(torch.tensor(g, dtype=torch.float64))
    return [out.detach().numpy()] + [t.grad.numpy() for t in ts]


def sdpa_ours(dev, q, k, v, g, **kw):
    ts = [pw.tensor(x, dev, requires_grad=True) for x in (q, k, v)]
    out = F.scaled_dot_product_attention(*ts, **kw)
    out.backward(pw.tensor(g, dev))
    return [out.numpy()] + [t.grad.numpy() for t in ts]


# (B, H, L, S, D): a key length different from the query length, shorter and longer, past a
# 64-block and not a multiple of it; both masks.
CROSS = [(1, 1, 1, 1, 8), (2, 3, 7, 33, 16), (1, 2, 129, 65, 64), (1, 1, 65, 200, 128), (2, 1, 200, 70, 24)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b,h,lq,s,d", CROSS)
def test_fused_any_key_length_and_mask(dev, rng, b, h, lq, s, d, causal):
    """The fused kernels without the causal mask (torch's default) and with it (the top-left
    triangle when L != S), against torch's float64 forward and gradients."""
    q, g = rand(rng, b, h, lq, d), rand(rng, b, h, lq, d)
    k, v = rand(rng, b, h, s, d), rand(rng, b, h, s, d)
    check_all(sdpa_ours(dev, q, k, v, g, is_causal=causal), sdpa_ref(q, k, v, g, is_causal=causal))


def test_default_is_not_causal(dev, rng):
    """is_causal defaults to False, as torch's: every key is seen."""
    q, k, v, g = (rand(rng, 1, 2, 40, 16) for _ in range(4))
    check_all(sdpa_ours(dev, q, k, v, g), sdpa_ref(q, k, v, g))


@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lq,s", [(130, 300), (300, 130)])
def test_raw_kernels_split_blocks_cross(dev, rng, lq, s, causal, half):
    """The launchers with max_blocks = 1 (one key or query block per dispatch: resumed forward,
    accumulated backward, float16's float32 scratch) at L != S, outputs poisoned first; under the
    causal mask with S > L the keys no query sees get a zero gradient."""
    b, h, d = 2, 2, 32
    dt = np.float16 if half else np.float32
    q, g = rand(rng, b, h, lq, d).astype(dt), rand(rng, b, h, lq, d).astype(dt)
    k, v = rand(rng, b, h, s, d).astype(dt), rand(rng, b, h, s, d).astype(dt)
    tq, tk, tv, tg = (pw.tensor(x, dev) for x in (q, k, v, g))
    qv, kv = (0, h * lq * d, lq * d, d), (0, h * s * d, s * d, d)
    poison = np.full((b, h, lq, d), np.nan, dt)
    out, dq = pw.tensor(poison, dev), pw.tensor(poison, dev)
    dk, dv = (pw.tensor(np.full((b, h, s, d), np.nan, dt), dev) for _ in range(2))
    lse, delta = poisoned(dev, (b * h * lq,)), poisoned(dev, (b * h * lq,))
    sc = 1 / math.sqrt(d)
    with dev._recording() as rec:
        _core.attention_forward(
            rec, tq._buf, qv, tk._buf, kv, tv._buf, kv, out._buf, qv, lse._buf, b, h, lq, d, sc, 1, half,
            tk=s, causal=causal,
        )  # fmt: skip
        _core.attention_backward(
            rec, tq._buf, qv, tk._buf, kv, tv._buf, kv, out._buf, qv, tg._buf, qv, lse._buf, delta._buf,
            dq._buf, qv, dk._buf, kv, dv._buf, kv, b, h, lq, d, sc, 0.0, 1, half, tk=s, causal=causal,
        )  # fmt: skip
    refs = sdpa_ref(*(x.astype(np.float64) for x in (q, k, v, g)), is_causal=causal)
    factor = 40.0 if half else 1.0  # float16 operands and results: half-precision rounding
    for got, want in zip((out, dq, dk, dv), refs):
        close(got.numpy().astype(np.float64), want, factor)


@pytest.mark.parametrize(
    "shape_q,shape_kv",
    [((3, 9, 16), (3, 20, 16)), ((2, 2, 2, 5, 8), (2, 2, 2, 6, 8)), ((1, 2, 4, 129), (1, 2, 6, 129))],
)
def test_other_ranks_written_out(dev, rng, shape_q, shape_kv):
    """3-D and 5-D operands and a head size past the fused kernels' 128 (written out) as torch's
    math path."""
    q, g = rand(rng, *shape_q), rand(rng, *shape_q)
    k, v = rand(rng, *shape_kv), rand(rng, *shape_kv)
    for causal in (False, True):
        check_all(sdpa_ours(dev, q, k, v, g, is_causal=causal), sdpa_ref(q, k, v, g, is_causal=causal))


def test_masks_like_torch(dev, rng):
    """A boolean mask (True: the key takes part) and a float mask added to the scores, broadcast
    from [L, S] and [B, 1, L, S]; a value head size different from the query's."""
    b, h, lq, s, d, dv = 2, 3, 17, 23, 16, 12
    q, g = rand(rng, b, h, lq, d), rand(rng, b, h, lq, dv)
    k, v = rand(rng, b, h, s, d), rand(rng, b, h, s, dv)
    keep = rng.random((lq, s)) < 0.7
    keep[:, 0] = True  # no fully masked row (its NaN-or-0 answer depends on torch's kernel)
    check_all(sdpa_ours(dev, q, k, v, g, attn_mask=keep), sdpa_ref(q, k, v, g, attn_mask=keep))
    bias = rand(rng, b, 1, lq, s)
    check_all(sdpa_ours(dev, q, k, v, g, attn_mask=bias), sdpa_ref(q, k, v, g, attn_mask=bias))
    ts = [pw.tensor(x, dev) for x in (q, k, v)]
    out = F.scaled_dot_product_attention(*ts, attn_mask=pw.tensor(bias, dev), scale=0.3)
    ref = sdpa_ref(q, k, v, g, attn_mask=bias, scale=0.3)[0]
    close(out.numpy(), ref)


def test_grouped_query_attention(dev, rng):
    """enable_gqa: 6 query heads over 2 key/value heads (query head i reads head i // 3), fused
    (no mask) and written out (a mask)."""
    q, g = rand(rng, 2, 6, 33, 16), rand(rng, 2, 6, 33, 16)
    k, v = rand(rng, 2, 2, 40, 16), rand(rng, 2, 2, 40, 16)
    for kw in ({"is_causal": True}, {"attn_mask": rng.random((33, 40)) < 0.8}):
        kw_ref = dict(kw)
        check_all(sdpa_ours(dev, q, k, v, g, enable_gqa=True, **kw), sdpa_ref(q, k, v, g, enable_gqa=True, **kw_ref))


def test_dropout_on_the_weights(dev, rng):
    """dropout_p = 1 drops every weight (a zero output and zero gradients, as torch); 0 < p < 1
    scales the kept weights by 1 / (1 - p), so the output is a kept-weight sum of value rows."""
    q, k, v = (pw.tensor(rand(rng, 1, 2, 9, 8), dev, requires_grad=True) for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=1.0)
    out.sum().backward()
    assert not out.numpy().any() and not v.grad.numpy().any() and not q.grad.numpy().any()
    ones = pw.tensor(np.ones((1, 1, 5, 4), np.float32), dev)
    out = F.scaled_dot_product_attention(ones, ones, ones, dropout_p=0.5).numpy()
    # equal scores: weights 1/5, kept ones doubled -> each output element is 0.4 * (kept keys)
    kept = out / 0.4
    assert np.allclose(kept, np.round(kept), atol=1e-5) and (out >= 0).all()
    assert np.all(out == out[..., :1])  # one weight row per query scales a constant value column


def test_sdpa_argument_errors(dev, rng):
    q = pw.tensor(rand(rng, 1, 2, 5, 8), dev)
    k6 = pw.tensor(rand(rng, 1, 2, 6, 8), dev)
    with pytest.raises(ValueError, match="attn_mask or is_causal"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=np.ones((5, 5), bool), is_causal=True)
    with pytest.raises(ValueError, match="dropout_p"):
        F.scaled_dot_product_attention(q, q, q, dropout_p=1.5)
    with pytest.raises(ValueError, match="last dimension"):
        F.scaled_dot_product_attention(q, pw.tensor(rand(rng, 1, 2, 5, 4), dev), q)
    with pytest.raises(ValueError, match="differ before the last dimension"):
        F.scaled_dot_product_attention(q, k6, q)
    with pytest.raises(ValueError, match="multiple of key heads"):
        F.scaled_dot_product_attention(pw.tensor(rand(rng, 1, 3, 5, 8), dev), q, q, enable_gqa=True)
    with pytest.raises(TypeError, match="attn_mask"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=np.zeros((5, 5)))


@pytest.mark.parametrize("form", ["bool_b11s", "float_b11s", "float_1s", "bool_11s_half"])
def test_key_padding_mask_runs_fused_like_torch(dev, rng, monkeypatch, form):
    """A mask that depends on the batch and the key only (a key padding mask) runs the fused
    kernels (the written-out path's matmul is not called) with torch's values and gradients."""
    b, h, lq, s, d = 2, 3, 37, 70, 16
    half = form.endswith("half")
    q, g = rand(rng, b, h, lq, d), rand(rng, b, h, lq, d)
    k, v = rand(rng, b, h, s, d), rand(rng, b, h, s, d)
    keep = np.ones((b, 1, 1, s), bool)
    keep[0, ..., -20:] = False
    keep[1, ..., 3:9] = False
    if form.startswith("bool"):
        mask = keep if form == "bool_b11s" else keep[:1]
    elif form == "float_b11s":
        mask = np.where(keep, rand(rng, b, 1, 1, s), -np.inf).astype(np.float32)
    else:
        mask = rand(rng, 1, s)
    monkeypatch.setattr(pw.functions, "matmul", None)  # the written-out path would fail
    if half:
        q, k, v, g = (x.astype(np.float16) for x in (q, k, v, g))
    ts = [pw.tensor(x, dev, requires_grad=True) for x in (q, k, v)]
    ours_mask = mask if mask.dtype == np.bool_ else pw.tensor(mask, dev)
    out = F.scaled_dot_product_attention(*ts, attn_mask=ours_mask)
    out.backward(pw.tensor(g, dev))
    refs = sdpa_ref(*(x.astype(np.float64) for x in (q, k, v, g)), attn_mask=mask)
    factor = 40.0 if half else 1.0
    for got, want in zip([out] + [t.grad for t in ts], refs):
        close(got.numpy().astype(np.float64), want, factor)


def test_key_bias_split_blocks_half(dev, rng):
    """The raw launchers with a key bias, one block per dispatch (resumed forward, accumulated
    backward through float16's float32 scratch), outputs poisoned first."""
    b, h, lq, s, d = 2, 2, 130, 200, 32
    q, g = (rand(rng, b, h, lq, d).astype(np.float16) for _ in range(2))
    k, v = (rand(rng, b, h, s, d).astype(np.float16) for _ in range(2))
    bias = rand(rng, b, s)
    bias[1, 150:] = -np.inf
    tq, tk, tv, tg, tb = (pw.tensor(x, dev) for x in (q, k, v, g, bias))
    qv, kv = (0, h * lq * d, lq * d, d), (0, h * s * d, s * d, d)
    out, dq = (pw.tensor(np.full((b, h, lq, d), np.nan, np.float16), dev) for _ in range(2))
    dk, dv = (pw.tensor(np.full((b, h, s, d), np.nan, np.float16), dev) for _ in range(2))
    lse, delta = poisoned(dev, (b * h * lq,)), poisoned(dev, (b * h * lq,))
    sc = 1 / math.sqrt(d)
    with dev._recording() as rec:
        _core.attention_forward(
            rec, tq._buf, qv, tk._buf, kv, tv._buf, kv, out._buf, qv, lse._buf, b, h, lq, d, sc, 1, True,
            tk=s, causal=False, kbias=tb._buf,
        )  # fmt: skip
        _core.attention_backward(
            rec, tq._buf, qv, tk._buf, kv, tv._buf, kv, out._buf, qv, tg._buf, qv, lse._buf, delta._buf,
            dq._buf, qv, dk._buf, kv, dv._buf, kv, b, h, lq, d, sc, 0.0, 1, True, tk=s, causal=False, kbias=tb._buf,
        )  # fmt: skip
    refs = sdpa_ref(*(x.astype(np.float64) for x in (q, k, v, g)), attn_mask=bias[:, None, None, :].astype(np.float64))
    for got, want in zip((out, dq, dk, dv), refs):
        close(got.numpy().astype(np.float64), want, 40.0)
