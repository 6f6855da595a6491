"""NaN and tie semantics against torch (issue 34, items 7 and 8): relu, clamp,
maximum / minimum, the fused linear epilogues, fused attention, max(), softmax,
layer_norm, std / var. Forward values must be NaN exactly where torch's are
and match elsewhere; gradients follow torch's rules (relu's threshold_backward
passes the gradient at a NaN input, clamp's gives 0 there, maximum / minimum
split ties in halves and send the whole gradient to both sides of a NaN,
max() splits over the ties or the NaNs, std's gradient is 0 at std 0).
Kernel-level outputs start poisoned twice: NaN (an unwritten element shows
among the finite ones) and a finite sentinel (an unwritten NaN position shows)."""

import numpy as np
import pytest

import pywgtrain as pw
from helpers import assert_close, poisoned, rand, switched_device
from pywgtrain import _core
from pywgtrain._opcodes import BINARY, UNARY

torch = pytest.importorskip("torch")
TF = torch.nn.functional

SIZES = [1, 7, 33, 129]
SENTINEL = 7.5e37


def sentinel(dev, shape):
    return pw.tensor(np.full(shape, SENTINEL, np.float32), dev)


def assert_nan_close(actual, expected, rtol=2e-5, what=""):
    """NaN exactly where expected has NaN; the rest as assert_close (infinities equal)."""
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected), err_msg=f"{what}: NaN positions differ")
    inf = np.isinf(expected)
    np.testing.assert_array_equal(actual[inf], expected[inf], err_msg=f"{what}: infinities differ")
    fin = np.isfinite(expected)
    if fin.any():
        assert_close(actual[fin], expected[fin], rtol=rtol, atol_scale=rtol)


def with_specials(rng, n, specials=(np.nan, 0.0, -0.0, np.inf, -np.inf, np.nan)):
    """n standard normal floats with NaN, zeros and infinities spread over them."""
    x = rng.standard_normal(n).astype(np.float32)
    pos = rng.permutation(n)[: min(n, len(specials))]
    x[pos] = np.array(specials, np.float32)[: len(pos)]
    return x


def run(dev, fn, *args):
    with dev.batch() as rec:
        fn(rec, *args)


def unary_both_poisons(dev, name, x, a=0.0, b=0.0):
    outs = []
    for fresh in (poisoned, sentinel):
        y = fresh(dev, x.size)
        run(dev, _core.unary, UNARY[name], pw.tensor(x, dev)._buf, y._buf, x.size, a, b, 0.0)
        outs.append(y.numpy())
    np.testing.assert_array_equal(outs[0], outs[1])
    return outs[0]


def unary_backward_both_poisons(dev, name, x, dy, a=0.0, b=0.0):
    tx = pw.tensor(x, dev)
    y = pw.empty(x.shape, np.float32, dev)
    run(dev, _core.unary, UNARY[name], tx._buf, y._buf, x.size, a, b, 0.0)
    outs = []
    for fresh in (poisoned, sentinel):
        dx = fresh(dev, x.size)
        run(
            dev, _core.unary_backward, UNARY[name], tx._buf, y._buf, pw.tensor(dy, dev)._buf, dx._buf, x.size, a, b, 0.0
        )
        outs.append(dx.numpy())
    np.testing.assert_array_equal(outs[0], outs[1])
    return outs[0]


def torch_grad(fn, *arrays, dy):
    ts = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]
    out = fn(*ts)
    out.backward(torch.as_tensor(np.asarray(dy, np.float64)).reshape(out.shape))
    return out.detach().numpy(), [t.grad.numpy() for t in ts]


# ---------------------------------------------------------------- relu and clamp kernels


@pytest.mark.parametrize("n", SIZES)
def test_relu_kernel_nan(dev, rng, n):
    x = with_specials(rng, n)
    dy = with_specials(rng, n, (np.inf, np.nan, -np.inf))  # torch's threshold_backward: 0 stays 0
    want, (gx,) = torch_grad(TF.relu, x, dy=dy)
    assert_nan_close(unary_both_poisons(dev, "relu", x), want, what="relu")
    assert_nan_close(unary_backward_both_poisons(dev, "relu", x, dy), gx, what="relu'")


def test_relu_backward_at_nan_passes_the_gradient(dev):
    x = np.array([np.nan, -1.0, 0.0, 2.0], np.float32)
    dy = np.array([3.0, np.inf, np.nan, 5.0], np.float32)
    want, (gx,) = torch_grad(TF.relu, x, dy=dy)
    np.testing.assert_array_equal(gx, [3.0, 0.0, 0.0, 5.0])  # torch 2.13's rule, stated
    np.testing.assert_array_equal(unary_backward_both_poisons(dev, "relu", x, dy), gx)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("bounds", [(-0.5, 0.75), (None, 0.75), (-0.5, None), (0.3, -0.2)])
def test_clamp_kernel_nan(dev, rng, n, bounds):
    lo, hi = bounds
    x = with_specials(rng, n)
    if n >= 7:
        x[-2:] = [v if v is not None else 0.0 for v in bounds]  # on the bounds: gradient 1
    dy = with_specials(rng, n, (np.inf, -np.inf))
    want, (gx,) = torch_grad(lambda t: t.clamp(lo, hi), x, dy=dy)
    a = -np.inf if lo is None else lo
    b = np.inf if hi is None else hi
    assert_nan_close(unary_both_poisons(dev, "clamp", x, a, b), want, what="clamp")
    assert_nan_close(unary_backward_both_poisons(dev, "clamp", x, dy, a, b), gx, what="clamp'")


def test_clamp_nan_bound_gives_nan(dev):
    x = np.array([-2.0, 0.5, 3.0, np.nan], np.float32)
    for lo, hi in ((np.nan, 1.0), (0.0, np.nan)):
        want = torch.tensor(x).clamp(lo, hi).numpy()
        assert np.isnan(want).all()
        assert np.isnan(unary_both_poisons(dev, "clamp", x, lo, hi)).all()


def test_tanh_and_abs_at_nan(dev):
    x = np.array([np.nan, -np.nan, 1.0, -20.0], np.float32)
    assert_nan_close(unary_both_poisons(dev, "tanh", x), np.tanh(x.astype(np.float64)), rtol=1e-6, what="tanh")
    dy = np.ones_like(x)
    _, (gx,) = torch_grad(torch.abs, x, dy=dy)  # sign(NaN) = 0 in torch
    assert_nan_close(unary_backward_both_poisons(dev, "abs", x, dy), gx, what="abs'")


# ---------------------------------------------------------------- autograd level: relu, clamp, ReLU


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize(
    "form",
    ["pw.relu", "F.relu", "Tensor.relu", "nn.ReLU", "clamp(0, 1)", "Tensor.clamp(max)"],
)
def test_relu_clamp_autograd(dev, rng, n, form):
    ours, ref = {
        "pw.relu": (pw.relu, TF.relu),
        "F.relu": (pw.nn.functional.relu, TF.relu),
        "Tensor.relu": (lambda t: t.relu(), torch.relu),
        "nn.ReLU": (pw.nn.ReLU(), torch.nn.ReLU()),
        "clamp(0, 1)": (lambda t: pw.clamp(t, 0, 1), lambda t: torch.clamp(t, 0, 1)),
        "Tensor.clamp(max)": (lambda t: t.clamp(max=0.25), lambda t: t.clamp(max=0.25)),
    }[form]
    x = with_specials(rng, 3 * n).reshape(3, n)
    dy = rand(rng, 3, n)
    want, (gx,) = torch_grad(ref, x, dy=dy)
    t = pw.tensor(x, dev, requires_grad=True)
    y = ours(t)
    y.backward(pw.tensor(dy, dev))
    assert_nan_close(y.numpy(), want, what=form)
    assert_nan_close(t.grad.numpy(), gx, what=form + " grad")


# ---------------------------------------------------------------- maximum / minimum


@pytest.mark.parametrize("name", ["maximum", "minimum"])
@pytest.mark.parametrize("shapes", [((129,), (129,)), ((7, 33), (33,)), ((33, 1), (1, 7)), ((1,), (1,))])
def test_maximum_minimum_nan_and_ties(dev, rng, name, shapes):
    sa, sb = shapes
    a = rng.integers(-2, 3, sa).astype(np.float32)  # plenty of ties
    b = rng.integers(-2, 3, sb).astype(np.float32)
    a.reshape(-1)[rng.permutation(a.size)[: max(1, a.size // 5)]] = np.nan
    b.reshape(-1)[rng.permutation(b.size)[: b.size // 6]] = np.nan
    dy = rand(rng, *np.broadcast_shapes(sa, sb))
    want, (ga, gb) = torch_grad(getattr(torch, name), a, b, dy=dy)
    ta, tb = pw.tensor(a, dev, requires_grad=True), pw.tensor(b, dev, requires_grad=True)
    y = getattr(pw, name)(ta, tb)
    y.backward(pw.tensor(dy, dev))
    assert_nan_close(y.numpy(), want, what=name)
    assert_nan_close(ta.grad.numpy(), ga, what=name + " grad a")
    assert_nan_close(tb.grad.numpy(), gb, what=name + " grad b")


def test_maximum_rules_stated(dev):
    """torch 2.13: a NaN sends the whole gradient to both sides, ties half to each,
    the smaller side exactly 0 (also for an infinite upstream gradient)."""
    a = np.array([np.nan, 1.0, 2.0, 3.0, 1.0], np.float32)
    b = np.array([1.0, 1.0, 3.0, 2.0, np.nan], np.float32)
    dy = np.array([1.0, 1.0, 1.0, np.inf, 1.0], np.float32)
    _, (ga, gb) = torch_grad(torch.maximum, a, b, dy=dy)
    np.testing.assert_array_equal(ga, [1.0, 0.5, 0.0, np.inf, 1.0])
    np.testing.assert_array_equal(gb, [1.0, 0.5, 1.0, 0.0, 1.0])
    ta, tb = pw.tensor(a, dev, requires_grad=True), pw.tensor(b, dev, requires_grad=True)
    pw.maximum(ta, tb).backward(pw.tensor(dy, dev))
    np.testing.assert_array_equal(ta.grad.numpy(), ga)
    np.testing.assert_array_equal(tb.grad.numpy(), gb)
    g = sentinel(dev, (5,))  # kernel level, sentinel-poisoned output
    run(dev, _core.binary_backward, BINARY["maximum"], 1, ta._buf, tb._buf, pw.tensor(dy, dev)._buf, g._buf,
        [5], [1], [1], 0.0)  # fmt: skip
    np.testing.assert_array_equal(g.numpy(), gb)


def test_maximum_scalar_nan(dev):
    x = np.array([np.nan, -1.0, 0.5], np.float32)
    t = pw.tensor(x, dev, requires_grad=True)
    y = pw.maximum(t, 0.5)
    y.sum().backward()
    np.testing.assert_array_equal(np.isnan(y.numpy()), [True, False, False])
    np.testing.assert_array_equal(t.grad.numpy(), [1.0, 0.0, 0.5])


# ---------------------------------------------------------------- fused linear (GEMM epilogues)


def linear_case(rng, rows, in_f, out_f):
    x = rand(rng, rows, in_f)
    w = (rand(rng, out_f, in_f) / np.sqrt(in_f)).astype(np.float32)
    bias = rand(rng, out_f)
    x[rows // 2, in_f // 3] = np.nan  # a NaN row of the pre-activation
    if out_f > 2:
        w[1, :] = np.nan  # and a NaN column
    return x, w, bias


@pytest.mark.parametrize("rows", SIZES)
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("plan", ["default", "split_k", "stream_k"])
def test_linear_relu_epilogue_nan(dev, rng, monkeypatch, rows, with_bias, plan):
    if plan == "split_k":
        dev = switched_device(monkeypatch, PYWGTRAIN_GEMM_SPLITS="3")
    elif plan == "stream_k":
        dev = switched_device(monkeypatch, PYWGTRAIN_GEMM_STREAM_K="5")
    x, w, bias = linear_case(rng, rows, 33, 129)
    dy = rand(rng, rows, 129)
    # Where the pre-activation is within float32's rounding of 0, its sign (and
    # so relu's gradient) may differ from float64's: no upstream gradient there.
    # (Seen on the H200: z = -3.6e-8 in float64 came out positive in float32 and moved a row of dW.)
    with np.errstate(invalid="ignore"):
        z64 = x.astype(np.float64) @ w.astype(np.float64).T + (bias if with_bias else 0.0)
        bound = 1e-5 * (np.abs(x).astype(np.float64) @ np.abs(w).T + (np.abs(bias) if with_bias else 0.0))
        dy[np.abs(z64) <= bound] = 0.0
    b = bias if with_bias else None
    ref_args = (x, w, bias) if with_bias else (x, w)
    want, grads = torch_grad(lambda *t: TF.relu(TF.linear(*t)), *ref_args, dy=dy)
    tx, tw = pw.tensor(x, dev, requires_grad=True), pw.tensor(w, dev, requires_grad=True)
    tb = pw.tensor(b, dev, requires_grad=True) if with_bias else None
    y = pw.nn.functional.linear(tx, tw, tb, activation="relu")
    y.backward(pw.tensor(dy, dev))
    assert_nan_close(y.numpy(), want, what="linear relu")
    for t, g, what in zip((tx, tw, tb), grads, ("dx", "dw", "db")):
        assert_nan_close(t.grad.numpy(), g, rtol=1e-4, what=what)


@pytest.mark.parametrize("rows", SIZES)
def test_gemm_bias_act_kernel_poisoned(dev, rng, rows):
    x, w, bias = linear_case(rng, rows, 7, 33)
    want = TF.relu(TF.linear(*(torch.tensor(a, dtype=torch.float64) for a in (x, w, bias)))).numpy()
    outs = []
    for fresh in (poisoned, sentinel):
        y, z = fresh(dev, (rows, 33)), fresh(dev, (rows, 33))
        with dev.batch() as rec:
            _core.gemm_bias_act(rec, pw.tensor(x, dev)._buf, pw.tensor(w, dev)._buf, pw.tensor(bias, dev)._buf,
                                y._buf, z._buf, rows, 33, 7, False, True, 1)  # fmt: skip
        outs.append(y.numpy())
    assert_nan_close(outs[0], want, what="gemm_bias_act relu")
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("rows", [7, 129])
def test_stacked_relu_layers_act_grad_epilogue(dev, rng, rows):
    """Linear -> ReLU -> Linear -> ReLU (nn.Sequential fuses them): the first layer's
    input gradient leaves the second's GEMM through the ACT_GRAD epilogue, which must
    pass the gradient at the NaN pre-activations, as torch does."""
    ref = torch.nn.Sequential(torch.nn.Linear(33, 65), torch.nn.ReLU(), torch.nn.Linear(65, 17), torch.nn.ReLU())
    with torch.no_grad():
        ref[0].bias[3] = float("nan")  # column 3 of the first pre-activation is NaN
    model = pw.nn.Sequential(
        pw.nn.Linear(33, 65, device=dev), pw.nn.ReLU(), pw.nn.Linear(65, 17, device=dev), pw.nn.ReLU()
    )
    model.load_state_dict({k: v.detach().numpy().astype(np.float32) for k, v in ref.state_dict().items()})
    ref.double()
    x = rand(rng, rows, 33)
    dy = rand(rng, rows, 17)
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    yt = ref(xt)
    yt.backward(torch.tensor(dy, dtype=torch.float64))
    tx = pw.tensor(x, dev, requires_grad=True)
    y = model(tx)
    y.backward(pw.tensor(dy, dev))
    assert_nan_close(y.numpy(), yt.detach().numpy(), what="forward")
    assert_nan_close(tx.grad.numpy(), xt.grad.numpy(), rtol=1e-4, what="dx")
    for (name, p), (_, rp) in zip(model.named_parameters(), ref.named_parameters()):
        assert_nan_close(p.grad.numpy(), rp.grad.numpy(), rtol=1e-4, what=name)


# ---------------------------------------------------------------- fused attention


def nan_key_qkv(rng, b, h, t, d, nan_at):
    q, k, v = (rand(rng, b, h, t, d) for _ in range(3))
    k[0, h - 1, nan_at] = np.nan
    return q, k, v


@pytest.mark.parametrize("t", SIZES)
def test_attention_nan_key_row(dev, rng, t):
    d = 8
    nan_at = t // 2
    q, k, v = nan_key_qkv(rng, 2, 2, t, d, nan_at)
    dy = rand(rng, 2, 2, t, d)
    ts = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    # torch's default CPU kernel treats a row whose only visible key is NaN (t = 1) as fully
    # masked and returns 0 there; its math kernel, like ours, NaN.
    backend = torch.nn.attention.SDPBackend.MATH if t == 1 else torch.nn.attention.SDPBackend.FLASH_ATTENTION
    with torch.nn.attention.sdpa_kernel(backend):
        want = TF.scaled_dot_product_attention(*ts, is_causal=True)
    want.backward(torch.tensor(dy))
    want = want.detach().numpy()
    assert np.isnan(want[0, 1, nan_at:]).all() and not np.isnan(want[0, 1, :nan_at]).any()
    tq, tk, tv = (pw.tensor(a, dev, requires_grad=True) for a in (q, k, v))
    out = pw.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
    out.backward(pw.tensor(dy, dev))
    assert_nan_close(out.numpy(), want, rtol=1e-4, what="attention forward")
    # Heads without the NaN key: gradients as torch's. The head with it: NaN wherever
    # the math needs it (every row from the NaN key on; dK, dV everywhere, through
    # delta); torch's kernel also spills NaN into dQ rows before the key (0 * NaN in
    # its block products) that ours may keep finite when they lie in earlier blocks.
    for ours, ref, what in zip((tq, tk, tv), ts, ("dq", "dk", "dv")):
        g, gt = ours.grad.numpy(), ref.grad.numpy()
        assert_close(g[1], gt[1], rtol=1e-4, atol_scale=1e-4, magnitude=1.0)  # dq = 0 at t = 1
        assert_close(g[0, 0], gt[0, 0], rtol=1e-4, atol_scale=1e-4, magnitude=1.0)
        assert not (np.isnan(g[0, 1]) & ~np.isnan(gt[0, 1])).any(), what
        rows = slice(nan_at, None) if what == "dq" else slice(None)
        assert np.isnan(g[0, 1, rows]).all(), what


@pytest.mark.parametrize("t", [7, 129])
def test_causal_self_attention_qkv_nan_key_row(dev, rng, t):
    n_head, d = 2, 8
    c = n_head * d
    qkv = rand(rng, 1, t, 3 * c)
    nan_at = t - 3
    qkv[0, nan_at, c + d : c + 2 * d] = np.nan  # key row nan_at of head 1
    out = pw.nn.functional.causal_self_attention_qkv(pw.tensor(qkv, dev), n_head).numpy()
    q, k, v = (torch.tensor(qkv[..., i * c : (i + 1) * c]).reshape(1, t, n_head, d).transpose(1, 2) for i in range(3))
    want = TF.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(1, t, c).numpy()
    assert np.isnan(want[0, nan_at:, d:]).all()
    assert_nan_close(out, want, rtol=1e-4, what="causal_self_attention_qkv")


# ---------------------------------------------------------------- reductions


@pytest.mark.parametrize("shape", [(1,), (7,), (33, 7), (3, 129)])
@pytest.mark.parametrize("case", ["ties", "nan", "nans", "all_equal"])
def test_max_all_splits_gradient_like_torch(dev, rng, shape, case):
    x = rng.integers(-3, 3, shape).astype(np.float32)
    flat = x.reshape(-1)
    if case == "ties":
        flat[rng.permutation(flat.size)[: min(3, flat.size)]] = 5.0
    elif case == "nan":
        flat[rng.integers(flat.size)] = np.nan
    elif case == "nans":
        flat[rng.permutation(flat.size)[: min(4, flat.size)]] = np.nan
    else:
        flat[:] = 2.0
    want, (gx,) = torch_grad(torch.max, x, dy=np.array(3.0))
    t = pw.tensor(x, dev, requires_grad=True)
    y = pw.max(t)
    assert y.shape == ()
    (y * 3.0).backward()
    assert_nan_close(y.numpy(), want, what="max()")
    np.testing.assert_allclose(t.grad.numpy(), gx, rtol=1e-6, atol=0)
    t.grad = None
    y = t.max()
    y.backward(pw.tensor(np.array(np.inf, np.float32), dev))  # exactly 0 off the max, as torch
    _, (gi,) = torch_grad(torch.max, x, dy=np.array(np.inf))
    np.testing.assert_array_equal(t.grad.numpy(), gi)


@pytest.mark.parametrize("shape,dim", [((7, 33), 1), ((33, 7), 0), ((3, 129, 2), 1), ((1, 1), 0)])
def test_max_dim_nan_and_ties(dev, rng, shape, dim):
    x = rng.integers(-2, 2, shape).astype(np.float32)  # ties everywhere
    x.reshape(-1)[rng.permutation(x.size)[: x.size // 9]] = np.nan
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    vt, it = xt.max(dim)
    dy = rand(rng, *vt.shape)
    vt.backward(torch.tensor(dy, dtype=torch.float64))
    t = pw.tensor(x, dev, requires_grad=True)
    v, i = pw.max(t, dim)
    v.backward(pw.tensor(dy, dev))
    assert_nan_close(v.numpy(), vt.detach().numpy(), what="max(dim) values")
    np.testing.assert_array_equal(i.numpy(), it.numpy())  # first max, first NaN
    np.testing.assert_array_equal(t.grad.numpy(), xt.grad.numpy())  # all to the returned index


@pytest.mark.parametrize("cols", SIZES)
def test_softmax_and_log_softmax_nan_rows(dev, rng, cols):
    x = rand(rng, 3, cols)
    x[1, cols // 2] = np.nan
    for ours, ref in ((pw.softmax, torch.softmax), (pw.log_softmax, torch.log_softmax)):
        assert_nan_close(ours(pw.tensor(x, dev), -1).numpy(), ref(torch.tensor(x, dtype=torch.float64), -1).numpy())


@pytest.mark.parametrize("cols", [7, 129])
def test_layer_norm_nan_row(dev, rng, cols):
    x = rand(rng, 3, cols)
    x[1, 2] = np.nan
    dy = rand(rng, 3, cols)
    want, (gx,) = torch_grad(lambda t: TF.layer_norm(t, (cols,)), x, dy=dy)
    t = pw.tensor(x, dev, requires_grad=True)
    y = pw.nn.functional.layer_norm(t, (cols,))
    y.backward(pw.tensor(dy, dev))
    assert_nan_close(y.numpy(), want, rtol=1e-4, what="layer_norm")
    assert_nan_close(t.grad.numpy(), gx, rtol=1e-4, what="layer_norm grad")


# ---------------------------------------------------------------- std / var on constant rows


@pytest.mark.parametrize("op", ["var", "std"])
@pytest.mark.parametrize("cols", [7, 33, 129])
@pytest.mark.parametrize("kw", [{}, {"correction": 0}, {"unbiased": True}])
def test_std_var_constant_rows(dev, rng, op, cols, kw):
    x = rand(rng, 4, cols)
    x[1] = 2.5  # constant rows: std 0, gradient 0 in torch (not inf * 0)
    x[3] = 0.0
    dy = rand(rng, 4)
    want, (gx,) = torch_grad(lambda t: getattr(t, op)(1, **kw), x, dy=dy)
    t = pw.tensor(x, dev, requires_grad=True)
    y = getattr(t, op)(1, **kw)
    y.backward(pw.tensor(dy, dev))
    assert_nan_close(y.numpy(), want, rtol=1e-4, what=op)
    assert_nan_close(t.grad.numpy(), gx, rtol=1e-4, what=op + " grad")
    np.testing.assert_array_equal(t.grad.numpy()[[1, 3]], 0.0)


@pytest.mark.parametrize("op", ["var", "std"])
def test_std_var_all_constant_and_single_element(dev, op):
    x = np.full((3, 5), 1.25, np.float32)
    t = pw.tensor(x, dev, requires_grad=True)
    getattr(pw, op)(t).backward()
    # 0 up to the rounding of the mean (a product with the float32 1/15, where torch divides:
    # var here is ~1e-14, not 0, and its gradient ~1e-15)
    np.testing.assert_allclose(t.grad.numpy(), 0.0, rtol=0, atol=1e-12)
    # one element with Bessel's correction: NaN value and gradient, as torch (with its warning)
    with pytest.warns(UserWarning):
        want, (gx,) = torch_grad(lambda u: getattr(u, op)(), np.array([3.0], np.float32), dy=np.array(1.0))
    t = pw.tensor(np.array([3.0], np.float32), dev, requires_grad=True)
    y = getattr(pw, op)(t)
    y.backward()
    assert_nan_close(y.numpy(), want, what=op)
    assert_nan_close(t.grad.numpy(), gx, what=op + " grad")


@pytest.mark.parametrize("half", [False, True])
def test_comparisons_and_where_with_nan_like_torch(dev, half):
    """NaN != anything is true (ne, !=, with tensors and scalars, float16 too), the other
    comparisons false; a NaN condition is true in where / masked_fill (torch's bool(NaN))."""
    dt = np.float16 if half else np.float32
    a = np.array([0.0, np.nan, 1.0, 2.0, np.nan, -np.inf], dt)
    b = np.array([0.0, 1.0, np.nan, 2.0, np.nan, -np.inf], dt)
    ta, tb = pw.tensor(a, dev), pw.tensor(b, dev)
    ra, rb = torch.from_numpy(a.astype(np.float32)), torch.from_numpy(b.astype(np.float32))
    for op in ("ne", "eq", "gt", "lt", "ge", "le"):
        ours = getattr(pw.functions, op)
        np.testing.assert_array_equal(ours(ta, tb).numpy().astype(bool), getattr(torch, op)(ra, rb).numpy(), op)
        np.testing.assert_array_equal(ours(ta, 1.0).numpy().astype(bool), getattr(torch, op)(ra, 1.0).numpy(), op)
    np.testing.assert_array_equal((ta != ta).numpy().astype(bool), (ra != ra).numpy())
    got = pw.functions.where(ta, 5.0, -5.0).numpy()
    np.testing.assert_array_equal(got, torch.where(ra.bool(), 5.0, -5.0).numpy())
