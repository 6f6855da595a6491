"""float16 tensors: storage, views, casts (cast.wgsl) and their autograd."""

import numpy as np
import pytest
import torch

import pywgtrain as pw
from helpers import switched_device

SIZES = (1, 7, 33, 129, 4099)


def bits16(a):
    return np.asarray(a, np.float16).view(np.uint16)


def assert_same_halves(actual, expected):
    """Bit for bit, NaN matching any NaN (payloads are not specified)."""
    actual, expected = np.asarray(actual), np.asarray(expected, np.float16)
    assert actual.dtype == np.float16 and actual.shape == expected.shape
    nan = np.isnan(expected)
    assert np.array_equal(np.isnan(actual), nan)
    np.testing.assert_array_equal(bits16(actual)[~nan], bits16(expected)[~nan])


def special_floats():
    """float32 values at float16's edges: overflow, the rounding boundary to inf, subnormals,
    the half-way points below the smallest subnormal, infinities and NaN."""
    tiny = 2.0**-24
    vals = [0.0, -0.0, 1.0, -2.5, 65504.0, 65519.996, 65520.0, 65536.0, 1e5, 3.4e38, -1e9, np.inf, -np.inf, np.nan]
    vals += [tiny, tiny / 2, tiny / 2 * (1 + 2**-20), tiny * 1.5, tiny * 2.5, tiny * 1023, tiny * 1023.5, 2.0**-14]
    vals += [2.0**-14 * (1 - 2**-11), 1e-10, -1e-30, 1.401298464324817e-45]
    return np.array(vals + [-v for v in vals], np.float32)


@pytest.mark.parametrize("n", SIZES)
def test_half_matches_numpy_on_random_and_special_values(dev, rng, n):
    x = (rng.standard_normal(n) * 2.0 ** rng.uniform(-30, 20, n)).astype(np.float32)
    special = special_floats()
    x[: min(n, special.size)] = special[: min(n, special.size)]
    h = pw.tensor(x, dev).half()
    assert h.dtype == np.float16 and h.shape == (n,)
    with np.errstate(over="ignore"):  # overflow to inf is the point
        assert_same_halves(h.numpy(), x.astype(np.float16))


def test_every_half_and_every_tie_rounds_as_numpy(dev):
    """All 65536 float16 patterns widen exactly; the float32 half-way points between neighbouring
    float16 values (and their neighbours) round to even as NumPy and torch do."""
    every = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    wide = pw.tensor(every, dev).float().numpy()
    ref = every.astype(np.float32)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(wide), nan)
    np.testing.assert_array_equal(wide.view(np.uint32)[~nan], ref.view(np.uint32)[~nan])
    finite = ref[np.isfinite(ref) & (ref >= 0)]
    finite = np.unique(finite)
    mids = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)
    probe = np.concatenate([mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(0))])
    probe = np.concatenate([probe, -probe])
    assert_same_halves(pw.tensor(probe, dev).half().numpy(), probe.astype(np.float16))
    assert_same_halves(
        torch.from_numpy(probe).half().numpy(), pw.tensor(probe, dev).to(np.float16).numpy()
    )  # torch's cast agrees too


@pytest.mark.parametrize("shape", [(1,), (7, 33), (3, 1, 129)])
def test_round_trip_storage(dev, rng, shape):
    a = rng.standard_normal(shape).astype(np.float16)
    t = pw.tensor(a, dev)
    assert t.dtype == np.float16 and t.nbytes == a.nbytes
    assert_same_halves(t.numpy(), a)
    z = pw.zeros(shape, np.float16, dev)
    assert_same_halves(z.numpy(), np.zeros(shape, np.float16))
    e = pw.empty(shape, np.float16, dev)
    e.copy_(a)
    assert_same_halves(e.numpy(), a)
    assert_same_halves(t.clone().numpy(), a)
    s = pw.tensor(np.array(3.5, np.float16), dev)
    assert s.shape == () and s.item() == 3.5


def test_to_returns_self_for_its_own_dtype_and_refuses_other_casts(dev, rng):
    t = pw.tensor(rng.standard_normal(5).astype(np.float32), dev)
    assert t.to(np.float32) is t and t.float() is t
    h = t.half()
    assert h.half() is h and h.to("float16") is h
    ids = pw.tensor(np.arange(3, dtype=np.int32), dev)
    with pytest.raises(TypeError, match="between float32 and float16, got int32 -> float32"):
        ids.float()
    with pytest.raises(TypeError, match="float64"):
        t.to(np.float64)


def test_views_read_write_and_cast(dev, rng):
    a = rng.standard_normal((7, 33)).astype(np.float16)
    ref = a.copy()
    t = pw.tensor(a, dev)
    # strided, unaligned contiguous (odd offset and count), transposed, aligned rows
    for index in [np.s_[:, 1:6], np.s_[3], np.s_[1:4, 5], np.s_[2:5], np.s_[::2, ::3]]:
        assert_same_halves(t[index].numpy(), a[index])
        np.testing.assert_array_equal(t[index].float().numpy(), a[index].astype(np.float32))
    assert_same_halves(t.T.numpy(), a.T)
    np.testing.assert_array_equal(t.T.float().numpy(), a.T.astype(np.float32))
    writes = [
        (np.s_[3], rng.standard_normal(33)),  # offset 99 elements, 33 of them: both ends mid-word
        (np.s_[1:4, 5:12], rng.standard_normal((3, 7))),
        (np.s_[::3, ::4], rng.standard_normal((3, 9))),
        (np.s_[6, 32:], rng.standard_normal(1)),
    ]
    for index, value in writes:
        value = value.astype(np.float16)
        t[index] = value
        ref[index] = value
        assert_same_halves(t.numpy(), ref)  # the neighbours of every written element kept
    t[0, 1:4].zero_()
    ref[0, 1:4] = 0
    t[2, 3:5].copy_(pw.tensor(np.array([1.5, -2], np.float16), dev))
    ref[2, 3:5] = [1.5, -2]
    assert_same_halves(t.numpy(), ref)


def test_half_and_float_are_differentiable_like_torch(dev, rng):
    x = rng.standard_normal((7, 33)).astype(np.float32)
    c = (rng.standard_normal((7, 33)) * 1e3).astype(np.float32)
    d = rng.standard_normal((7, 33)).astype(np.float32)
    tx = pw.tensor(x, dev, requires_grad=True)
    y = tx.half()
    assert y.requires_grad and y.dtype == np.float16
    loss = (y.float() * pw.tensor(c, dev)).sum() + (y.float() * pw.tensor(d, dev)).sum()
    loss.backward()
    rx = torch.from_numpy(x).requires_grad_()
    ry = rx.half()
    ((ry.float() * torch.from_numpy(c)).sum() + (ry.float() * torch.from_numpy(d)).sum()).backward()
    assert tx.grad.dtype == np.float32
    np.testing.assert_array_equal(tx.grad.numpy(), rx.grad.numpy())  # one f16 rounding per term, f16 sum
    # a float16 leaf: its gradient is float16, accumulated over backward calls as torch does
    h = rng.standard_normal(129).astype(np.float16)
    th = pw.tensor(h, dev, requires_grad=True)
    rh = torch.from_numpy(h).requires_grad_()
    for scale in (c.reshape(-1)[:129], d.reshape(-1)[:129]):
        (th.float() * pw.tensor(scale, dev)).sum().backward()
        (rh.float() * torch.from_numpy(scale)).sum().backward()
    assert th.grad.dtype == np.float16
    assert_same_halves(th.grad.numpy(), rh.grad.numpy())


def test_float16_refusals(dev, rng):
    h = pw.tensor(rng.standard_normal((4, 4)).astype(np.float16), dev)
    with pytest.raises(TypeError, match="needs a float32 tensor, got float16"):
        h.fill_(1.0)
    with pytest.raises(TypeError, match="float64"):
        pw.empty((2,), np.float64, dev)
    with pytest.raises(TypeError, match="float32, float16 or int32, got float64"):
        pw.tensor(np.zeros(2), dev)
    g = pw.tensor(rng.standard_normal(6).astype(np.float16), dev, requires_grad=True)
    with pytest.raises(TypeError, match="views of float16 tensors that require grad"):
        g[1:3]
    with pytest.raises(TypeError, match="only floating-point tensors"):
        pw.tensor(np.arange(3, dtype=np.int32), dev, requires_grad=True)


@pytest.mark.slow
def test_cast_past_one_binding(dev, rng):
    """More float32 elements than one 128 MiB storage binding holds, both ways."""
    n = dev.limits["max_storage_buffer_binding_size"] // 4 + 4099
    x = (rng.standard_normal(n) * 100).astype(np.float32)
    h = pw.tensor(x, dev).half()
    got = h.numpy()
    assert_same_halves(got, x.astype(np.float16))
    back = h.float().numpy()
    np.testing.assert_array_equal(back, got.astype(np.float32))


# -- the float16 GEMM ------------------------------------------------------------
# Operands are float16 values, so the float64 product of them is the exact reference; the result
# is rounded to float16 once (half an ulp: 2^-11 relative). f32 accumulation adds at most about
# K * 2^-24 of sum|a b| (2^-20 of it is allowed); a float16 running sum over K = 4099 terms would
# be off by ~K * 2^-11 of the terms and fails that by orders of magnitude. With
# PYWGTRAIN_GEMM_F16_FMA=1 each 16-deep K tile is summed in float16 first: its error grows like
# 2^-11 of a chunk's sum, bounded here by 2^-9 * sqrt(16 * sum (a b)^2).
# (M, N, K); 1027 rows: a thin last tile row run as its own split-K strip (record_ragged)
GEMM_SHAPES = [(1, 1, 1), (7, 33, 129), (33, 7, 4099), (129, 65, 33), (70, 130, 300), (1027, 64, 520)]


def half_operand(rng, rows, cols):
    return rng.standard_normal((rows, cols)).astype(np.float16)


def gemm_reference(a, b, ta, tb, alpha=1.0, beta=0.0, c=None):
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    a64, b64 = (a64.T if ta else a64), (b64.T if tb else b64)
    ref = alpha * (a64 @ b64) + (beta * c.astype(np.float64) if beta else 0.0)
    bound_f32 = np.abs(alpha) * (np.abs(a64) @ np.abs(b64)) * 2.0**-20
    bound_fma = np.abs(alpha) * np.sqrt(16 * ((a64**2) @ (b64**2))) * 2.0**-9
    return ref, bound_f32, bound_fma


def assert_half_gemm(got, ref, bound):
    got = np.asarray(got)
    assert got.dtype == np.float16 and got.shape == ref.shape
    assert np.all(np.isfinite(got)), "non-finite values (unwritten or poisoned elements)"
    err = np.abs(got.astype(np.float64) - ref)
    limit = 2.0**-11 * np.abs(ref) + bound + 2.0**-24  # (+ the smallest subnormal)
    assert np.all(err <= limit), (
        f"max excess {np.max(err - limit)} at {np.unravel_index(np.argmax(err - limit), err.shape)}"
    )


def run_half_gemm(device, rng, m, n, k, ta, tb, alpha, beta):
    a = half_operand(rng, *((k, m) if ta else (m, k)))
    b = half_operand(rng, *((n, k) if tb else (k, n)))
    c0 = half_operand(rng, m, n)
    out = pw.tensor(c0 if beta else np.full((m, n), np.nan, np.float16), device)
    pw.gemm(pw.tensor(a, device), pw.tensor(b, device), ta, tb, alpha=alpha, beta=beta, out=out)
    return out.numpy(), gemm_reference(a, b, ta, tb, alpha, beta, c0)


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("shape", GEMM_SHAPES)
def test_half_gemm_against_float64(dev, rng, shape, ta, tb):
    m, n, k = shape
    for alpha, beta in ((1.0, 0.0), (0.5, -1.25)):
        got, (ref, bound, _) = run_half_gemm(dev, rng, m, n, k, ta, tb, alpha, beta)
        assert_half_gemm(got, ref, bound)


@pytest.mark.parametrize("ta,tb", [(False, False), (True, True)])
def test_half_gemm_with_f16_fmas(monkeypatch, rng, ta, tb):
    device = switched_device(monkeypatch, PYWGTRAIN_GEMM_F16_FMA="1")
    for m, n, k in [(7, 33, 129), (33, 7, 4099), (70, 130, 300)]:
        got, (ref, _, bound) = run_half_gemm(device, rng, m, n, k, ta, tb, 1.0, 0.0)
        assert_half_gemm(got, ref, bound)


@pytest.mark.parametrize("switch", [{"PYWGTRAIN_GEMM_SPLITS": "3"}, {"PYWGTRAIN_GEMM_STREAM_K": "4"}])
def test_half_gemm_on_forced_plans(monkeypatch, rng, switch):
    """Split-K and stream-K: float32 partials, reduced into float16 C."""
    device = switched_device(monkeypatch, **switch)
    for ta, tb in ((False, False), (True, False), (False, True)):
        for m, n, k in [(130, 70, 300), (65, 129, 1000)]:
            got, (ref, bound, _) = run_half_gemm(device, rng, m, n, k, ta, tb, 0.5, 1.5)
            assert_half_gemm(got, ref, bound)


def test_half_matmul_numpy_views_and_errors(dev, rng):
    a, b = half_operand(rng, 33, 129), half_operand(rng, 129, 7)
    ref, bound, _ = gemm_reference(a, b, False, False)
    assert_half_gemm(pw.gemm(a, b), ref, bound)  # NumPy in, NumPy out
    ta, tb = pw.tensor(a, dev), pw.tensor(b, dev)
    assert_half_gemm((ta @ tb).numpy(), ref, bound)
    assert_half_gemm(pw.matmul(a, tb).numpy(), ref, bound)
    # views: a strided slice and an unaligned row block of a bigger float16 tensor
    big = half_operand(rng, 140, 140)
    tbig = pw.tensor(big, dev)
    va, vb = tbig[3:36, 5:134], tbig[1:130, 3:10].contiguous()
    ref2, bound2, _ = gemm_reference(big[3:36, 5:134], big[1:130, 3:10], False, False)
    assert_half_gemm((va @ vb).numpy(), ref2, bound2)
    assert_half_gemm(pw.gemm(va, tbig[1:130, 3:10]).numpy(), ref2, bound2)
    with pytest.raises(TypeError, match="b must have dtype float16, got float32"):
        pw.gemm(a, b.astype(np.float32))
    with pytest.raises(TypeError, match="out must have dtype float16, got float32"):
        pw.gemm(ta, tb, out=pw.zeros((33, 7), device=dev))
    with pytest.raises(TypeError, match="other must be float16 like input, got float32"):
        ta @ pw.tensor(b.astype(np.float32), dev)
    with pytest.raises(TypeError, match="must be float32, got float16"):
        pw.tensor(b.astype(np.float32), dev) @ ta.T


@pytest.mark.slow
def test_half_gemm_past_one_binding(dev, rng):
    """A float16 A larger than one storage binding (cut into row blocks), NN and TN."""
    k = 1100
    m = dev.limits["max_storage_buffer_binding_size"] // (2 * k) + 37
    b = half_operand(rng, k, 5)
    for ta in (False, True):
        a = half_operand(rng, *((k, m) if ta else (m, k)))
        got = pw.gemm(a, b, trans_a=ta)
        for r0 in range(0, m, 8192):  # float64 reference in row blocks (memory)
            rows = a[:, r0 : r0 + 8192].T if ta else a[r0 : r0 + 8192]
            ref, bound, _ = gemm_reference(rows, b, False, False)
            assert_half_gemm(got[r0 : r0 + 8192], ref, bound)
