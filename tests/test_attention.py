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
    out = F.scaled_dot_product_attention(x, x, x)
    out.backward(pw.tensor(g, dev))
    ro, rdq, rdk, rdv = torch_ref(x_np, x_np, x_np, g)
    close(out.numpy(), ro)
    close(x.grad.numpy(), rdq + rdk + rdv)

    q_np, k_np, v_np = (rand(rng, b, h, t, d) for _ in range(3))
    q = pw.tensor(q_np, dev, requires_grad=True)
    k0, v0 = pw.tensor(k_np, dev), pw.tensor(v_np, dev)  # no grad: the kernel writes scratch for them
    F.scaled_dot_product_attention(q, k0, v0).backward(pw.tensor(g, dev))
    k, v = pw.tensor(k_np, dev, requires_grad=True), pw.tensor(v_np, dev, requires_grad=True)
    F.scaled_dot_product_attention(q, k, v).backward(pw.tensor(g, dev))  # q.grad accumulates, k and v start fresh
    _, rdq, rdk, rdv = torch_ref(q_np, k_np, v_np, g)
    close(q.grad.numpy(), 2 * rdq)
    close(k.grad.numpy(), rdk)
    close(v.grad.numpy(), rdv)


def test_no_grad_forward_only(dev, rng):
    q, k, v = (rand(rng, 2, 2, 33, 64) for _ in range(3))
    with pw.no_grad():
        out = F.scaled_dot_product_attention(*(pw.tensor(x, dev, requires_grad=True) for x in (q, k, v)))
    assert out.grad_fn is None
    close(out.numpy(), torch_ref(q, k, v, np.zeros_like(q))[0])


def test_errors(dev, rng):
    sdpa = F.scaled_dot_product_attention
    x = pw.tensor(rand(rng, 1, 2, 8, 16), dev)
    with pytest.raises(ValueError, match="is_causal"):
        sdpa(x, x, x, is_causal=False)
    with pytest.raises(ValueError, match="attn_mask"):
        sdpa(x, x, x, attn_mask=x)
    with pytest.raises(ValueError, match="dropout"):
        sdpa(x, x, x, dropout_p=0.1)
    with pytest.raises(ValueError, match="key has shape"):
        sdpa(x, pw.tensor(rand(rng, 1, 2, 9, 16), dev), x)
    with pytest.raises(ValueError, match="value has shape"):
        sdpa(x, x, pw.tensor(rand(rng, 1, 2, 8, 8), dev))
    with pytest.raises(ValueError, match="4-D"):
        sdpa(*(pw.tensor(rand(rng, 2, 8, 16), dev),) * 3)
    big = pw.tensor(rand(rng, 1, 1, 4, 129), dev)
    with pytest.raises(ValueError, match="head size 129"):
        sdpa(big, big, big)
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
