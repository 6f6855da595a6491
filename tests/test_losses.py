"""softplus, logsumexp, rms_norm, leaky_relu, the element-wise losses (l1, smooth L1, Huber, binary
cross-entropy with logits) and cross-entropy's class weights and label smoothing against torch's float64 results: values and
gradients, every reduction, the points where a piece changes (d = 0, |d| =
beta, x = 0) and inf / NaN where torch defines them; their modules; bad
arguments."""

import numpy as np
import pytest

import pywgtrain as pw
import pywgtrain.nn.functional as F

from helpers import rand, same_as_torch, t64

torch = pytest.importorskip("torch")
TF = torch.nn.functional


def _both(dev, ours_fn, ref_fn, arrays, grad_of=(0,), rtol=1e-5, atol=1e-6):
    """ours_fn on device tensors and ref_fn on float64 torch tensors of `arrays`: the results,
    then the gradients of the arrays in `grad_of` for one random upstream gradient."""
    ts = [pw.tensor(a, dev, requires_grad=i in grad_of) for i, a in enumerate(arrays)]
    rs = [t64(a, grad=i in grad_of) for i, a in enumerate(arrays)]
    y, ref = ours_fn(*ts), ref_fn(*rs)
    same_as_torch(y.numpy(), ref, rtol, atol)
    g = np.linspace(0.5, 1.5, max(ref.numel(), 1)).astype(np.float32).reshape(tuple(ref.shape))
    y.backward(pw.tensor(g, dev)) if ref.dim() else y.backward()
    ref.backward(t64(g) if ref.dim() else None)
    for i in grad_of:
        same_as_torch(ts[i].grad.numpy(), rs[i].grad, rtol, atol)


SPECIALS = np.array([-30.0, -5.0, -1.0, -1e-8, 0.0, 1e-8, 1.0, 5.0, 19.9, 20.1, 30.0, 100.0], np.float32)


@pytest.mark.parametrize("beta,threshold", [(1.0, 20.0), (2.0, 20.0), (0.5, 3.0), (-1.0, 20.0)])
def test_softplus_like_torch(dev, rng, beta, threshold):
    x = np.concatenate([SPECIALS, -SPECIALS, 4 * rand(rng, 33)]).astype(np.float32)
    _both(dev, lambda t: F.softplus(t, beta, threshold), lambda t: TF.softplus(t, beta, threshold), [x])
    x = np.array([np.nan, np.inf, -np.inf, 0.0], np.float32)  # forward only: torch's gradient at inf is NaN there
    same_as_torch(F.softplus(pw.tensor(x, dev), beta, threshold).numpy(), TF.softplus(t64(x), beta, threshold))


def test_softplus_module_and_errors(dev, rng):
    x = rand(rng, 7, 5)
    m = pw.nn.Softplus(beta=2.0, threshold=4.0)
    np.testing.assert_array_equal(m(pw.tensor(x, dev)).numpy(), F.softplus(pw.tensor(x, dev), 2.0, 4.0).numpy())
    assert "beta=2.0" in repr(m)
    with pytest.raises(ValueError, match="beta must not be 0"):
        F.softplus(pw.tensor(x, dev), 0.0)
    with pytest.raises(TypeError, match="threshold must be a real number"):
        F.softplus(pw.tensor(x, dev), 1.0, "20")


@pytest.mark.parametrize(
    "shape,dim,keepdim",
    [((7,), 0, False), ((33, 5), 1, True), ((33, 5), -2, False), ((2, 3, 129), (0, 2), False), ((4, 5, 6), [1], True)],
)
def test_logsumexp_like_torch(dev, rng, shape, dim, keepdim):
    x = (10 * rand(rng, *shape)).astype(np.float32)
    _both(dev, lambda t: pw.logsumexp(t, dim, keepdim), lambda t: torch.logsumexp(t, dim, keepdim), [x])
    same_as_torch(pw.tensor(x, dev).logsumexp(dim, keepdim).numpy(), torch.logsumexp(t64(x), dim, keepdim))


def test_logsumexp_special_values(dev):
    x = np.array(
        [[1e30, 1e30, -1e30], [-np.inf] * 3, [np.inf, 0.0, 1.0], [np.nan, 0.0, 1.0], [-1e4, -1e4, -1e4]], np.float32
    )
    same_as_torch(pw.logsumexp(pw.tensor(x, dev), 1).numpy(), torch.logsumexp(t64(x), 1))
    with pytest.raises(TypeError, match="dim must be an int"):
        pw.logsumexp(pw.tensor(x, dev), None)


REDUCTIONS = ["mean", "sum", "none"]


def _pairs(rng, n=64):
    """input, target with exact ties (d = 0), |d| at 1 and 0.5 exactly, and spread values."""
    target = rand(rng, n)
    d = 3 * rand(rng, n)
    d[:6] = [0.0, 1.0, -1.0, 0.5, -0.5, 2.0]
    return (target + d).astype(np.float32), target.astype(np.float32)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_l1_loss_like_torch(dev, rng, reduction):
    x, y = _pairs(rng)
    x[:6] = y[:6] + np.array([0.0, 1.0, -1.0, 0.5, -0.5, 2.0], np.float32)  # the ties exact in float32
    _both(dev, lambda a, b: F.l1_loss(a, b, reduction), lambda a, b: TF.l1_loss(a, b, reduction=reduction), [x, y])


@pytest.mark.parametrize(
    "loss,knee",
    [
        ("smooth_l1_loss", 1.0),
        ("smooth_l1_loss", 0.5),
        ("smooth_l1_loss", 0.0),
        ("huber_loss", 1.0),
        ("huber_loss", 2.5),
    ],
)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_piecewise_losses_like_torch(dev, rng, reduction, loss, knee):
    """smooth L1 (beta = knee) and Huber (delta = knee), d exactly 0 and +-knee included."""
    x, y = _pairs(rng)
    y[:6] = 0.0
    x[:6] = [0.0, 1.0, -1.0, 0.5, -0.5, 2.5]
    name = "beta" if loss == "smooth_l1_loss" else "delta"
    _both(
        dev,
        lambda a, b: getattr(F, loss)(a, b, reduction, knee),
        lambda a, b: getattr(TF, loss)(a, b, reduction=reduction, **{name: knee}),
        [x, y],
        grad_of=(0, 1),
    )


def test_piecewise_losses_nan(dev):
    x = np.array([np.nan, 1.0, 0.0], np.float32)
    y = np.zeros(3, np.float32)
    for ours, ref in (
        (F.l1_loss, TF.l1_loss),
        (F.smooth_l1_loss, TF.smooth_l1_loss),
        (F.huber_loss, TF.huber_loss),
        (F.mse_loss, TF.mse_loss),
    ):
        same_as_torch(ours(pw.tensor(x, dev), pw.tensor(y, dev), "none").numpy(), ref(t64(x), t64(y), reduction="none"))


@pytest.mark.parametrize("weighting", ["none", "weight", "pos_weight", "both"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_bce_with_logits_like_torch(dev, rng, reduction, weighting):
    x = (6 * rand(rng, 17, 5)).astype(np.float32)
    x[0] = [0.0, -0.0, 40.0, -40.0, 1e-7]  # the gradient at 0 is sigmoid(0) - y, not a kink's
    y = rng.random((17, 5)).astype(np.float32)
    y[1] = [0.0, 1.0, 0.0, 1.0, 0.5]
    x[1, :4] = [-12.0, 12.0, -20.0, 20.0]  # small losses: (1 - y) x + softplus(-x) would cancel to noise
    w = (rng.random((1, 5)) + 0.5).astype(np.float32)
    pw_ = (rng.random(5) * 3).astype(np.float32)
    use_w, use_p = weighting in ("weight", "both"), weighting in ("pos_weight", "both")
    arrays = [x, y] + ([w] if use_w else []) + ([pw_] if use_p else [])

    def ours(a, b, *rest):
        rest = list(rest)
        return F.binary_cross_entropy_with_logits(
            a, b, rest.pop(0) if use_w else None, reduction, rest.pop(0) if use_p else None
        )

    def ref(a, b, *rest):
        rest = list(rest)
        return TF.binary_cross_entropy_with_logits(
            a, b, rest.pop(0) if use_w else None, reduction=reduction, pos_weight=rest.pop(0) if use_p else None
        )

    _both(dev, ours, ref, arrays, grad_of=(0, 1))


def test_loss_modules_match_the_functions(dev, rng):
    x, y = _pairs(rng)
    tx, ty = pw.tensor(x, dev), pw.tensor(y, dev)
    w = (rng.random(64) + 0.5).astype(np.float32)
    for module, fn in (
        (pw.nn.L1Loss(), lambda: F.l1_loss(tx, ty)),
        (pw.nn.SmoothL1Loss(reduction="sum", beta=0.5), lambda: F.smooth_l1_loss(tx, ty, "sum", 0.5)),
        (pw.nn.HuberLoss(delta=2.0), lambda: F.huber_loss(tx, ty, "mean", 2.0)),
        (pw.nn.BCEWithLogitsLoss(weight=w), lambda: F.binary_cross_entropy_with_logits(tx, ty.sigmoid(), w)),
    ):
        target = ty.sigmoid() if isinstance(module, pw.nn.BCEWithLogitsLoss) else ty
        np.testing.assert_array_equal(module(tx, target).numpy(), fn().numpy())


def test_loss_argument_errors(dev, rng):
    x, y = pw.tensor(rand(rng, 4, 3), dev), pw.tensor(rand(rng, 4, 3), dev)
    with pytest.raises(ValueError, match="beta must be a number >= 0"):
        F.smooth_l1_loss(x, y, beta=-1.0)
    with pytest.raises(ValueError, match="delta must be a number > 0"):
        F.huber_loss(x, y, delta=0.0)
    with pytest.raises(ValueError, match="l1_loss: target has shape"):
        F.l1_loss(x, pw.tensor(rand(rng, 3, 4), dev))
    with pytest.raises(ValueError, match="reduction"):
        F.binary_cross_entropy_with_logits(x, y, reduction="avg")


# -- rms_norm, leaky_relu (composed ops of the same kind) ------------------------------


@pytest.mark.parametrize("shape,ns", [((7, 33), (33,)), ((2, 5, 129), (129,)), ((3, 4, 6), (4, 6)), ((1,), (1,))])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("eps", [None, 1e-5])
def test_rms_norm_like_torch(dev, rng, shape, ns, affine, eps):
    x = rand(rng, *shape)
    x.reshape(-1, int(np.prod(ns)))[0] = 0.0  # a zero row: rsqrt(eps), no NaN in the gradient
    w = rand(rng, *ns)
    arrays, grad_of = ([x, w], (0, 1)) if affine else ([x], (0,))
    _both(
        dev,
        lambda a, *b: F.rms_norm(a, ns, b[0] if b else None, eps),
        # torch's eps=None is the input dtype's epsilon: float32's for a float32 input
        lambda a, *b: TF.rms_norm(a, ns, b[0] if b else None, float(np.finfo(np.float32).eps) if eps is None else eps),
        arrays,
        grad_of=grad_of,
        rtol=2e-5,
        atol=2e-6,
    )


def test_rms_norm_module_half_and_errors(dev, rng):
    x = rand(rng, 9, 16)
    m = pw.nn.RMSNorm(16, device=dev)
    np.testing.assert_array_equal(m.weight.numpy(), np.ones(16, np.float32))
    np.testing.assert_array_equal(m(pw.tensor(x, dev)).numpy(), F.rms_norm(pw.tensor(x, dev), (16,), m.weight).numpy())
    assert pw.nn.RMSNorm((4, 4), elementwise_affine=False).weight is None
    # float16: float32 math, the result cast back before the weight, as torch's
    h = x.astype(np.float16)
    ours = F.rms_norm(pw.tensor(h, dev), (16,))
    assert ours.dtype == np.float16
    ref = TF.rms_norm(torch.from_numpy(h), (16,)).numpy()
    np.testing.assert_allclose(ours.numpy().astype(np.float32), ref.astype(np.float32), rtol=1e-3, atol=1e-3)
    with pytest.raises(ValueError, match="does not match the trailing dimensions"):
        F.rms_norm(pw.tensor(x, dev), (9,))
    with pytest.raises(ValueError, match="weight has shape"):
        F.rms_norm(pw.tensor(x, dev), (16,), pw.tensor(rand(rng, 8), dev))
    with pytest.raises(ValueError, match="eps must be"):
        F.rms_norm(pw.tensor(x, dev), (16,), None, -1.0)


@pytest.mark.parametrize("slope", [0.01, 0.2, -0.5])
def test_leaky_relu_like_torch(dev, rng, slope):
    x = np.concatenate([[0.0, -0.0, 1e-30, -1e-30], 3 * rand(rng, 29)]).astype(np.float32)
    _both(dev, lambda t: F.leaky_relu(t, slope), lambda t: TF.leaky_relu(t, slope), [x])
    y = np.array([np.nan, np.inf, -np.inf], np.float32)
    same_as_torch(F.leaky_relu(pw.tensor(y, dev), slope).numpy(), TF.leaky_relu(t64(y), slope))
    m = pw.nn.LeakyReLU(slope)
    np.testing.assert_array_equal(m(pw.tensor(x, dev)).numpy(), F.leaky_relu(pw.tensor(x, dev), slope).numpy())
    assert f"negative_slope={slope}" in repr(m)


# -- cross-entropy / nll with class weights and label smoothing -----------------------------


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted,eps", [(True, 0.0), (False, 0.1), (True, 0.25), (False, 1.0)])
def test_cross_entropy_weight_and_label_smoothing_like_torch(dev, rng, reduction, weighted, eps):
    """torch's formula (ignored rows in the mean's divisor or not, as torch), values and gradients;
    rows of 7 and 1,031 classes."""
    for rows, cols in ((9, 7), (5, 1031)):
        x = 3 * rand(rng, rows, cols)
        labels = rng.integers(0, cols, rows)
        labels[1] = -100  # ignored
        w = (rng.random(cols) + 0.5).astype(np.float32) if weighted else None
        wt = None if w is None else torch.from_numpy(w.astype(np.float64))

        def ours(t):
            return F.cross_entropy(t, labels, w, reduction=reduction, label_smoothing=eps)

        def ref(t):
            return TF.cross_entropy(t, torch.from_numpy(labels), wt, reduction=reduction, label_smoothing=eps)

        _both(dev, ours, ref, [x])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_weight_like_torch(dev, rng, reduction):
    x = rand(rng, 11, 6)
    labels = rng.integers(0, 6, 11)
    labels[[0, 4]] = 3
    labels[2] = -100
    w = (rng.random(6) + 0.5).astype(np.float32)
    _both(
        dev,
        lambda t: F.nll_loss(t, labels, pw.tensor(w, dev), reduction=reduction),
        lambda t: TF.nll_loss(t, torch.from_numpy(labels), torch.from_numpy(w.astype(np.float64)), reduction=reduction),
        [x],
    )


def test_cross_entropy_modules_and_argument_errors(dev, rng):
    x = rand(rng, 6, 5)
    labels = rng.integers(0, 5, 6)
    w = (rng.random(5) + 0.5).astype(np.float32)
    ours = pw.nn.CrossEntropyLoss(w, label_smoothing=0.2, ignore_index=labels[0])(pw.tensor(x, dev), labels)
    ref = torch.nn.CrossEntropyLoss(torch.from_numpy(w.astype(np.float64)), label_smoothing=0.2, ignore_index=labels[0])
    same_as_torch(ours.numpy(), ref(t64(x), torch.from_numpy(labels)))
    ours = pw.nn.NLLLoss(w, reduction="sum")(pw.tensor(x, dev), labels)
    same_as_torch(
        ours.numpy(),
        torch.nn.NLLLoss(torch.from_numpy(w.astype(np.float64)), reduction="sum")(t64(x), torch.from_numpy(labels)),
    )
    tx = pw.tensor(x, dev)
    with pytest.raises(ValueError, match="label_smoothing"):
        F.cross_entropy(tx, labels, label_smoothing=1.5)
    with pytest.raises(ValueError, match="one per class"):
        F.cross_entropy(tx, labels, np.ones(4, np.float32))
    with pytest.raises(NotImplementedError, match="weight requires grad"):
        F.cross_entropy(tx, labels, pw.tensor(w, dev, requires_grad=True))
    with pytest.raises(TypeError):  # ignore_index is keyword-only: torch's third argument is weight
        F.cross_entropy(tx, labels, None, -100)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted,eps", [(False, 0.0), (True, 0.2)])
def test_cross_entropy_probability_targets_like_torch(dev, rng, reduction, weighted, eps):
    """Class probabilities as targets (their gradient too), with weights and label smoothing."""
    x = 3 * rand(rng, 9, 7)
    p = rng.random((9, 7)).astype(np.float32)
    p /= p.sum(1, keepdims=True)
    w = (rng.random(7) + 0.5).astype(np.float32) if weighted else None
    wt = None if w is None else torch.from_numpy(w.astype(np.float64))
    _both(
        dev,
        lambda a, b: F.cross_entropy(a, b, w, reduction=reduction, label_smoothing=eps),
        lambda a, b: TF.cross_entropy(a, b, wt, reduction=reduction, label_smoothing=eps),
        [x, p],
        grad_of=(0, 1),
    )


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("soft", [False, True])
def test_cross_entropy_k_dimensional_like_torch(dev, rng, reduction, soft):
    """Logits [N, C, d1, d2] against targets [N, d1, d2] (ignored positions too) or class
    probabilities of the logits' shape, as torch's."""
    x = 2 * rand(rng, 3, 5, 4, 2)
    if soft:
        y = rng.random((3, 5, 4, 2)).astype(np.float32)
        y /= y.sum(1, keepdims=True)
        _both(dev, lambda a: F.cross_entropy(a, y, reduction=reduction),
              lambda a: TF.cross_entropy(a, torch.from_numpy(y.astype(np.float64)), reduction=reduction), [x])  # fmt: skip
        return
    y = rng.integers(0, 5, (3, 4, 2))
    y[0, 1, 1] = -100
    _both(dev, lambda a: F.cross_entropy(a, y, reduction=reduction),
          lambda a: TF.cross_entropy(a, torch.from_numpy(y), reduction=reduction), [x])  # fmt: skip
    with pytest.raises(ValueError, match=r"expected \(3, 4, 2\)"):
        F.cross_entropy(pw.tensor(x, dev), y[:, :2])


def test_softplus_precision_sweep(dev):
    """softplus where log(1 + e) is small (e = exp(beta x) from 1e-10 to 1): the kernel's log1p
    keeps float32's relative precision there, where a GPU's log near 1 has only an absolute bound."""
    x = np.linspace(-15.0, 1.0, 513).astype(np.float32)
    for beta in (1.0, 1.5, 0.5):
        got = F.softplus(pw.tensor(x, dev), beta).numpy()
        same_as_torch(got, TF.softplus(t64(x), beta), rtol=4e-6, atol=0.0)
