"""Autograd over device tensors: every op's forward against float64 NumPy (via
torch in float64) and its backward against torch autograd, on fresh random
data at awkward shapes; graph semantics (reuse, detach, no_grad,
accumulation) and the errors a user meets."""

import math

import numpy as np
import pytest

import pywgtrain as pw

torch = pytest.importorskip("torch")

RTOL = 2e-5


def _close(actual, expected, what, rtol=RTOL, terms=None):
    """actual within rtol of expected's largest magnitude, or of `terms`'
    (the magnitude of the summands behind expected, where a sum may cancel)."""
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    assert np.all(np.isfinite(actual) == np.isfinite(expected)), (what, "non-finite mismatch")
    fin = np.isfinite(expected)
    if not fin.any():
        return
    scale = max(float(np.max(np.abs(expected[fin]))), 1e-6)
    if terms is not None:
        scale = max(scale, float(np.max(np.abs(terms))))
    err = float(np.max(np.abs(actual[fin] - expected[fin])))
    assert err <= rtol * scale + 1e-7, f"{what}: max error {err:.3e} vs scale {scale:.3e}"


def run_both(rng, fn, shapes, positive=False, grad=True, rtol=RTOL, seed_grad=True, summed=False, grad_terms=None):
    """fn(lib, *tensors) on pywgtrain and on torch (float64); compare the
    outputs and the input gradients for a random upstream gradient. summed:
    fn's outputs or gradients are sums (reductions, products, broadcasting),
    so each is held to the magnitude of its terms (torch's fn at |inputs|,
    and its gradient for |upstream|): a sum that cancels to near 0 keeps
    float32's error of its terms. grad_terms(y, g): for a backward that
    sums and cancels where the forward does not, the magnitude of those
    terms per input, from torch's float64 output y and the upstream g."""
    arrays = []
    for s in shapes:
        a = rng.standard_normal(s).astype(np.float32)
        if positive:
            a = np.abs(a) + 0.5
        arrays.append(a)
    ours = [pw.tensor(a, requires_grad=grad) for a in arrays]
    theirs = [torch.tensor(a.astype(np.float64), requires_grad=grad) for a in arrays]
    out = fn(pw, *ours)
    ref = fn(torch, *theirs)
    terms = None
    if summed:
        absolute = [torch.tensor(np.abs(a).astype(np.float64), requires_grad=grad) for a in arrays]
        ref_terms = fn(torch, *absolute)
        terms = ref_terms.detach().numpy()
    _close(out.numpy(), ref.detach().numpy(), "forward", rtol, terms)
    if not grad:
        return out
    g = rng.standard_normal(ref.shape).astype(np.float32)
    if ref.dim() == 0:
        g = np.ones((), np.float32)  # backward() seeds 1
        out.backward()
        ref.backward()
    else:
        out.backward(pw.tensor(g.reshape(ref.shape) if g.ndim else g.reshape(1)))
        ref.backward(torch.tensor(g.astype(np.float64)))
    if summed:
        ref_terms.backward(torch.tensor(np.abs(g).astype(np.float64)))
    for i, (o, t) in enumerate(zip(ours, theirs)):
        if t.grad is None:
            assert o.grad is None
            continue
        terms = absolute[i].grad.numpy() if summed else None
        if grad_terms is not None:
            terms = grad_terms(ref.detach().numpy(), g)[i]
        _close(o.grad.numpy(), t.grad.numpy(), f"grad of input {i}", rtol, terms)
    return out


SHAPES = [(1,), (7,), (33, 5), (3, 129), (2, 3, 257)]
UNARY = {
    "neg": lambda L, x: -x,
    "abs": lambda L, x: x.abs(),
    "exp": lambda L, x: x.exp(),
    "tanh": lambda L, x: x.tanh(),
    "sigmoid": lambda L, x: x.sigmoid(),
    "relu": lambda L, x: x.relu(),
    "silu": lambda L, x: pw.silu(x) if L is pw else torch.nn.functional.silu(x),
    "gelu": lambda L, x: pw.gelu(x) if L is pw else torch.nn.functional.gelu(x),
    "gelu_tanh": lambda L, x: (
        pw.gelu(x, approximate="tanh") if L is pw else torch.nn.functional.gelu(x, approximate="tanh")
    ),
    "pow3": lambda L, x: x**3,
    "square": lambda L, x: x.square(),
    "clamp": lambda L, x: x.clamp(-0.5, 0.7),
    "clamp_min": lambda L, x: x.clamp(min=0.1),
    "scalar_arith": lambda L, x: (2.0 - x) * 3.0 + 1.5 - x / 4.0,
}
POSITIVE = {
    "log": lambda L, x: x.log(),
    "sqrt": lambda L, x: x.sqrt(),
    "rsqrt": lambda L, x: x.rsqrt(),
    "rdiv": lambda L, x: 2.0 / x,
    "pow_frac": lambda L, x: x**1.5,
}


@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("shape", SHAPES)
def test_unary(rng, name, shape):
    run_both(rng, UNARY[name], [shape])


@pytest.mark.parametrize("name", sorted(POSITIVE))
@pytest.mark.parametrize("shape", SHAPES[:3])
def test_unary_positive_domain(rng, name, shape):
    run_both(rng, POSITIVE[name], [shape], positive=True)


BROADCAST = [
    ((7,), (7,)),
    ((33, 5), (5,)),
    ((33, 5), (33, 1)),
    ((1,), (4, 3)),
    ((2, 1, 5), (3, 1)),
    ((4, 1), (1, 6)),
    ((2, 3, 4), (2, 1, 4)),
    ((129,), ()),
]
BINARY = {
    "add": lambda L, a, b: a + b,
    "sub": lambda L, a, b: a - b,
    "mul": lambda L, a, b: a * b,
    "div": lambda L, a, b: a / (b.abs() + 0.5),
    "maximum": lambda L, a, b: L.maximum(a, b),
    "minimum": lambda L, a, b: L.minimum(a, b),
}


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("sa,sb", BROADCAST)
def test_binary_broadcasting(rng, name, sa, sb):
    run_both(rng, BINARY[name], [sa, sb], summed=True)


def test_pow_tensor_exponent(rng):
    run_both(rng, lambda L, a, b: a**b, [(5, 3), (3,)], positive=True)


def test_where_and_comparisons(rng):
    def fn(L, a, b):
        cond = a > b
        return L.where(cond, a * 2.0, b - 1.0)

    run_both(rng, fn, [(6, 7), (7,)], summed=True)


@pytest.mark.parametrize(
    "shape,dim,keepdim",
    [
        ((7,), 0, False),
        ((33, 5), 1, True),
        ((33, 5), 0, False),
        ((2, 3, 129), -1, False),
        ((2, 3, 129), 1, True),
        ((4, 5, 6), (0, 2), False),
        ((4, 5, 6), None, False),
        ((1, 9), 0, True),
        # few long lines: reduce_axis's two passes (parts, then the parts)
        ((3, 5000), None, False),
        ((20000, 3), 0, False),
        ((2, 9000), 1, True),
    ],
)
@pytest.mark.parametrize("op", ["sum", "mean", "var"])
def test_reductions(rng, shape, dim, keepdim, op):
    if op == "var" and dim is not None and math.prod(np.array(shape)[list(np.atleast_1d(dim))]) < 2:
        pytest.skip("var of one element is NaN (torch agrees; covered by the NaN check)")

    def fn(L, x):
        if dim is None:
            return getattr(x, op)()
        return getattr(x, op)(dim, keepdim=keepdim)

    run_both(rng, fn, [shape], summed=op != "var")


@pytest.mark.parametrize("shape,dim", [((7,), 0), ((33, 5), 1), ((33, 5), 0), ((2, 3, 129), -1), ((4, 5, 6), 1)])
def test_max_along_dim(rng, shape, dim):
    run_both(rng, lambda L, x: x.max(dim)[0] * 1.0, [shape])
    x = rng.standard_normal(shape).astype(np.float32)
    np.testing.assert_array_equal(pw.tensor(x).max(dim)[1].numpy(), x.argmax(dim))


def test_max_ties_send_gradient_to_first_index():
    x = pw.tensor(np.array([[1.0, 3.0, 3.0, 2.0]], np.float32), requires_grad=True)
    v, i = x.max(1)
    v.sum().backward()
    assert i.numpy().tolist() == [1]
    np.testing.assert_array_equal(x.grad.numpy(), [[0, 1, 0, 0]])


@pytest.mark.parametrize("shape", [(1, 1), (7, 33), (3, 4, 129), (2, 1000)])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax(rng, shape, op):
    # Both backwards subtract a row sum from g: softmax's y*(g - sum(g*y)),
    # log_softmax's g - exp(y)*sum(g). Where those nearly cancel, float32's
    # error of the sum's terms stays, so that is the scale the gradient is held to.
    def grad_terms(y, g):
        if op == "softmax":
            return [4.0 * y * (np.abs(g) + np.sum(np.abs(g * y), -1, keepdims=True))]
        return [4.0 * (np.abs(g) + np.exp(y) * np.sum(np.abs(g), -1, keepdims=True))]

    run_both(rng, lambda L, x: getattr(x * 4.0, op)(-1), [shape], grad_terms=grad_terms)


def test_softmax_other_axis(rng):
    run_both(rng, lambda L, x: x.softmax(0), [(5, 7)])


def test_matmul_2d_and_batched(rng):
    run_both(rng, lambda L, a, b: a @ b, [(7, 33), (33, 5)], summed=True)
    run_both(rng, lambda L, a, b: a @ b, [(3, 7, 33), (3, 33, 5)], summed=True)
    run_both(rng, lambda L, a, b: a @ b, [(2, 3, 7, 9), (9, 4)], summed=True)
    run_both(rng, lambda L, a, b: a @ b, [(9,), (9, 4)], summed=True)


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_bmm_transpose_modes(rng, ta, tb):
    B, m, n, k = 3, 17, 65, 33
    a = rng.standard_normal((B, k, m) if ta else (B, m, k)).astype(np.float32)
    b = rng.standard_normal((B, n, k) if tb else (B, k, n)).astype(np.float32)
    pa, pb = pw.tensor(a, requires_grad=True), pw.tensor(b, requires_grad=True)
    out = pw.bmm(pa, pb, trans_a=ta, trans_b=tb)
    A = torch.tensor(a.astype(np.float64), requires_grad=True)
    Bt = torch.tensor(b.astype(np.float64), requires_grad=True)
    ref = torch.bmm(A.transpose(1, 2) if ta else A, Bt.transpose(1, 2) if tb else Bt)
    _close(out.numpy(), ref.detach().numpy(), "bmm")
    g = rng.standard_normal(ref.shape)
    out.backward(pw.tensor(g.astype(np.float32)))
    ref.backward(torch.tensor(g))
    _close(pa.grad.numpy(), A.grad.numpy(), "dA")
    _close(pb.grad.numpy(), Bt.grad.numpy(), "dB")


def test_bmm_flags_must_be_bools():
    a = pw.tensor(np.ones((2, 3, 3), np.float32))
    with pytest.raises(TypeError, match="bmm: trans_b must be a bool, got str 'yes'"):
        pw.bmm(a, a, trans_b="yes")
    np.testing.assert_array_equal(pw.bmm(a, a, trans_a=np.bool_(True)).numpy(), np.full((2, 3, 3), 3.0, np.float32))


SHAPE_OPS = {
    "reshape": lambda L, x: x.reshape(5, -1) * 1.0,
    "transpose": lambda L, x: x.transpose(0, 2),
    "permute": lambda L, x: x.permute(2, 0, 1),
    "slice": lambda L, x: x[1:, :3, ::2],
    "index": lambda L, x: x[-1, 2] * 1.0,
    "narrow": lambda L, x: x.narrow(2, 1, 3),
    "split": lambda L, x: x.split(2, dim=2)[1],
    "chunk": lambda L, x: x.chunk(3, dim=1)[2] * 2.0,
    "cat": lambda L, x: L.cat([x, x * 2.0, x[:, :1]], dim=1),
    "stack": lambda L, x: L.stack([x, x + 1.0], dim=1),
    "expand": lambda L, x: x[:, :1].expand(2, 5, 4) * 1.0 if L is pw else x[:, :1].expand(2, 5, 4) * 1.0,
    "unsqueeze_squeeze": lambda L, x: x.unsqueeze(1).squeeze(1) * 1.0,
}


@pytest.mark.parametrize("name", sorted(SHAPE_OPS))
def test_shape_ops(rng, name):
    run_both(rng, SHAPE_OPS[name], [(2, 5, 4)])


def test_embedding_gather_and_deterministic_backward(rng):
    vocab, dim = 11, 7
    w = rng.standard_normal((vocab, dim)).astype(np.float32)
    ids = rng.integers(0, vocab, (5, 9)).astype(np.int32)
    ids[0, :4] = 3  # repeats
    pw_w = pw.tensor(w, requires_grad=True)
    out = pw.embedding(ids, pw_w)
    tw = torch.tensor(w.astype(np.float64), requires_grad=True)
    ref = torch.nn.functional.embedding(torch.tensor(ids.astype(np.int64)), tw)
    _close(out.numpy(), ref.detach().numpy(), "embedding")
    g = rng.standard_normal(ref.shape).astype(np.float32)
    out.backward(pw.tensor(g))
    ref.backward(torch.tensor(g.astype(np.float64)))
    _close(pw_w.grad.numpy(), tw.grad.numpy(), "embedding grad")
    first = pw_w.grad.numpy()
    pw_w.grad = None
    pw.embedding(ids, pw_w).backward(pw.tensor(g))
    np.testing.assert_array_equal(pw_w.grad.numpy(), first)  # bit-identical: deterministic order
    with pytest.raises(IndexError, match=r"\[0, 11\)"):
        pw.embedding(np.array([11]), pw_w)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_with_ignore_index(rng, reduction):
    logits = rng.standard_normal((9, 5)).astype(np.float32) * 3
    labels = rng.integers(0, 5, 9).astype(np.int32)
    labels[[1, 4]] = -100
    x = pw.tensor(logits, requires_grad=True)
    loss = pw.cross_entropy(x, labels, reduction=reduction)
    tx = torch.tensor(logits.astype(np.float64), requires_grad=True)
    ref = torch.nn.functional.cross_entropy(tx, torch.tensor(labels.astype(np.int64)), reduction=reduction)
    _close(loss.numpy(), ref.detach().numpy(), "loss")
    if reduction == "none":
        g = rng.standard_normal(9).astype(np.float32)
        loss.backward(pw.tensor(g))
        ref.backward(torch.tensor(g.astype(np.float64)))
    else:
        loss.backward()
        ref.backward()
    _close(x.grad.numpy(), tx.grad.numpy(), "dlogits")


def test_cross_entropy_rejects_host_labels_out_of_range():
    x = pw.tensor(np.zeros((2, 3), np.float32))
    for bad in ([0, 3], [-1, 0]):
        with pytest.raises(ValueError, match=r"\[0, 3\)"):
            pw.cross_entropy(x, np.array(bad))


def test_mse_loss(rng):
    run_both(
        rng, lambda L, a, b: pw.mse_loss(a, b) if L is pw else torch.nn.functional.mse_loss(a, b), [(7, 3), (7, 3)]
    )


# -- graph semantics ---------------------------------------------------------------
def test_tensor_used_twice_gradients_add(rng):
    run_both(rng, lambda L, x: (x * x + x.exp() * x).sum(), [(4, 5)], summed=True)


def _layer_norm(L, x):
    return pw.layer_norm(x, x.shape[-1]) if L is pw else torch.nn.functional.layer_norm(x, x.shape[-1:])


# Graphs where a gradient is handed on unchanged (add, reshape) to several
# slots; the last holder writes it in place, earlier ones must not.
SHARED_GRADIENTS = {
    "residual": lambda L, x: (x * 1.5) + _layer_norm(L, x * 1.5).tanh(),
    "residual_chain": lambda L, x: _chain(L, x * 1.0, 3),
    "same_tensor_twice": lambda L, x: (x * 2.0) + (x * 2.0).reshape(x.shape),
    "both_branches_accumulate": lambda L, x: (lambda h: (h + h.exp()) + (h + h.tanh()).reshape(h.shape))(x * 0.5),
    "shared_then_read": lambda L, x: (lambda h: (h + h.exp()) * (h + h.exp()).tanh())(x * 0.5),
    "view_of_shared": lambda L, x: (lambda h: (h + h.reshape(-1).exp().reshape(h.shape)) + h.sum(-1, keepdim=True))(
        x * 1.0
    ),
}


def _chain(L, x, depth):
    for _ in range(depth):
        x = x + _layer_norm(L, x).tanh()
    return x


@pytest.mark.parametrize("name", sorted(SHARED_GRADIENTS))
def test_shared_gradients(rng, name):
    """Gradients passed on unchanged by adds and views reach every branch intact, and the caller's
    upstream gradient is never written (it is shared but not writable)."""
    a = rng.standard_normal((6, 9)).astype(np.float32)
    g = rng.standard_normal((6, 9)).astype(np.float32)
    x = pw.tensor(a, requires_grad=True)
    tx = torch.tensor(a.astype(np.float64), requires_grad=True)
    out, ref = SHARED_GRADIENTS[name](pw, x), SHARED_GRADIENTS[name](torch, tx)
    _close(out.numpy(), ref.detach().numpy(), "forward")
    upstream = pw.tensor(g)
    out.backward(upstream)
    ref.backward(torch.tensor(g.astype(np.float64)))
    _close(x.grad.numpy(), tx.grad.numpy(), "grad")
    np.testing.assert_array_equal(upstream.numpy(), g)
    # The same graph from a scalar loss: the seed is a device constant that must stay 1.
    x.grad = None
    tx.grad = None
    (SHARED_GRADIENTS[name](pw, x) * pw.tensor(g)).sum().backward()
    (SHARED_GRADIENTS[name](torch, tx) * torch.tensor(g.astype(np.float64))).sum().backward()
    _close(x.grad.numpy(), tx.grad.numpy(), "grad from a scalar loss")


def test_detached_branch_and_no_grad(rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    x = pw.tensor(a, requires_grad=True)
    y = (x * x.detach()).sum()
    with pw.no_grad():
        z = x * 3.0
    assert not z.requires_grad and z.grad_fn is None
    y.backward()
    _close(x.grad.numpy(), a.astype(np.float64), "d(x * stop(x))/dx = x")


def test_gradients_accumulate_across_backward_calls(rng):
    a = rng.standard_normal(6).astype(np.float32)
    x = pw.tensor(a, requires_grad=True)
    (x * 2.0).sum().backward()
    (x * x).sum().backward()
    _close(x.grad.numpy(), 2.0 + 2.0 * a.astype(np.float64), "accumulated")
    x.grad = None
    (x * 3.0).sum().backward()
    _close(x.grad.numpy(), np.full(6, 3.0), "fresh after grad=None")


def test_backward_errors(rng):
    x = pw.tensor(rng.standard_normal((2, 3)).astype(np.float32), requires_grad=True)
    y = x * 2.0
    with pytest.raises(RuntimeError, match="only for scalar outputs"):
        y.backward()
    s = y.sum()
    s.backward()
    with pytest.raises(RuntimeError, match="second time"):
        s.backward()
    with pytest.raises(RuntimeError, match="does not require grad"):
        pw.tensor(np.ones(2, np.float32)).sum().backward()
    with pytest.raises(ValueError, match="gradient has shape"):
        (x * 1.0).backward(pw.tensor(np.ones(3, np.float32)))
    with pytest.raises(TypeError, match="float32"):
        pw.tensor(np.ones(2, np.int32), requires_grad=True)
    with pytest.raises(ValueError, match=r"shapes \(2, 3\) and \(4,\) cannot be broadcast"):
        x + pw.tensor(np.ones(4, np.float32))
    with pytest.raises(TypeError, match="float32"):
        pw.tensor(np.ones(2, np.int32)).exp()
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        x += 1.0


def test_two_devices_are_refused(rng):
    d1, d2 = pw.default_device(), pw.Device()
    assert repr(d1) != repr(d2)
    a = pw.tensor(np.ones(3, np.float32), d1)
    b = pw.tensor(np.ones(3, np.float32), d2)
    with pytest.raises(ValueError, match="lives on"):
        a + b
    with pytest.raises(ValueError, match="lives on"):
        pw.tensor(a, d2)


def test_inplace_ops_outside_autograd(rng):
    a = rng.standard_normal(5).astype(np.float32)
    t = pw.tensor(a)
    t += 1.0
    t *= pw.tensor(np.full(5, 2.0, np.float32))
    _close(t.numpy(), (a + 1.0) * 2.0, "in place")


@pytest.mark.slow
def test_graph_memory_is_freed_after_backward(dev, rng):
    """Memory flat over many steps: each step's graph is released by its backward."""
    w = pw.tensor(rng.standard_normal((16, 8)).astype(np.float32), dev, requires_grad=True)
    x = pw.tensor(rng.standard_normal((4, 16)).astype(np.float32), dev)

    def step():
        w.grad = None
        h = (x @ w).relu()
        loss = (h.softmax(-1) * h).mean() + h.var()
        loss.backward()

    for _ in range(50):
        step()
    dev.synchronize()
    before = dev.resource_report().get("buffers", 0)
    for _ in range(10_000):
        step()
    dev.synchronize()
    after = dev.resource_report().get("buffers", 0)
    assert after <= before + 8, (before, after)
