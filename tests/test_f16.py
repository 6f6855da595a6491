"""float16 tensors: storage, views, casts (cast.wgsl) and their autograd; float16 GEMMs and
linear layers (fused epilogues)."""

import math

import numpy as np
import pytest
import torch

import pywgtrain as pw
from helpers import switched_device
from pywgtrain import _core

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


def test_broadcast_gradients_of_float16_leaves_sum_in_float32_like_torch(dev, rng):
    """A float16 leaf broadcast against a larger float16 tensor gets its gradient summed over
    the broadcast dimensions in float32 and rounded once (torch's half sum), read straight from
    the float16 products: leading dimensions, inner size-1 dimensions and both at once."""
    for a_shape, b_shape in (((4, 33, 7), (33, 7)), ((4, 33, 7), (33, 1)), ((5, 3, 129), (1, 3, 1))):
        a = (rng.standard_normal(a_shape) * 4).astype(np.float16)
        b = rng.standard_normal(b_shape).astype(np.float16)
        ta, tb = (pw.tensor(v, dev, requires_grad=True) for v in (a, b))
        ra, rb = (torch.from_numpy(v).requires_grad_() for v in (a, b))
        (ta * tb).float().sum().backward()
        (ra * rb).float().sum().backward()
        assert tb.grad.dtype == np.float16 and tb.grad.shape == b_shape
        assert_same_halves(tb.grad.numpy(), rb.grad.numpy())
        assert_same_halves(ta.grad.numpy(), ra.grad.numpy())


F16_VIEWS = {
    "permute": lambda t: t.permute(2, 0, 3, 1),
    "transpose": lambda t: t.transpose(0, 2),
    "unsqueeze": lambda t: t.unsqueeze(1),
    "squeeze": lambda t: t.squeeze(1),
    "expand": lambda t: t.expand(3, 4, 5, 6),
    "slice": lambda t: t[1:, :, ::2, 1:5],
    "narrow": lambda t: t.narrow(3, 2, 3),
    "select": lambda t: t[:, 0, 2],
    "chain": lambda t: t.transpose(1, 3)[:, 1:4].unsqueeze(0),
}


@pytest.mark.parametrize("name", list(F16_VIEWS))
def test_float16_views_are_differentiable_like_torch(dev, rng, name):
    """Views of float16 tensors that require grad (as torch allows): the float16 gradient lands in
    the view's region (zero elsewhere), or sums over expanded dimensions, bit for bit as torch's."""
    view = F16_VIEWS[name]
    x = rng.standard_normal((3, 1, 5, 6)).astype(np.float16)
    tx = pw.tensor(x, dev, requires_grad=True)
    rx = torch.from_numpy(x).requires_grad_()
    out = view(tx)
    w = rng.standard_normal(out.shape).astype(np.float32)
    (out.float() * pw.tensor(w, dev)).sum().backward()
    (view(rx).float() * torch.from_numpy(w)).sum().backward()
    assert tx.grad.dtype == np.float16
    assert_same_halves(tx.grad.numpy(), rx.grad.numpy())


def test_float16_in_place_write_into_a_view_is_differentiable_like_torch(dev, rng):
    """An in-place op on a view of a float16 non-leaf: the gradient outside the view's region is
    the base's, inside it goes through the in-place op (torch's CopySlices)."""
    x = rng.standard_normal((4, 6)).astype(np.float16)
    w = rng.standard_normal((4, 6)).astype(np.float32)
    tx = pw.tensor(x, dev, requires_grad=True)
    y = tx * 1.0
    y[1:3, ::2].mul_(3.0)
    (y.float() * pw.tensor(w, dev)).sum().backward()
    rx = torch.from_numpy(x).requires_grad_()
    ry = rx * 1.0
    ry[1:3, ::2].mul_(3.0)
    (ry.float() * torch.from_numpy(w)).sum().backward()
    assert_same_halves(tx.grad.numpy(), rx.grad.numpy())


def test_float16_refusals(dev, rng):
    h = pw.tensor(rng.standard_normal((4, 4)).astype(np.float16), dev)
    with pytest.raises(TypeError, match="needs a float32 tensor, got float16"):
        h.fill_(1.0)
    with pytest.raises(TypeError, match="float64"):
        pw.empty((2,), np.float64, dev)
    with pytest.raises(TypeError, match="float32, float16 or int32, got float64"):
        pw.tensor(np.zeros(2), dev)
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


@pytest.mark.parametrize("rows", ["1", "1000000000"])
def test_half_nt_as_nn_on_transposed_b(monkeypatch, rng, rows):
    """float16 NT products with many rows run as NN on a float16 transposed copy of B
    (PYWGTRAIN_GEMM_NT_ROWS=1 sends every one with N, K >= 256 that way, 10^9 none), plain and
    with alpha and beta, into poisoned outputs, against float64; the transpose is float16 to
    float16 and recorded only when asked for."""
    device = switched_device(monkeypatch, PYWGTRAIN_GEMM_NT_ROWS=rows)
    for m, n, k in [(7, 257, 300), (33, 300, 257), (130, 259, 513)]:
        for alpha, beta in ((1.0, 0.0), (0.5, -1.25)):
            got, (ref, bound, _) = run_half_gemm(device, rng, m, n, k, False, True, alpha, beta)
            assert_half_gemm(got, ref, bound)
    a, b = (pw.tensor(half_operand(rng, *s), device) for s in ((33, 300), (257, 300)))
    with device.batch() as rec:
        rec.begin_capture()
        pw.gemm(a, b, trans_b=True)
        names = rec.end_capture().kernel_names()
    transposes = [n for n in names if n.startswith("gemm:transpose;")]
    assert len(transposes) == (1 if rows == "1" else 0), names
    assert all("AB:f16" in n and "CT:f16" in n for n in transposes), transposes


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


# -- float16 linear layers: the GEMM's fused epilogues on float16 (bias, activation, residual) ----
ACTS = {"relu": (1, lambda z: np.maximum(z, 0.0)), "gelu": (3, None)}


def gelu64(z):
    return 0.5 * z * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-12))


def assert_within(got, ref, limit, what):
    got = np.asarray(got, np.float64)
    assert np.all(np.isfinite(got)), f"{what}: non-finite values (unwritten or poisoned elements)"
    excess = np.abs(got - ref) - limit
    assert np.all(excess <= 0), f"{what}: max excess {excess.max()} at {np.unravel_index(np.argmax(excess), ref.shape)}"


def nan_half(dev, shape):
    return pw.tensor(np.full(shape, np.nan, np.float16), dev)


@pytest.mark.parametrize("switch", [{}, {"PYWGTRAIN_GEMM_SPLITS": "3"}, {"PYWGTRAIN_GEMM_STREAM_K": "4"}])
def test_half_fused_epilogues_against_float64(monkeypatch, rng, switch):
    """gemm_bias_act (with and without the pre-activation), gemm_bias_residual (float16 or float32
    residual and output), gemm_act_grad, activation_backward and bias_grad on float16, outputs
    poisoned: the pre-activation is z = f16(x w^T + b) within the GEMM's bound plus one rounding,
    the output act(z) of the float32 z rounded once."""
    dev = switched_device(monkeypatch, **switch)
    for m, n, k in [(1, 33, 7), (7, 33, 129), (129, 65, 33), (70, 130, 300)]:
        x, w, b = half_operand(rng, m, k), half_operand(rng, n, k), half_operand(rng, 1, n)[0]
        acc, bound, _ = gemm_reference(x, w, False, True)
        ref_z = acc + b.astype(np.float64)
        tx, tw, tb = (pw.tensor(a, dev) for a in (x, w, b))
        for name, (code, fn) in ACTS.items():
            fn = fn or gelu64
            y, z = nan_half(dev, (m, n)), nan_half(dev, (m, n))
            y_eval = nan_half(dev, (m, n))
            with dev.batch() as rec:
                _core.gemm_bias_act(rec, tx._buf, tw._buf, tb._buf, y._buf, z._buf, m, n, k, False, True, code, True)
                _core.gemm_bias_act(rec, tx._buf, tw._buf, tb._buf, y_eval._buf, None, m, n, k, False, True, code, True)
            got_z = z.numpy().astype(np.float64)
            assert_within(got_z, ref_z, 2.0**-11 * np.abs(ref_z) + bound + 2.0**-24, f"{name} pre-activation")
            # y = act(z) of the f32 z, rounded once (+ the f32 activation's own error: activations.wgsl's
            # GELU loses bits to cancellation for z << 0)
            ref_y = fn(ref_z)
            f32_err = 2.0**-20 * (1.0 + np.abs(ref_z))
            lim_y = 2.0**-11 * np.abs(ref_y) + 1.2 * (bound + 2.0**-22 * np.abs(ref_z)) + f32_err + 2.0**-24
            assert_within(y.numpy(), ref_y, lim_y, f"{name} output")
            np.testing.assert_array_equal(y_eval.numpy(), y.numpy())  # eval and training agree bit for bit
            # backward: dZ = (dY W) * act'(Z) for the layer below, and act' alone
            dy, w_up = half_operand(rng, m, k), half_operand(rng, k, n)  # the gradient from the layer above
            dz, dz2 = nan_half(dev, (m, n)), nan_half(dev, (m, n))
            g = half_operand(rng, m, n)
            with dev.batch() as rec:
                _core.gemm_act_grad(
                    rec,
                    pw.tensor(dy, dev)._buf,
                    pw.tensor(w_up, dev)._buf,
                    z._buf,
                    dz._buf,
                    m,
                    n,
                    k,
                    False,
                    False,
                    code,
                    True,
                )
                _core.activation_backward(rec, pw.tensor(g, dev)._buf, z._buf, dz2._buf, m * n, code, True)
            prod, pbound, _ = gemm_reference(dy, w_up, False, False)
            slope = (got_z > 0).astype(np.float64) if name == "relu" else None
            if slope is None:  # d/dz gelu
                slope = 0.5 * (1.0 + np.vectorize(math.erf)(got_z / math.sqrt(2.0))) + got_z * np.exp(
                    -0.5 * got_z**2
                ) / math.sqrt(2.0 * math.pi)
            ref_dz = prod * slope
            lim = 2.0**-11 * np.abs(ref_dz) + (pbound + 2.0**-20 * np.abs(prod)) * np.abs(slope) * 2
            lim += np.abs(prod) * f32_err + 2.0**-24
            assert_within(dz.numpy(), ref_dz, lim, f"{name} act grad")
            ref_dz2 = g.astype(np.float64) * slope
            lim2 = 2.0**-10 * np.abs(ref_dz2) + np.abs(g) * f32_err + 2.0**-24
            assert_within(dz2.numpy(), ref_dz2, lim2, f"{name} act backward")
        for out_dtype in (np.float32, np.float16):
            r = rng.standard_normal((m, n)).astype(out_dtype)
            out = pw.tensor(np.full((m, n), np.nan, out_dtype), dev)
            with dev.batch() as rec:
                _core.gemm_bias_residual(
                    rec,
                    tx._buf,
                    tw._buf,
                    tb._buf,
                    pw.tensor(r, dev)._buf,
                    out._buf,
                    m,
                    n,
                    k,
                    False,
                    True,
                    True,
                    out_dtype == np.float16,
                )
            got = out.numpy()
            assert got.dtype == out_dtype
            ref = ref_z + r.astype(np.float64)
            rnd = 2.0**-11 if out_dtype == np.float16 else 2.0**-23
            assert_within(got, ref, rnd * np.abs(ref) + bound + 2.0**-24, f"bias + residual -> {out_dtype.__name__}")
        # the bias gradient: column sums of a float16 dZ in float32, + beta * db
        dzs = half_operand(rng, 3 * m + 1, n)
        db0 = half_operand(rng, 1, n)[0]
        db = pw.tensor(db0, dev)
        with dev.batch() as rec:
            _core.bias_grad(rec, pw.tensor(dzs, dev)._buf, db._buf, 3 * m + 1, n, 1.0, True)
        ref_db = dzs.astype(np.float64).sum(0) + db0
        assert_within(db.numpy(), ref_db, 2.0**-11 * np.abs(ref_db) + 2.0**-20 * np.abs(dzs).sum(0) + 2.0**-24, "db")


def torch_half_mlp(x, layers, residual, acts):
    """torch float32 ops with torch's float16 roundings between them: each linear output and each
    activation output is float16; a float32 residual is added to the float16 output in float32."""
    h = x
    for (w, b), act in zip(layers, acts):
        h = h @ w.T + (b if b is not None else 0.0)
        h = h.half().float()
        if act:
            h = {"gelu": torch.nn.functional.gelu, "relu": torch.relu}[act](h).half().float()
    if residual is not None:
        h = h + residual
        if residual.dtype == torch.float16:
            h = h.half().float()
    return h


@pytest.mark.parametrize("rows,d,hidden", [(1, 8, 16), (7, 33, 129), (64, 64, 256)])
@pytest.mark.parametrize("residual", [None, np.float32, np.float16])
def test_half_mlp_matches_torch(dev, rng, rows, d, hidden, residual):
    """F.mlp on float16 layers (GELU between them, a bias-less second layer, a residual of
    either dtype): fused epilogues forward and backward, against torch's float16 semantics."""
    x = half_operand(rng, rows, d)
    w1 = (half_operand(rng, hidden, d) * d**-0.5).astype(np.float16)
    b1 = half_operand(rng, 1, hidden)[0]
    w2 = (half_operand(rng, d, hidden) * hidden**-0.5).astype(np.float16)
    r = None if residual is None else rng.standard_normal((rows, d)).astype(residual)
    ours = [pw.tensor(a, dev, requires_grad=True) for a in (x, w1, b1, w2)]
    tr = None if r is None else pw.tensor(r, dev, requires_grad=True)
    out = pw.functions.mlp(ours[0], [ours[1], ours[3]], [ours[2], None], ["gelu", None], tr)
    assert out.dtype == (np.float16 if residual is None else residual)
    theirs = [torch.tensor(a.astype(np.float32), requires_grad=True) for a in (x, w1, b1, w2)]
    qr = None if r is None else torch.tensor(r, requires_grad=True)
    want = torch_half_mlp(theirs[0], [(theirs[1], theirs[2]), (theirs[3], None)], qr, ["gelu", None])
    assert rel(out.numpy(), want.detach().numpy()) < 2e-3
    g = rng.standard_normal((rows, d)).astype(np.float32)
    out.backward(pw.tensor(g.astype(out.dtype), dev))
    want.backward(torch.tensor(g.astype(out.dtype).astype(np.float32)))
    for p, q in zip(ours + ([tr] if tr is not None else []), theirs + ([qr] if qr is not None else [])):
        assert p.grad.dtype == p.dtype
        assert rel(p.grad.numpy(), q.grad.numpy()) < 5e-3


def test_half_linear_with_a_last_activation_and_under_autocast(dev, rng):
    """linear(..., activation) on float16 (activation_backward on float16), and nn.Linear under
    autocast: float16 out, float32 parameter gradients."""
    x, w, b = (
        half_operand(rng, 9, 20),
        (half_operand(rng, 12, 20) * 0.2).astype(np.float16),
        half_operand(rng, 1, 12)[0],
    )
    ours = [pw.tensor(a, dev, requires_grad=True) for a in (x, w, b)]
    out = pw.functions.linear(*ours, activation="relu")
    theirs = [torch.tensor(a.astype(np.float32), requires_grad=True) for a in (x, w, b)]
    want = torch_half_mlp(theirs[0], [(theirs[1], theirs[2])], None, ["relu"])
    assert out.dtype == np.float16 and rel(out.numpy(), want.detach().numpy()) < 2e-3
    g = rng.standard_normal((9, 12)).astype(np.float16)
    out.backward(pw.tensor(g, dev))
    want.backward(torch.tensor(g.astype(np.float32)))
    for p, q in zip(ours, theirs):
        assert rel(p.grad.numpy(), q.grad.numpy()) < 5e-3
    lin = pw.nn.Linear(20, 12, device=dev)
    xf = rng.standard_normal((9, 20)).astype(np.float32)
    with pw.autocast():
        y = lin(pw.tensor(xf, dev))
    assert y.dtype == np.float16
    y.float().sum().backward()
    assert lin.weight.grad.dtype == np.float32 and lin.bias.grad.dtype == np.float32
    np.testing.assert_allclose(lin.bias.grad.numpy(), np.full(12, 9.0), rtol=0, atol=0)


@pytest.mark.parametrize("rows,cols", [(1, 7), (33, 129), (7, 4099), (300, 3)])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_half_cross_entropy_against_float64(dev, rng, rows, cols, reduction):
    """Under autocast, float16 logits go into the fused cross-entropy as they are (float32
    arithmetic, float32 loss) and their gradient comes back float16."""
    x = (rng.standard_normal((rows, cols)) * 3).astype(np.float16)
    labels = rng.integers(0, cols, rows).astype(np.int32)
    labels[rng.random(rows) < 0.2] = -100
    xt = pw.tensor(x, dev, requires_grad=True)
    with pw.autocast():
        loss = pw.functions.cross_entropy(xt, pw.tensor(labels, dev), reduction=reduction)
    assert loss.dtype == np.float32
    x64 = x.astype(np.float64)
    lse = np.log(np.exp(x64 - x64.max(1, keepdims=True)).sum(1)) + x64.max(1)
    keep = labels != -100
    per_row = np.where(keep, lse - x64[np.arange(rows), np.where(keep, labels, 0)], 0.0)
    want = {"none": per_row, "sum": per_row.sum(), "mean": per_row.sum() / keep.sum() if keep.any() else np.nan}
    ref = np.asarray(want[reduction])
    if reduction == "mean" and not keep.any():
        assert np.isnan(loss.item())
        return
    np.testing.assert_allclose(loss.numpy(), ref, rtol=2e-6, atol=2e-6 * max(1.0, np.abs(ref).max()))
    g = rng.standard_normal(rows).astype(np.float32) if reduction == "none" else np.float32(1.5)
    loss.backward(pw.tensor(np.asarray(g, np.float32), dev))
    assert xt.grad.dtype == np.float16
    p = np.exp(x64 - lse[:, None])
    onehot = np.zeros_like(p)
    onehot[np.arange(rows)[keep], labels[keep]] = 1.0
    scale = np.asarray(g, np.float64) * (1.0 / keep.sum() if reduction == "mean" else 1.0)
    ref_g = (p - onehot) * (scale[:, None] if reduction == "none" else scale) * keep[:, None]
    got_g = xt.grad.numpy().astype(np.float64)
    assert np.all(np.isfinite(got_g))
    assert np.all(np.abs(got_g - ref_g) <= 2.0**-11 * np.abs(ref_g) + 1e-6 * np.abs(scale).max() + 2.0**-24)


def test_half_cross_entropy_outside_autocast_gives_float16_like_torch(dev, rng):
    x = rng.standard_normal((9, 17)).astype(np.float16)
    labels = rng.integers(0, 17, 9)
    loss = pw.functions.cross_entropy(pw.tensor(x, dev), labels)
    want = torch.nn.functional.cross_entropy(torch.tensor(x.astype(np.float32)), torch.tensor(labels)).half()
    assert loss.dtype == np.float16 and abs(float(loss.item()) - float(want)) <= 1e-3 * abs(float(want))
