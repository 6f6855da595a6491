"""Both sides of every size limit of the kernel families (docs/reliability.md,
"Size limits"): the storage-binding limit (operands bound in pieces), the
bounded K loops (split-K past kMaxKPerSplit = 32768, several passes past
kMaxSplits = 1024 splits), the bounded column-sum loop, the class limit of
the cross-entropy and the binding limit of the MSE.

Why bounded loops: Mesa's lavapipe ends a shader's loops silently after 65535
iterations per invocation, and one f32 running sum of millions of terms loses
precision (adding 1.0 stalls at 2^24). Both gave silently wrong GEMMs at large
K (M=2, N=1, K=8.4 M gave 524282), so most tests here use data whose every
partial sum is exact in float32 (entries in {-1, 0, 1}, or ones with chunk
sums below 2^24): a dropped or repeated element then shows as an exact
mismatch instead of hiding inside a rounding tolerance.

Thresholds are computed from the device's limits; on lavapipe (128 MiB
bindings, 32-byte offset alignment) they are the values in the comments. Tests
whose operands would exceed ~2 GB are skipped on adapters with larger
binding limits.
"""

import numpy as np
import pytest

import pywgtrain as pw
from helpers import assert_close, bias_residual, poisoned, rand
from pywgtrain import _core

K_SPLIT = 32768  # dispatch_util.hpp kMaxKPerSplit: most K one workgroup loops over in one dispatch
SPLITS = 1024  # kMaxSplits
COLUMN_SUM_ROWS = 1 << 20  # kMaxColumnSumRows
MAX_CLASSES = 1 << 20  # kMaxClasses
MAX_TEST_BYTES = 2 << 30


def binding_floats(dev):
    return dev.limits["max_storage_buffer_binding_size"] // 4


def slack(dev):
    return max(dev.limits["min_storage_buffer_offset_alignment"], 4) // 4


def rows_fitting(dev, ld):
    """Rows of ld floats one binding holds beside the alignment slack (gemm_dispatch.cpp rows_per_binding)."""
    return (binding_floats(dev) - slack(dev)) // ld


def row_limit(dev):
    """Longest row (floats) that fits one binding: 33,554,424 on lavapipe."""
    return binding_floats(dev) - slack(dev)


def skip_if_huge(*nbytes):
    if sum(nbytes) > MAX_TEST_BYTES:
        pytest.skip(f"{sum(nbytes)} bytes of operands at this adapter's binding limit: too large for a test")


def tern(rng, *shape):
    """Entries in {-1, 0, 1}: every partial sum of products is an exact float32 integer."""
    return rng.integers(-1, 2, size=shape, dtype=np.int8).astype(np.float32)


def ref(a, b, ta=False, tb=False):
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return (a64.T if ta else a64) @ (b64.T if tb else b64)


def assert_exact(actual, expected):
    actual = np.asarray(actual)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert np.all(np.isfinite(actual)), "non-finite values in the result (unwritten or poisoned elements)"
    np.testing.assert_array_equal(actual.astype(np.float64), expected)


def gemm_into_poison(dev, a, b, ta=False, tb=False):
    m = a.shape[1] if ta else a.shape[0]
    n = b.shape[0] if tb else b.shape[1]
    out = poisoned(dev, (m, n))
    pw.gemm(pw.tensor(a, dev), pw.tensor(b, dev), trans_a=ta, trans_b=tb, out=out)
    return out.numpy()


# --- the bug report: sums of ones (float64 reference, fp32 relative tolerance) ---


@pytest.mark.parametrize(
    "m,k,n",
    [
        (2, 8_387_584, 1),  # M = 2 was right up to here ...
        (
            2,
            8_387_585,
            1,
        ),  # ... and half the sum from here (lanes of gemv.wgsl's TRANS_B form stopped at 65535 iterations)
        (2, 8_400_000, 1),  # reported 524282
        (2, 20_000_000, 1),  # past 2^24: one f32 running sum of ones would stall at 16,777,216
        (1, 40_000_000, 1),  # reported 4194256 (one workgroup per K block, past the binding limit)
        (2, 2 * K_SPLIT, 2),
        (2, 2_097_151, 16),  # B (K x 16) at the binding limit ...
        (2, 2_097_152, 16),  # ... and past it: K blocks, each was one workgroup looping over 131071 K tiles
        pytest.param(16, 2_097_151, 16, marks=pytest.mark.slow),
        pytest.param(16, 2_097_152, 16, marks=pytest.mark.slow),  # A at the binding limit: reported 1048576
        pytest.param(2, 8_388_672, 4, marks=pytest.mark.slow),  # B past the binding limit: reported relative error 0.98
    ],
)
def test_report_sums_of_ones(dev, m, k, n):
    skip_if_huge(4 * m * k, 4 * k * n)
    got = gemm_into_poison(dev, np.ones((m, k), np.float32), np.ones((k, n), np.float32))
    assert_close(got, np.full((m, n), float(k)), rtol=1e-5, atol_scale=1e-6)


# --- GEMV (M = 1, or N = 1 through C^T = B^T A^T) ---


@pytest.mark.parametrize("k", [K_SPLIT, K_SPLIT + 1, 8_387_584, 8_387_585, 8_400_000])
def test_gemv_transposed_form_splits_long_k(dev, rng, k):
    """M=2, N=1 runs gemv.wgsl's TRANS_B form (32 lanes per output); it splits
    K past 32768 now (it looped over all of K in one workgroup)."""
    a, x = tern(rng, 2, k), tern(rng, k, 1)
    assert_exact(gemm_into_poison(dev, a, x), ref(a, x))


@pytest.mark.parametrize("k_case", ["32 splits of 32768", "33 splits", "binding", "binding + 1", "40M"])
def test_gemv_column_form_long_k(dev, rng, k_case):
    """M = N = 1: the scalar column form. 32 heuristic splits cover up to
    32 * 32768 = 1,048,576; past that the split count grows; past one binding
    of the K-vector (33,554,424 floats on lavapipe) K runs in blocks that
    accumulate with beta = 1, each block split (one workgroup looped over a
    whole block before)."""
    k = {
        "32 splits of 32768": 32 * K_SPLIT,
        "33 splits": 32 * K_SPLIT + 1,
        "binding": row_limit(dev),
        "binding + 1": row_limit(dev) + 1,
        "40M": 40_000_000,
    }[k_case]
    skip_if_huge(8 * k)
    a, b = tern(rng, 1, k), tern(rng, k, 1)
    assert_exact(gemm_into_poison(dev, a, b), ref(a, b))


@pytest.mark.parametrize("side", ["below", "above"])
def test_gemv_vec4_form_at_binding(dev, rng, side):
    """M = 1, N = 4: 128-bit column quads; B (K x 4) reaches the binding at
    K = 8,388,606 on lavapipe."""
    k = rows_fitting(dev, 4) + (side == "above")
    skip_if_huge(4 * k * 5)
    a, b = tern(rng, 1, k), tern(rng, k, 4)
    assert_exact(gemm_into_poison(dev, a, b), ref(a, b))


@pytest.mark.parametrize("m,n,tb", [(2, 1, False), (1, 2, True)])
@pytest.mark.parametrize("side", ["below", "above"])
def test_gemv_matrix_rows_longer_than_a_binding(dev, rng, m, n, tb, side):
    """The matrix operand stored N x K with rows of K floats: at the row limit
    each output binds a row of its own, split along K (wrong before: one
    workgroup looped over the whole row); past it (a ValueError before) the
    row is bound in pieces along K."""
    k = row_limit(dev) + (side == "above")
    skip_if_huge(4 * k * 3, 8 * k * 3)
    a = tern(rng, m, k)
    b = tern(rng, n, k) if tb else tern(rng, k, n)
    assert_exact(gemm_into_poison(dev, a, b, tb=tb), ref(a, b, tb=tb))


@pytest.mark.slow
@pytest.mark.parametrize("tb", [False, True])
def test_gemm_rows_of_a_longer_than_a_binding(dev, rng, tb):
    """M = 2, N = 3 with rows of A (and of B stored N x K) longer than one
    binding: each row of C runs as a GEMV with the operands bound in pieces
    along K (this raised 'one row of A exceeds ...' before)."""
    k = row_limit(dev) + 1
    skip_if_huge(4 * k * 5, 8 * k * 5)
    a = tern(rng, 2, k)
    b = tern(rng, 3, k) if tb else tern(rng, k, 3)
    assert_exact(gemm_into_poison(dev, a, b, tb=tb), ref(a, b, tb=tb))


def test_gemm_transposed_rows_longer_than_a_binding_raise(dev):
    """A stored K x M and B stored N x K with K past one binding: the one
    layout with no piecewise path; a clear ValueError names B and the limit."""
    k = row_limit(dev) + 1
    skip_if_huge(16 * k)
    a, b = np.zeros((k, 2), np.float32), np.zeros((2, k), np.float32)
    with pytest.raises(ValueError, match="one row of B .* exceeds the device's max_storage_buffer_binding_size"):
        pw.gemm(a, b, trans_a=True, trans_b=True)


# --- GEMM (gemm.wgsl) ---


@pytest.mark.parametrize(
    "ta,tb,k",
    [
        (False, False, 16 * K_SPLIT),
        (False, False, 16 * K_SPLIT + 1),
        (True, False, 16 * K_SPLIT + 1),
        (False, True, 16 * K_SPLIT + 1),
        (True, True, 16 * K_SPLIT + 1),
    ],
)
def test_gemm_split_k_bounded_per_workgroup(dev, rng, ta, tb, k):
    """One 16 x 16 output tile: the heuristic's 16 splits cover K up to
    16 * 32768; one more element takes 17 splits, so no workgroup loops over
    more than 32768 (2048 K tiles)."""
    a, b = tern(rng, 16, k), tern(rng, k, 16)
    sa, sb = (np.ascontiguousarray(a.T) if ta else a), (np.ascontiguousarray(b.T) if tb else b)
    assert_exact(gemm_into_poison(dev, sa, sb, ta, tb), ref(a, b))


@pytest.mark.parametrize("side", ["below", "above"])
@pytest.mark.parametrize("operand", ["A rows along M", "B^T rows along N"])
def test_gemm_rows_at_binding(dev, rng, operand, side):
    """64 rows of K floats reach the binding at K = 524,287 on lavapipe; one
    more and the operand binds in row blocks, each of them split along K."""
    k = rows_fitting(dev, 64) + (side == "above")
    skip_if_huge(4 * k * 66)
    if operand.startswith("A"):
        a, b, tb = tern(rng, 64, k), tern(rng, k, 2), False
    else:
        a, b, tb = tern(rng, 2, k), tern(rng, 64, k), True
    assert_exact(gemm_into_poison(dev, a, b, tb=tb), ref(a, b, tb=tb))


@pytest.mark.parametrize(
    "side,scalars", [("below", "beta=0 into NaN"), ("above", "beta=0 into NaN"), ("above", "alpha=0.5, beta=-2")]
)
@pytest.mark.parametrize("operand", ["A^T", "B"])
def test_gemm_k_blocks_at_binding(dev, rng, operand, side, scalars):
    """A stored K x 64 (trans_a) or B stored K x 64 reach the binding at
    K = 524,287 on lavapipe; past it K runs in blocks accumulated with
    beta = 1: the first block must not read the (NaN) output when beta = 0,
    and alpha / beta apply exactly once."""
    k = rows_fitting(dev, 64) + (side == "above")
    skip_if_huge(4 * k * 66)
    ta = operand == "A^T"
    if ta:
        a, b = tern(rng, 64, k), tern(rng, k, 2)
    else:
        a, b = tern(rng, 2, k), tern(rng, k, 64)
    sa = np.ascontiguousarray(a.T) if ta else a
    if scalars.startswith("beta=0"):
        assert_exact(gemm_into_poison(dev, sa, b, ta=ta), ref(a, b))
        return
    c = tern(rng, a.shape[0], b.shape[1])
    out = pw.tensor(c, dev)
    pw.gemm(pw.tensor(sa, dev), pw.tensor(b, dev), trans_a=ta, alpha=0.5, beta=-2.0, out=out)
    assert_exact(out.numpy(), 0.5 * ref(a, b) - 2.0 * c.astype(np.float64))


@pytest.mark.parametrize("entry", ["bias_act", "bias_act_train", "act_grad", "bias_residual"])
def test_fused_epilogues_on_split_row_blocks(dev, rng, entry):
    """A linear layer's W (N x K, trans_b) past the binding binds in blocks of
    rows along N; each block of few tiles runs split-K and the reduce applies
    the fused epilogue with the block's bias offset and pre-activation
    (residual) columns."""
    m, k, n = 5, 4100, 8200
    if k * n * 4 <= dev.limits["max_storage_buffer_binding_size"]:
        pytest.skip("binding limit larger than the operand on this adapter")
    a, w = rand(rng, m, k), rand(rng, n, k)
    z = a.astype(np.float64) @ w.T.astype(np.float64)
    out = poisoned(dev, (m, n))
    ta, tw = pw.tensor(a, dev), pw.tensor(w, dev)
    if entry == "act_grad":
        pre = rand(rng, m, n)
        with dev.batch() as rec:
            _core.gemm_act_grad(rec, ta._buf, tw._buf, pw.tensor(pre, dev)._buf, out._buf, m, n, k, False, True, 1)
        assert_close(out.numpy(), z * (pre > 0), atol_scale=1e-4)
        return
    bias = rand(rng, n)
    if entry == "bias_residual":
        res = rand(rng, m, n)
        assert_close(bias_residual(dev, ta, tw, bias, res, out), z + bias + res, atol_scale=1e-4)
        return
    pre = poisoned(dev, (m, n)) if entry == "bias_act_train" else None
    with dev.batch() as rec:
        _core.gemm_bias_act(
            rec,
            ta._buf,
            tw._buf,
            pw.tensor(bias, dev)._buf,
            out._buf,
            None if pre is None else pre._buf,
            m,
            n,
            k,
            False,
            True,
            1,
        )
    assert_close(out.numpy(), np.maximum(z + bias, 0), atol_scale=1e-4)
    if pre is not None:
        assert_close(pre.numpy(), z + bias, atol_scale=1e-4)


@pytest.mark.parametrize("operand", ["A rows along M", "B rows along K"])
def test_bias_residual_on_row_and_k_blocks(dev, rng, operand):
    """Y = op(A) op(B) + bias + R past the binding: A (M x K) binds in row
    blocks along M, so R binds in the same row windows as Y; B stored K x N
    binds in K blocks, the first adding bias and R, the others accumulating
    onto it. Ternary data: the result is exact."""
    k = rows_fitting(dev, 64) + 1
    skip_if_huge(4 * k * 66)
    if operand.startswith("A"):
        a, b, tb = tern(rng, 64, k), tern(rng, 2, k), True
    else:
        a, b, tb = tern(rng, 2, k), tern(rng, k, 64), False
    m, n = a.shape[0], (b.shape[0] if tb else b.shape[1])
    bias, res = tern(rng, n), tern(rng, m, n)
    out = poisoned(dev, (m, n))
    assert_exact(bias_residual(dev, a, b, bias, res, out, trans_b=tb), ref(a, b, tb=tb) + bias + res)


# --- linear.wgsl: column sums (bias gradient) ---


@pytest.mark.parametrize("rows", [COLUMN_SUM_ROWS, COLUMN_SUM_ROWS + 1, 8_400_000])
@pytest.mark.parametrize("cols", [1, 3])
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_bias_grad_rows_per_dispatch(dev, rng, rows, cols, beta):
    """db = column sums of dZ: at most 2^20 rows per dispatch (each lane
    loops over rows / 128); more accumulate. Before, lanes looped over all rows
    (wrong past ~8.39 M rows on lavapipe)."""
    dz = tern(rng, rows, cols)
    db0 = tern(rng, cols)
    db = pw.tensor(db0, dev) if beta else poisoned(dev, (cols,))
    with dev.batch() as rec:
        _core.bias_grad(rec, pw.tensor(dz, dev)._buf, db._buf, rows, cols, beta)
    assert_exact(db.numpy(), dz.astype(np.float64).sum(0) + beta * db0)


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_linear_weight_grads_long_batch(dev, rng, beta):
    """dW = dZ^T X with K = rows past 2^20: split GEMM, and db in its own
    column-sum pass of two dispatches."""
    rows, fout, fin = COLUMN_SUM_ROWS + 1, 2, 3
    dz, x = tern(rng, rows, fout), tern(rng, rows, fin)
    dw0, db0 = tern(rng, fout, fin), tern(rng, fout)
    dw = pw.tensor(dw0, dev) if beta else poisoned(dev, (fout, fin))
    db = pw.tensor(db0, dev) if beta else poisoned(dev, (fout,))
    with dev.batch() as rec:
        _core.linear_weight_grads(
            rec, pw.tensor(dz, dev)._buf, pw.tensor(x, dev)._buf, dw._buf, db._buf, rows, fout, fin, beta
        )
    d64 = dz.astype(np.float64)
    assert_exact(dw.numpy(), d64.T @ x + beta * dw0)
    assert_exact(db.numpy(), d64.sum(0) + beta * db0)


# --- cross_entropy.wgsl, and MSE from element-wise ops ---


def test_cross_entropy_class_limit(dev, rng):
    """One workgroup per row loops over the classes (twice forward, once
    backward): up to 2^20 classes; more raise a ValueError naming the limit
    (lavapipe silently cuts loops past 65,535 trips)."""
    rows = 2
    logits = 3 * rand(rng, rows, MAX_CLASSES)
    labels = rng.integers(0, MAX_CLASSES, rows)
    l64 = logits.astype(np.float64)
    mx = l64.max(1, keepdims=True)
    lse = mx[:, 0] + np.log(np.exp(l64 - mx).sum(1))
    sm = np.exp(l64 - lse[:, None])
    sm[np.arange(rows), labels] -= 1
    x = pw.tensor(logits, dev, requires_grad=True)
    loss = pw.cross_entropy(x, labels)
    assert loss.item() == pytest.approx(np.mean(lse - l64[np.arange(rows), labels]), rel=1e-5)
    loss.backward()
    assert_close(x.grad.numpy(), sm / rows)
    with pytest.raises(ValueError, match=f"{MAX_CLASSES + 1} classes, more than the {MAX_CLASSES}"):
        pw.cross_entropy(pw.zeros((1, MAX_CLASSES + 1), device=dev), [0])


@pytest.mark.parametrize(
    "side", [pytest.param("at", marks=pytest.mark.slow), pytest.param("past", marks=pytest.mark.slow)]
)
def test_mse_at_binding_limit(dev, rng, side):
    """MSE is element-wise ops and a mean, each split into bindable pieces:
    right on both sides of one binding."""
    n = binding_floats(dev) + (side == "past")
    skip_if_huge(6 * n * 4, 16 * n)
    p, t = tern(rng, n), tern(rng, n)
    d = p.astype(np.float64) - t
    x = pw.tensor(p, dev, requires_grad=True)
    loss = pw.mse_loss(x, pw.tensor(t, dev))
    assert loss.item() == pytest.approx(np.mean(d * d), rel=1e-5)
    loss.backward()
    assert_close(x.grad.numpy(), 2 * d / n)


# --- reduce.wgsl / optim.wgsl: vectors in binding-sized pieces ---


def piece_floats(dev):
    """dispatch_util.hpp max_piece_floats: 33,554,432 on lavapipe."""
    align = max(dev.limits["min_storage_buffer_offset_alignment"], 4) // 4
    by_grid = dev.limits["max_compute_workgroups_per_dimension"] * 256 * 1024
    return min(binding_floats(dev), by_grid) // align * align


@pytest.mark.parametrize("extra", [0, 1])
def test_clip_grad_norm_at_piece_limit(dev, rng, extra):
    """The norm's partial sums run per binding-sized piece; one element past
    it is a second piece of one element (scalar partial_sum)."""
    n = piece_floats(dev) + extra
    skip_if_huge(4 * n, 8 * n)
    g = tern(rng, n)
    g[-1] = 1.0
    tg = pw.tensor(g, dev)
    want = float(np.sqrt(np.count_nonzero(g)))
    norm = pw.clip_grad_norm_([tg], 1e9)
    assert norm == pytest.approx(want, rel=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("extra", [0, 1])
def test_adamw_at_piece_limit(dev, rng, extra):
    from test_optim import numpy_adamw

    n = piece_floats(dev) + extra
    skip_if_huge(16 * n, 32 * n)
    p, g = rand(rng, n), rand(rng, n)
    tp, tg = pw.tensor(p, dev), pw.tensor(g, dev)
    tm, tv = pw.zeros(n, device=dev), pw.zeros(n, device=dev)
    pw.adamw_step(tp, tg, tm, tv, 1, lr=1e-2)
    rp, rm, rv = numpy_adamw(p, g, np.zeros(n), np.zeros(n), 1, 1e-2, (0.9, 0.999), 1e-8, 1e-2)
    assert_close(tp.numpy(), rp)
    assert_close(tm.numpy(), rm)
    assert_close(tv.numpy(), rv)


@pytest.mark.slow
def test_batched_gemm_in_chunks_past_one_binding(dev, rng):
    """_core.gemm_batched binds the batch in chunks whose matrices fit one
    storage binding (bmm.cpp): A here holds more floats than one binding, so
    the batch is split; every matrix of every chunk must come out right."""
    m, k, n = 1024, 2048, 4
    per_binding = rows_fitting(dev, m * k)  # whole A matrices one binding holds (15 on lavapipe)
    batch = per_binding + 2
    skip_if_huge(4 * batch * m * k)
    a = tern(rng, batch, m, k)
    b = tern(rng, batch, k, n)
    out = poisoned(dev, (batch, m, n))
    with dev.batch() as rec:
        _core.gemm_batched(
            rec, pw.tensor(a, dev)._buf, pw.tensor(b, dev)._buf, out._buf, batch, m, n, k, False, False, 1.0, 0.0
        )
    assert_exact(out.numpy(), a.astype(np.float64) @ b.astype(np.float64))
