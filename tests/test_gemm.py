import itertools
import math

import numpy as np
import pytest

import pywgtrain as pw
from helpers import assert_close, poisoned, rand, switched_device

SIZES = [1, 7, 33, 129, 1000]
# Non-multiples of the 64/128 tiles, the 16 K-step and the 8/32 GEMV blocks;
# (132, 260, 36): multiples of 4 with partial tiles along every dimension.
ODD = [(65, 127, 17), (130, 257, 31), (200, 3, 300), (3, 200, 5), (257, 65, 129), (132, 260, 36)]
TRANS = list(itertools.product([False, True], repeat=2))


def stored(x, trans):
    """The array to pass so that op(stored) == x."""
    return np.ascontiguousarray(x.T) if trans else x


def ref_gemm(a, b, alpha=1.0, beta=0.0, c=None):
    r = alpha * (a.astype(np.float64) @ b.astype(np.float64))
    return r if c is None else r + beta * c.astype(np.float64)


def k_tolerance(k):
    return 1e-5 * max(1.0, np.sqrt(k) / 4)


@pytest.mark.parametrize("ta,tb", TRANS)
@pytest.mark.parametrize("m,n,k", [(s, s, s) for s in SIZES] + ODD)
def test_gemm_shapes_and_transposes(dev, rng, m, n, k, ta, tb):
    a, b = rand(rng, m, k), rand(rng, k, n)
    out = poisoned(dev, (m, n))
    pw.gemm(pw.tensor(stored(a, ta), dev), pw.tensor(stored(b, tb), dev), trans_a=ta, trans_b=tb, out=out)
    assert_close(out.numpy(), ref_gemm(a, b), atol_scale=k_tolerance(k))


@pytest.mark.parametrize("ta,tb", TRANS)
@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (0.5, -2.0), (-1.5, 0.25), (2.0, 0.0)])
@pytest.mark.parametrize("m,n,k", [(67, 45, 71), (68, 132, 71)])
def test_gemm_alpha_beta(dev, rng, ta, tb, alpha, beta, m, n, k):
    """Scalar stores (N = 45) and vec4 stores that read C for beta (N = 132, C_VEC) with a ragged edge."""
    a, b, c = rand(rng, m, k), rand(rng, k, n), rand(rng, m, n)
    out = pw.tensor(c, dev)
    pw.gemm(pw.tensor(stored(a, ta), dev), pw.tensor(stored(b, tb), dev), ta, tb, alpha, beta, out=out)
    assert_close(out.numpy(), ref_gemm(a, b, alpha, beta, c))


@pytest.mark.parametrize("ta,tb", TRANS)
@pytest.mark.parametrize(
    "m,n,k", [(64, 1024, 1024), (7, 33, 2000), (130, 70, 4001), (65, 65, 777), (1030, 130, 4100), (5, 131, 40001)]
)
def test_split_k_small_outputs_long_k(dev, rng, m, n, k, ta, tb):
    """Few output tiles and long K take the split-K path (partial products +
    reduce); 1030 x 130 x 4100 is a long-K output of 34 tiles of 64x128,
    whose splits the wave model picks (gemm_plan.cpp long_k_splits); K = 40001
    takes up to 32 splits instead of 16."""
    a, b, c = rand(rng, m, k), rand(rng, k, n), rand(rng, m, n)
    out = pw.tensor(c, dev)
    pw.gemm(pw.tensor(stored(a, ta), dev), pw.tensor(stored(b, tb), dev), ta, tb, 1.5, -0.5, out=out)
    assert_close(out.numpy(), ref_gemm(a, b, 1.5, -0.5, c), atol_scale=k_tolerance(k))
    poison = poisoned(dev, (m, n))
    pw.gemm(pw.tensor(stored(a, ta), dev), pw.tensor(stored(b, tb), dev), ta, tb, out=poison)
    assert_close(poison.numpy(), ref_gemm(a, b), atol_scale=k_tolerance(k))


@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False)])
@pytest.mark.parametrize("m,n,k", [(1000, 1600, 600), (1030, 2300, 1030), (777, 768, 768), (256, 2304, 768)])
def test_mid_k_outputs_of_many_tiles(dev, rng, m, n, k, ta, tb):
    """512 <= K < 2048 on outputs of 192 to 383 tiles of 64x128 take those
    tiles and the wave model's splits: 208 tiles unsplit, 306 tiles in 3
    splits (with the separate unchecked K loop: 918 workgroups); 78 and 72
    tiles take them where the splits fill most of a wave (3 splits each)."""
    a, b, c = rand(rng, m, k), rand(rng, k, n), rand(rng, m, n)
    out = pw.tensor(c, dev)
    pw.gemm(pw.tensor(stored(a, ta), dev), pw.tensor(stored(b, tb), dev), ta, tb, 1.5, -0.5, out=out)
    assert_close(out.numpy(), ref_gemm(a, b, 1.5, -0.5, c), atol_scale=k_tolerance(k))


@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False)])
@pytest.mark.parametrize("m,n,k", [(256, 768, 768), (1024, 768, 768), (384, 768, 1536)])
def test_split_k_one_more_split_past_a_wave(dev, rng, m, n, k, ta, tb):
    """64x64-tile products whose split-K workgroups would land just past a
    whole wave of the 264 slots take one split more (gemm_plan.cpp choose_splits):
    48 tiles 6 -> 7 splits (110 K each, below the usual 128), 192 tiles 3 ->
    4, 72 tiles 8 -> 9."""
    a, b, c = rand(rng, m, k), rand(rng, k, n), rand(rng, m, n)
    out = pw.tensor(c, dev)
    pw.gemm(pw.tensor(stored(a, ta), dev), pw.tensor(stored(b, tb), dev), ta, tb, 0.5, 2.0, out=out)
    assert_close(out.numpy(), ref_gemm(a, b, 0.5, 2.0, c), atol_scale=k_tolerance(k))


@pytest.mark.parametrize("splits", ["1", "2", "3", "7", "64", "100000"])
def test_forced_split_counts(rng, monkeypatch, splits):
    """PYWGTRAIN_GEMM_SPLITS (read when a Device opens) forces the split count: any
    value, past the K tiles or the workspace binding included, gives the
    product (clamped, never an invalid binding or an empty split)."""
    dev = switched_device(monkeypatch, PYWGTRAIN_GEMM_SPLITS=splits)
    for m, n, k, ta, tb in [(130, 70, 1000, False, False), (65, 300, 2100, True, False), (7, 9, 40, False, True)]:
        a, b, c = rand(rng, m, k), rand(rng, k, n), rand(rng, m, n)
        out = pw.tensor(c, dev)
        pw.gemm(pw.tensor(stored(a, ta), dev), pw.tensor(stored(b, tb), dev), ta, tb, 1.0, 1.0, out=out)
        assert_close(out.numpy(), ref_gemm(a, b, 1.0, 1.0, c), atol_scale=k_tolerance(k))


def test_heuristic_warps_by_mode(rng, monkeypatch, tmp_path):
    """Untuned (autotuning off, an empty plan cache), a product on 64x128
    tiles runs warps on 4x8 thread blocks in TN and on 8x4 in the other
    modes; a forced WARP_W is kept as given."""
    monkeypatch.setenv("PYWGTRAIN_CACHE", str(tmp_path))
    monkeypatch.setenv("PYWGTRAIN_GEMM_AUTOTUNE", "0")
    dev = pw.Device()
    m, n, k = 1024, 2048, 16
    for ta, tb in TRANS:
        a, b = rand(rng, m, k), rand(rng, k, n)
        out = poisoned(dev, (m, n))
        names = [x for x in gemm_kernels(dev, a, b, ta, tb, out=out) if x.startswith("gemm:gemm;")]
        assert [tile_size([x]) for x in names] == [(64, 128)], names
        assert constant_of(names[0], "WARP_W") == ("4u" if (ta, tb) == (True, False) else "8u"), (ta, tb, names)
        assert_close(out.numpy(), ref_gemm(a, b), atol_scale=k_tolerance(k))
    dev = switched_device(monkeypatch, PYWGTRAIN_GEMM_TILES="64,128,16,8,4,8")
    names = gemm_kernels(dev, rand(rng, m, k), rand(rng, k, n), True, False)
    assert [constant_of(x, "WARP_W") for x in names if x.startswith("gemm:gemm;")] == ["8u"]


@pytest.mark.parametrize("entry", ["plain", "bias_act", "bias_act_train", "act_grad", "bias_residual"])
def test_split_reduce_quads(rng, monkeypatch, entry):
    """The split-K reduce sums four columns per thread (splitk_reduce4) where
    N is a multiple of 4, one column per thread otherwise and always for the
    activation gradient (no vec4 epilogue); each fused epilogue is applied
    once, into NaN-poisoned outputs (the plain one with alpha and beta too)."""
    dev = switched_device(monkeypatch, PYWGTRAIN_GEMM_SPLITS="3")
    for m, n, k in [(197, 252, 333), (197, 250, 333), (5, 4, 100)]:
        quads = n % 4 == 0 and entry != "act_grad"
        expected = ["gemm:gemm", "gemm:splitk_reduce4" if quads else "gemm:splitk_reduce"]
        if entry != "plain":
            names = fused_epilogue_kernels(dev, rng, entry, (m, n, k))
            assert kinds(names) == expected, (m, n, k, names)
            continue
        for alpha, beta in [(1.0, 0.0), (0.5, -2.0)]:
            a, b, c = rand(rng, m, k), rand(rng, k, n), rand(rng, m, n)
            out = pw.tensor(c, dev) if beta else poisoned(dev, (m, n))
            names = gemm_kernels(dev, a, b, False, True, alpha, beta, out)
            assert kinds(names) == expected, (m, n, k, names)
            assert_close(out.numpy(), ref_gemm(a, b, alpha, beta, c if beta else None), atol_scale=k_tolerance(k))


@pytest.mark.parametrize("group", ["1", "3", "8"])
def test_grouped_tile_order(rng, monkeypatch, group):
    """PYWGTRAIN_GEMM_GROUP_M=N: workgroups walk N tile rows
    per tile column. Every output tile is computed once, with full groups, a
    last group of fewer rows (11 rows of 64-row tiles in groups of 3 or 8),
    fewer rows than one group, split-K planes, and a bias + ReLU epilogue."""
    from pywgtrain import _core

    monkeypatch.setenv("PYWGTRAIN_GEMM_GROUP_M", group)
    monkeypatch.setenv("PYWGTRAIN_GEMM_TILES", "64,128,16,8,4,8")
    for (m, n, k), splits in [((700, 300, 100), "1"), ((150, 1000, 50), "1"), ((700, 260, 600), "3")]:
        dev = switched_device(monkeypatch, PYWGTRAIN_GEMM_SPLITS=splits)
        for ta, tb in TRANS:
            a, b = rand(rng, m, k), rand(rng, k, n)
            out = poisoned(dev, (m, n))
            pw.gemm(pw.tensor(stored(a, ta), dev), pw.tensor(stored(b, tb), dev), ta, tb, out=out)
            assert_close(out.numpy(), ref_gemm(a, b), atol_scale=k_tolerance(k))
    m, n, k = 700, 300, 100
    x, w, bias = rand(rng, m, k), rand(rng, n, k), rand(rng, n)
    out = poisoned(dev, (m, n))
    with dev.batch() as rec:
        _core.gemm_bias_act(
            rec,
            pw.tensor(x, dev)._buf,
            pw.tensor(w, dev)._buf,
            pw.tensor(bias, dev)._buf,
            out._buf,
            None,
            m,
            n,
            k,
            False,
            True,
            1,
        )
    assert_close(out.numpy(), np.maximum(x.astype(np.float64) @ w.T + bias, 0), atol_scale=k_tolerance(k))


def captured_kernels(dev, product):
    """Runs product() inside a captured batch; returns the kernel names it recorded."""
    with dev.batch() as rec:
        rec.begin_capture()
        product()
        return rec.end_capture().kernel_names()


def gemm_kernels(dev, a, b, ta, tb, alpha=1.0, beta=0.0, out=None):
    """pw.gemm of op(A) = a, op(B) = b stored per ta / tb into out, captured;
    returns the kernel names it recorded."""
    return captured_kernels(
        dev, lambda: pw.gemm(pw.tensor(stored(a, ta), dev), pw.tensor(stored(b, tb), dev), ta, tb, alpha, beta, out=out)
    )


def stream_k_counts(names):
    """How many stream-K dispatches (main pass, fixup) the names hold."""
    return sum(n.startswith("gemm:gemm_stream_k;") for n in names), sum(
        n.startswith("gemm:stream_k_fixup;") for n in names
    )


def kinds(names):
    """Shader and entry point of each recorded kernel."""
    return [n.split(";")[0] for n in names]


def fused_epilogue_kernels(dev, rng, entry, shape):
    """One fused epilogue on fresh data of shape (m, n, k), into poisoned
    outputs, checked against float64: x @ W.T with bias + ReLU ("bias_act"),
    the same keeping the pre-activation ("bias_act_train"), times ReLU'(Z) of
    a stored Z ("act_grad"), bias + residual ("bias_residual"), or dW = dZ^T X
    with db = dZ^T 1 ("rowsum"). Returns the kernel names it recorded."""
    from pywgtrain import _core

    m, n, k = shape
    a, w = rand(rng, m, k), rand(rng, n, k)
    z = a.astype(np.float64) @ w.T.astype(np.float64)
    ta, tw = pw.tensor(a, dev), pw.tensor(w, dev)
    bias, pre, res = rand(rng, n), rand(rng, m, n), rand(rng, m, n)
    dz, x = rand(rng, k, m), rand(rng, k, n)
    out, pre_out, db = poisoned(dev, (m, n)), poisoned(dev, (m, n)), poisoned(dev, (m,))

    def product():
        rec = dev._local.recorder
        bias_buf = pw.tensor(bias, dev)._buf
        if entry == "act_grad":
            _core.gemm_act_grad(rec, ta._buf, tw._buf, pw.tensor(pre, dev)._buf, out._buf, m, n, k, False, True, 1)
        elif entry == "bias_residual":
            res_buf = pw.tensor(res, dev)._buf
            _core.gemm_bias_residual(rec, ta._buf, tw._buf, bias_buf, res_buf, out._buf, m, n, k, False, True)
        elif entry == "rowsum":
            dz_buf, x_buf = pw.tensor(dz, dev)._buf, pw.tensor(x, dev)._buf
            _core.linear_weight_grads(rec, dz_buf, x_buf, out._buf, db._buf, k, m, n, 0.0)
        else:
            keep = pre_out._buf if entry == "bias_act_train" else None
            _core.gemm_bias_act(rec, ta._buf, tw._buf, bias_buf, out._buf, keep, m, n, k, False, True, 1)

    names = captured_kernels(dev, product)
    if entry == "act_grad":
        assert_close(out.numpy(), z * (pre > 0), atol_scale=k_tolerance(k))
    elif entry == "bias_residual":
        assert_close(out.numpy(), z + bias + res, atol_scale=k_tolerance(k))
    elif entry == "rowsum":
        assert_close(out.numpy(), dz.T.astype(np.float64) @ x, atol_scale=k_tolerance(k))
        assert_close(db.numpy(), dz.astype(np.float64).sum(0), atol_scale=k_tolerance(k))
    else:
        assert_close(out.numpy(), np.maximum(z + bias, 0), atol_scale=k_tolerance(k))
        if entry == "bias_act_train":
            assert_close(pre_out.numpy(), z + bias, atol_scale=k_tolerance(k))
    return names


@pytest.mark.parametrize("workers", ["1", "7", "264", "100000"])
def test_forced_stream_k(rng, monkeypatch, workers):
    """PYWGTRAIN_GEMM_STREAM_K=W runs products as stream-K
    over W workgroups: ranges of K steps that start and end inside tiles,
    ragged tiles, alpha and beta, every transpose mode, into C with NaN
    where beta is 0. Where stream-K does not apply (more workers than K
    steps, a workgroup's range past the bounded loops) the tiled path runs."""
    dev = switched_device(monkeypatch, PYWGTRAIN_GEMM_STREAM_K=workers)
    ran = 0
    for (m, n, k), (ta, tb) in zip(
        [(129, 200, 777), (65, 130, 1500), (7, 33, 129), (777, 300, 2304), (200, 129, 64), (64, 128, 16)],
        itertools.cycle(TRANS),
    ):
        for alpha, beta in [(1.0, 0.0), (0.5, -2.0)]:
            a, b, c = rand(rng, m, k), rand(rng, k, n), rand(rng, m, n)
            out = pw.tensor(c, dev) if beta else poisoned(dev, (m, n))
            main, fixup = stream_k_counts(gemm_kernels(dev, a, b, ta, tb, alpha, beta, out))
            assert main == fixup and main <= 1
            ran += main
            expected = ref_gemm(a, b, alpha, beta, c if beta else None)
            assert_close(out.numpy(), expected, atol_scale=k_tolerance(k))
    assert ran >= {"1": 3, "7": 10, "264": 6, "100000": 0}[workers]


@pytest.mark.parametrize("lean", ["0", "1"])
@pytest.mark.parametrize("ta,tb", TRANS)
def test_stream_k_after_whole_waves(rng, monkeypatch, ta, tb, lean):
    """Products whose 64x128 tiles fill whole waves of the W stream-K workers
    and part of one more run those waves' tile rows as plain tiles (one
    dispatch) and only the rows after them by stream-K (main pass + fixup),
    with alpha, beta, and NaN in C where beta is 0. Shapes: 5x4 tiles on 4
    workers (4 rows plain, then one tile row of 44 rows), 13x3 tiles on 7
    workers (11 rows plain, then 73 rows)."""
    monkeypatch.setenv("PYWGTRAIN_GEMM_TILES", f"64,128,16,8,4,8,{lean}")
    for (m, n, k), workers in [((300, 400, 200), "4"), ((777, 300, 500), "7")]:
        dev = switched_device(monkeypatch, PYWGTRAIN_GEMM_STREAM_K=workers)
        for alpha, beta in [(1.0, 0.0), (0.5, -2.0)]:
            a, b, c = rand(rng, m, k), rand(rng, k, n), rand(rng, m, n)
            out = pw.tensor(c, dev) if beta else poisoned(dev, (m, n))
            names = gemm_kernels(dev, a, b, ta, tb, alpha, beta, out)
            assert kinds(names) == ["gemm:gemm", "gemm:gemm_stream_k", "gemm:stream_k_fixup"], names
            assert_close(out.numpy(), ref_gemm(a, b, alpha, beta, c if beta else None), atol_scale=k_tolerance(k))


@pytest.mark.parametrize("entry", ["bias_act", "bias_act_train", "act_grad", "bias_residual"])
@pytest.mark.parametrize(
    "shape,workers,expected",
    [
        ((150, 260, 333), "11", ["gemm:gemm_stream_k", "gemm:stream_k_fixup"]),
        ((300, 300, 150), "4", ["gemm:gemm", "gemm:gemm_stream_k", "gemm:stream_k_fixup"]),
    ],
    ids=["all_stream_k", "after_whole_waves"],
)
def test_stream_k_fused_epilogues(rng, monkeypatch, entry, shape, workers, expected):
    """Each fused epilogue of x @ W.T is applied once: by the fixup over the
    summed slots (3x3 tiles of 64x128 on 11 workers: all stream-K), and also
    in-kernel by the plain tile rows before the stream-K rows (5x3 tiles on 4
    workers)."""
    dev = switched_device(monkeypatch, PYWGTRAIN_GEMM_TILES="64,128,16,8,4,8", PYWGTRAIN_GEMM_STREAM_K=workers)
    got = kinds(fused_epilogue_kernels(dev, rng, entry, shape))
    assert got == expected, got


def test_stream_k_rowsum_epilogue(rng, monkeypatch):
    """The row-sum epilogue under stream-K: the plain product by stream-K, the
    bias gradient in a column-sum pass of its own (dW = dZ^T X, db = dZ^T 1)."""
    dev = switched_device(monkeypatch, PYWGTRAIN_GEMM_STREAM_K="11")
    main, fixup = stream_k_counts(fused_epilogue_kernels(dev, rng, "rowsum", (150, 260, 333)))
    assert main == fixup == 1


def constant_of(name, constant):
    """The value of a specialization constant in a recorded kernel's name
    ("gemm:gemm;BM=64u;...;ALIGNED=true;..."), as written there."""
    return name.split(f";{constant}=")[1].split(";")[0]


def gemm_flags(names, constant):
    """A bool constant (ALIGNED, EDGE_SHIFT) of each recorded gemm-entry dispatch."""
    return [constant_of(n, constant) == "true" for n in names if n.startswith("gemm:gemm;")]


def aligned_flags(names):
    return gemm_flags(names, "ALIGNED")


def thread_tile_8x4(names):
    """Whether the recorded gemm-entry dispatches run 8x4 per thread."""
    return all(";TM=8u;TN=4u;" in n for n in names if n.startswith("gemm:gemm;"))


def tile_size(names):
    """(BM, BN) of the recorded gemm-entry dispatch."""
    (name,) = [n for n in names if n.startswith("gemm:gemm;")]
    return tuple(int(constant_of(name, c).rstrip("u")) for c in ("BM", "BN"))


@pytest.mark.parametrize(
    "tiles", ["64,128,16,8,4,8,0", "64,128,16,8,4,8,1", "32,128,16,8,4,8,1", "64,64,16,4,4", "128,128,16,8,8,8"]
)
def test_transposed_b_loads_in_pairs(rng, monkeypatch, tiles):
    """B stored along k (NT) loads as 64-bit k pairs (B_PAIR) where K, its
    leading dimension, is even, a thread holds an even number of B slots
    (64x128, 32x128 and 128x128 tiles, not 64x64) and the dispatch is not
    ALIGNED (128x128 tiles run NT aligned; on the H100 pairs there went wrong,
    gemm_notes #108): plain and lean K loops, edge tiles, a partial first K
    step, split-K and stream-K, each into a NaN-poisoned output; with
    PYWGTRAIN_GEMM_PAIR=0 the same product runs without it."""
    monkeypatch.setenv("PYWGTRAIN_GEMM_TILES", tiles)
    pairs_fit = not tiles.startswith("64,64")
    cases = [
        (130, 300, 200, {}),
        (130, 300, 201, {}),
        (200, 300, 100, {}),
        (70, 260, 510, {"PYWGTRAIN_GEMM_SPLITS": "3"}),
    ]
    if tiles.startswith("64,128"):
        cases.append((70, 260, 510, {"PYWGTRAIN_GEMM_STREAM_K": "5"}))
    for m, n, k, env in cases:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        for pair_switch in ("", "0"):
            dev = switched_device(monkeypatch, PYWGTRAIN_GEMM_PAIR=pair_switch)
            a, b = rand(rng, m, k), rand(rng, k, n)
            out = poisoned(dev, (m, n))
            names = [x for x in gemm_kernels(dev, a, b, False, True, out=out) if x.startswith("gemm:gemm")]
            assert names, (m, n, k)
            for x in names:
                aligned = x.startswith("gemm:gemm;") and constant_of(x, "ALIGNED") == "true"
                expected = pairs_fit and k % 2 == 0 and pair_switch == "" and not aligned
                assert constant_of(x, "B_PAIR") == str(expected).lower(), (m, n, k, x)
            assert_close(out.numpy(), ref_gemm(a, b), atol_scale=k_tolerance(k))
        for name in env:
            monkeypatch.delenv(name)
    if tiles.startswith("128,128"):
        # The case that went wrong on the H100 runs aligned (its edges shifted,
        # K's partial step first), so without pairs.
        dev = switched_device(monkeypatch)
        names = gemm_kernels(dev, rand(rng, 200, 100), rand(rng, 100, 300), False, True)
        assert gemm_flags(names, "ALIGNED") == [True] and gemm_flags(names, "EDGE_SHIFT") == [True], names


@pytest.mark.parametrize("tiles", ["", "64,128,16,8,4,8,1", "64,64,16,4,4,16"])
@pytest.mark.parametrize("ta,tb", TRANS)
def test_aligned_dispatches(rng, monkeypatch, tiles, ta, tb):
    """Dispatches whose tiles all lie inside the matrices once the last tile
    row and column are moved to end at the matrix's edge (EDGE_SHIFT, only
    where M, N or K is ragged), compile without bounds checks (ALIGNED), a
    partial K step running first: whole tiles and K steps; ragged M, N and K;
    K shorter than one K step; three splits of
    22, 22 and 21 K steps, and of 22, 22 and 21 1/4 (the partial step in the
    last split only). With alpha, beta and NaN in C where beta is 0. M or N
    below one tile, transposed B on 8x4 thread tiles (slower aligned on the
    H100), or PYWGTRAIN_GEMM_ALIGNED=0 take the checked kernel."""
    if tiles:
        monkeypatch.setenv("PYWGTRAIN_GEMM_TILES", tiles)
    cases = [((128, 256, 16), "1"), ((192, 384, 1040), "1"), ((192, 384, 1040), "3"), ((192, 384, 1044), "3")]
    cases += [((130, 256, 64), "1"), ((128, 250, 64), "1"), ((128, 256, 72), "1"), ((197, 333, 9), "1")]
    cases += [((40, 256, 64), "1"), ((128, 60, 64), "1")]
    for (m, n, k), splits in cases:
        dev = switched_device(monkeypatch, PYWGTRAIN_GEMM_SPLITS=splits)
        for alpha, beta in [(1.0, 0.0), (0.5, -2.0)]:
            a, b, c = rand(rng, m, k), rand(rng, k, n), rand(rng, m, n)
            out = pw.tensor(c, dev) if beta else poisoned(dev, (m, n))
            names = gemm_kernels(dev, a, b, ta, tb, alpha, beta, out)
            bm, bn = tile_size(names)
            inside = m >= bm and n >= bn  # whole tiles or a ragged edge that moves
            aligned = inside and not (tb and thread_tile_8x4(names))
            shifted = inside and (m % bm or n % bn or (aligned and k % 16))
            assert aligned_flags(names) == [aligned], ((m, n, k), splits, names)
            assert gemm_flags(names, "EDGE_SHIFT") == [bool(shifted)], ((m, n, k), splits, names)
            assert_close(out.numpy(), ref_gemm(a, b, alpha, beta, c if beta else None), atol_scale=k_tolerance(k))
    dev = switched_device(monkeypatch, PYWGTRAIN_GEMM_ALIGNED="0", PYWGTRAIN_GEMM_SPLITS="1")
    a, b = rand(rng, 128, 64), rand(rng, 64, 256)
    out = poisoned(dev, (128, 256))
    names = gemm_kernels(dev, a, b, ta, tb, out=out)
    assert aligned_flags(names) == [False], names
    assert_close(out.numpy(), ref_gemm(a, b), atol_scale=k_tolerance(64))


@pytest.mark.parametrize("entry", ["bias_act_train", "act_grad", "bias_residual", "rowsum"])
def test_aligned_fused_epilogues(rng, monkeypatch, entry):
    """Each fused epilogue on an aligned dispatch (x @ W.T on 64x64 tiles; the
    row-sum one as dW = dZ^T X with db), into poisoned outputs: whole tiles
    (192 x 256 x 320), and ragged M, N and K (197 x 250 x 333), whose last
    tile row and column are moved inside and store only their own outputs."""
    dev = switched_device(monkeypatch, PYWGTRAIN_GEMM_TILES="64,64,16,4,4")
    for shape in [(192, 256, 320), (197, 250, 333)]:
        names = fused_epilogue_kernels(dev, rng, entry, shape)
        assert aligned_flags(names) and all(aligned_flags(names)), (shape, names)


@pytest.mark.parametrize("rows", ["1", "777", "1000000000"])
def test_nt_as_nn_on_transposed_b(rng, monkeypatch, rows):
    """NT products with many rows run as NN on a transposed copy of B (PYWGTRAIN_GEMM_NT_ROWS, read
    when a Device opens: 1 sends every NT product with N, K >= 256 that way, 10^9 none), plain and with the fused
    bias + GELU epilogue, into poisoned outputs."""
    dev = switched_device(monkeypatch, PYWGTRAIN_GEMM_NT_ROWS=rows)
    for m, n, k in [(7, 257, 300), (768, 256, 256), (1000, 301, 257), (777, 1025, 999), (900, 255, 4000)]:
        a, b = rand(rng, m, k), rand(rng, n, k)
        out = poisoned(dev, (m, n))
        pw.gemm(pw.tensor(a, dev), pw.tensor(b, dev), trans_b=True, out=out)
        assert_close(out.numpy(), ref_gemm(a, b.T), atol_scale=k_tolerance(k))
    x, w, bias = rand(rng, 800, 384), rand(rng, 300, 384), rand(rng, 300)
    y = pw.linear(pw.tensor(x, dev), pw.tensor(w, dev), pw.tensor(bias, dev), activation="gelu")
    z = ref_gemm(x, w.T) + bias
    ref = 0.5 * z * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))
    assert_close(y.numpy(), ref, atol_scale=k_tolerance(384))


def gemm_dispatches(names):
    return sum(n.startswith("gemm:gemm;") for n in names)


@pytest.mark.parametrize("tb", [False, True])
def test_row_split(rng, monkeypatch, tb):
    """Ragged M in NN and NT products, run as its whole 64-row tile rows and
    the rest (PYWGTRAIN_GEMM_ROW_SPLIT=1; the lower part binds views of A and
    C from its first row), with alpha and beta, into NaN-poisoned outputs
    where beta is 0; =0 keeps one product. M below one tile row, whole tile
    rows and transposed A never split."""
    monkeypatch.setenv("PYWGTRAIN_GEMM_SPLITS", "1")
    cases = [((65, 130, 77), False), ((777, 300, 200), False), ((129, 4, 3), False), ((197, 250, 9), False)]
    cases += [((63, 130, 77), False), ((128, 70, 33), False), ((777, 300, 200), True)]
    for split in ["1", "0"]:
        dev = switched_device(monkeypatch, PYWGTRAIN_GEMM_ROW_SPLIT=split)
        for (m, n, k), ta in cases:
            for alpha, beta in [(1.0, 0.0), (0.5, -2.0)]:
                a, b, c = rand(rng, m, k), rand(rng, k, n), rand(rng, m, n)
                out = pw.tensor(c, dev) if beta else poisoned(dev, (m, n))
                names = gemm_kernels(dev, a, b, ta, tb, alpha, beta, out)
                splits = split == "1" and m % 64 and m > 64 and not ta
                assert gemm_dispatches(names) == (2 if splits else 1), ((m, n, k), names)
                assert_close(out.numpy(), ref_gemm(a, b, alpha, beta, c if beta else None), atol_scale=k_tolerance(k))
    with pytest.raises(ValueError, match="PYWGTRAIN_GEMM_ROW_SPLIT must be 0 or 1, got 'yes'"):
        switched_device(monkeypatch, PYWGTRAIN_GEMM_ROW_SPLIT="yes")


@pytest.mark.parametrize("entry", ["bias_act_train", "act_grad", "bias_residual"])
def test_row_split_fused_epilogues(rng, monkeypatch, entry):
    """The fused epilogues on a row-split product (197 = 3 x 64 + 5 rows): the
    lower part's pre-activation and residual are views like its C."""
    dev = switched_device(monkeypatch, PYWGTRAIN_GEMM_SPLITS="1", PYWGTRAIN_GEMM_ROW_SPLIT="1")
    names = fused_epilogue_kernels(dev, rng, entry, (197, 250, 333))
    assert gemm_dispatches(names) == 2, names


def swapped_flags(names):
    """TRANS_C of each recorded gemm-entry dispatch, and whether a transpose ran."""
    return gemm_flags(names, "TRANS_C"), any(n.startswith("gemm:transpose;") for n in names)


@pytest.mark.parametrize("tiles", ["", "64,128,16,8,4,8,1", "64,64,16,4,4,16"])
@pytest.mark.parametrize("splits", ["1", "3"])
def test_nt_swapped(rng, monkeypatch, tiles, splits):
    """NT products with fewer rows than that and many columns run as
    C^T = B A^T: NN on a transposed copy of A, storing C transposed
    (TRANS_C; PYWGTRAIN_GEMM_NT_SWAP_COLS=1 sends every NT product there),
    unsplit and in three splits (whose partials are stored
    transposed), with alpha and beta, into NaN-poisoned outputs where beta is
    0. M = 777: the copy's rows are padded to 780 floats, and the ragged last
    tile column of the swapped product moves to end at column 780 (the vec4
    loads of the copy need an origin that is a multiple of 4) and stores only
    its own columns. The swapped products whose tiles all fit run aligned."""
    monkeypatch.setenv("PYWGTRAIN_GEMM_NT_SWAP_COLS", "1")
    monkeypatch.setenv("PYWGTRAIN_GEMM_SPLITS", splits)
    dev = switched_device(monkeypatch, PYWGTRAIN_GEMM_TILES=tiles or None)
    for m, n, k in [(777, 1025, 999), (777, 1024, 130), (130, 257, 31), (7, 257, 300), (256, 260, 64), (65, 65, 777)]:
        for alpha, beta in [(1.0, 0.0), (0.5, -2.0)]:
            a, b, c = rand(rng, m, k), rand(rng, n, k), rand(rng, m, n)
            out = pw.tensor(c, dev) if beta else poisoned(dev, (m, n))
            names = gemm_kernels(dev, a, b.T, False, True, alpha, beta, out)
            flags, transposed = swapped_flags(names)
            assert transposed and flags and all(flags), ((m, n, k), names)
            bm, bn = tile_size(names)
            assert aligned_flags(names) == [n >= bm and m >= bn], ((m, n, k), names)
            assert_close(out.numpy(), ref_gemm(a, b.T, alpha, beta, c if beta else None), atol_scale=k_tolerance(k))
    dev = switched_device(monkeypatch, PYWGTRAIN_GEMM_NT_SWAP_COLS="1000000000")
    a, b = rand(rng, 777, 99), rand(rng, 1025, 99)
    out = poisoned(dev, (777, 1025))
    flags, transposed = swapped_flags(gemm_kernels(dev, a, b.T, False, True, out=out))
    assert not transposed and not any(flags)
    assert_close(out.numpy(), ref_gemm(a, b.T), atol_scale=k_tolerance(99))


@pytest.mark.parametrize("workers", ["7", "16"])
def test_nt_swapped_stream_k(rng, monkeypatch, workers):
    """A swapped NT product by stream-K: the partial slots hold the swapped
    product's tiles, and the fixup stores C transposed (walking C's rows);
    4097 x 300 swapped runs its first 64 tile rows as plain tiles (storing
    C transposed in the gemm entry) and the last by stream-K."""
    dev = switched_device(monkeypatch, PYWGTRAIN_GEMM_NT_SWAP_COLS="1", PYWGTRAIN_GEMM_STREAM_K=workers)
    for m, n, k in [(133, 700, 401), (300, 4097, 100)]:
        a, b = rand(rng, m, k), rand(rng, n, k)
        out = poisoned(dev, (m, n))
        names = gemm_kernels(dev, a, b.T, False, True, out=out)
        assert stream_k_counts(names) == (1, 1), names
        assert all(constant_of(x, "TRANS_C") == "true" for x in names if x.startswith("gemm:stream_k_fixup;"))
        assert_close(out.numpy(), ref_gemm(a, b.T), atol_scale=k_tolerance(k))


def test_nt_swapped_by_default(rng, monkeypatch):
    """The default rule: from 256 rows (below the 4096 of the transposed-B
    path), 8192 columns and 2^30 multiply-adds, where M's last 128 (the
    swapped product's tile columns) are no emptier than its last 64 (the
    direct product's tile rows): 480 = 3 x 128 + 96 swaps, 320 = 2 x 128 + 64
    does not."""
    dev = switched_device(monkeypatch, PYWGTRAIN_GEMM_NT_SWAP_COLS=None)
    cases = [((256, 8192, 512), True), ((480, 8192, 300), True), ((320, 8192, 512), False)]
    cases += [((255, 8192, 600), False), ((256, 8188, 600), False), ((256, 8192, 500), False)]
    for (m, n, k), swapped in cases:
        a, b = rand(rng, m, k), rand(rng, n, k)
        out = poisoned(dev, (m, n))
        flags, transposed = swapped_flags(gemm_kernels(dev, a, b.T, False, True, out=out))
        assert transposed == swapped and flags == [swapped] * len(flags), (m, n, k)
        assert_close(out.numpy(), ref_gemm(a, b.T), atol_scale=k_tolerance(k))


@pytest.mark.parametrize("name", ["PYWGTRAIN_GEMM_NT_ROWS", "PYWGTRAIN_GEMM_NT_SWAP_COLS"])
def test_nt_rows_setting_is_checked(monkeypatch, name):
    with pytest.raises(ValueError, match=f"{name} must be a non-negative integer, got 'many'"):
        switched_device(monkeypatch, **{name: "many"})


def test_gemm_beta_zero_ignores_nan_in_out(dev, rng):
    a, b = rand(rng, 20, 30), rand(rng, 30, 10)
    out = poisoned(dev, (20, 10))
    pw.gemm(a, b, out=out, beta=0.0)
    assert_close(out.numpy(), ref_gemm(a, b))


@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize(
    "n,k",
    [
        (1, 1),
        (7, 33),
        (129, 1000),
        (1000, 129),
        (4099, 257),
        (300, 5000),
        (64, 2051),
        (4100, 129),
        (8192, 33),
        # K a multiple of 4: with tb, the row form's 128-bit loads (gemv_t_vec4)
        (7, 4),
        (33, 4096),
        (1001, 1028),
    ],
)
def test_gemv_row_vector(dev, rng, n, k, ta, tb):
    a, b = rand(rng, 1, k), rand(rng, k, n)
    c = rand(rng, 1, n)
    out = pw.tensor(c, dev)
    pw.gemm(pw.tensor(stored(a, ta), dev), pw.tensor(stored(b, tb), dev), ta, tb, 0.75, 0.5, out=out)
    # float32 rounding scales with the terms, which may cancel (one output: -0.000857 from terms near 1)
    terms = float(np.max(ref_gemm(np.abs(a), np.abs(b), 0.75, 0.5, np.abs(c))))
    assert_close(out.numpy(), ref_gemm(a, b, 0.75, 0.5, c), atol_scale=k_tolerance(k), magnitude=terms)


@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("m,k", [(7, 33), (1000, 129), (129, 1000)])
def test_gemm_single_column(dev, rng, m, k, ta, tb):
    a, b = rand(rng, m, k), rand(rng, k, 1)
    out = poisoned(dev, (m, 1))
    pw.gemm(pw.tensor(stored(a, ta), dev), pw.tensor(stored(b, tb), dev), ta, tb, out=out)
    assert_close(out.numpy(), ref_gemm(a, b), atol_scale=k_tolerance(k))


def test_numpy_in_numpy_out_and_tensor_out(dev, rng):
    a, b = rand(rng, 9, 8), rand(rng, 8, 7)
    r = pw.gemm(a, b)
    assert isinstance(r, np.ndarray)
    assert_close(r, ref_gemm(a, b))
    t = pw.matmul(pw.tensor(a, dev), b)
    assert isinstance(t, pw.Tensor) and t.shape == (9, 7)
    assert_close(t.numpy(), ref_gemm(a, b))
    assert_close((pw.tensor(a, dev) @ pw.tensor(b, dev)).numpy(), ref_gemm(a, b))
    out = np.full((9, 7), np.nan, np.float32)
    assert pw.gemm(a, b, out=out) is out
    assert_close(out, ref_gemm(a, b))


def test_backward_products_without_host_transpose(dev, rng):
    """dA = dC B^T and dB = A^T dC (and accumulation) straight from stored buffers."""
    m, k, n = 37, 53, 29
    a, b, dc = rand(rng, m, k), rand(rng, k, n), rand(rng, m, n)
    ta, tb, tdc = pw.tensor(a, dev), pw.tensor(b, dev), pw.tensor(dc, dev)
    da = pw.gemm(tdc, tb, trans_b=True)
    db = pw.tensor(rand(rng, k, n), dev)
    db0 = db.numpy()
    pw.gemm(ta, tdc, trans_a=True, beta=1.0, out=db)
    assert_close(da.numpy(), dc.astype(np.float64) @ b.T)
    assert_close(db.numpy(), a.T.astype(np.float64) @ dc + db0)


BIG = 8200 * 4100  # floats: 134.5 MB, past lavapipe's 128 MiB storage binding


@pytest.mark.parametrize(
    "ta,tb,case",
    [
        (False, False, "A rows split along M"),
        (True, False, "A^T split along K"),
        (False, True, "B^T split along N"),
        (False, False, "B split along K"),
    ],
)
def test_gemm_operand_past_binding_limit(dev, rng, ta, tb, case):
    limit = dev.limits["max_storage_buffer_binding_size"]
    if case.startswith("A"):
        m, k, n = 8200, 4100, 9
    elif case.startswith("B^T"):
        m, k, n = 9, 4100, 8200
    else:
        m, k, n = 9, 8200, 4100
    a, b = rand(rng, m, k), rand(rng, k, n)
    big = max(a.nbytes, b.nbytes)
    if big <= limit:
        pytest.skip(f"binding limit {limit} is larger than the {big}-byte operand on this adapter")
    out = poisoned(dev, (m, n))
    pw.gemm(pw.tensor(stored(a, ta), dev), pw.tensor(stored(b, tb), dev), ta, tb, out=out)
    assert_close(out.numpy(), ref_gemm(a, b), atol_scale=k_tolerance(k))


@pytest.mark.parametrize("path", ["swapped", "row split"])
def test_gemm_output_past_binding_limit_swapped_or_row_split(rng, monkeypatch, path):
    """C past one binding on the two-product paths: an NT product run as
    C^T = B A^T (PYWGTRAIN_GEMM_NT_SWAP_COLS=1), whose transposed C is cut
    along the swapped product's columns, and a ragged-M product run as its
    whole tile rows and the rest (PYWGTRAIN_GEMM_ROW_SPLIT=1), whose lower
    part's C view starts 8192 rows in."""
    if path == "swapped":
        dev = switched_device(monkeypatch, PYWGTRAIN_GEMM_NT_SWAP_COLS="1")
        (m, n, k), tb = (300, 120000, 8), True
    else:
        dev = switched_device(monkeypatch, PYWGTRAIN_GEMM_ROW_SPLIT="1")
        (m, n, k), tb = (8207, 4100, 9), False
    if m * n * 4 <= dev.limits["max_storage_buffer_binding_size"]:
        pytest.skip("binding limit larger than the output on this adapter")
    a, b = rand(rng, m, k), rand(rng, k, n)
    out = poisoned(dev, (m, n))
    names = gemm_kernels(dev, a, b, False, tb, out=out)
    if path == "swapped":  # C cut in two blocks, both stored transposed
        assert swapped_flags(names) == ([True, True], True), names
    else:  # the upper 8192 rows cut in two blocks, then the lower 15
        assert gemm_dispatches(names) == 3, names
    assert_close(out.numpy(), ref_gemm(a, b), atol_scale=k_tolerance(k))


@pytest.mark.parametrize("tb", [False, True])
def test_gemv_matrix_past_binding_limit(dev, rng, tb):
    k, n = 4100, 8200
    a, b = rand(rng, 1, k), rand(rng, k, n)
    if b.nbytes <= dev.limits["max_storage_buffer_binding_size"]:
        pytest.skip("binding limit larger than the operand on this adapter")
    out = poisoned(dev, (1, n))
    pw.gemm(a, pw.tensor(stored(b, tb), dev), trans_b=tb, out=out)
    assert_close(out.numpy(), ref_gemm(a, b), atol_scale=k_tolerance(k))


def test_gemm_on_buffer_views(dev, rng):
    """Operands and output as aligned views inside larger buffers (how flat
    parameter arenas hand out tensors): nothing outside the view is touched."""
    align = dev.limits["min_storage_buffer_offset_alignment"]
    a, b = rand(rng, 33, 17), rand(rng, 17, 9)
    host = rand(rng, 4096)
    big = pw.tensor(host, dev)
    va = pw.Tensor(big._buf.view(align, a.nbytes), a.shape, np.float32, dev).copy_(a)
    b_at = (align + a.nbytes) // align * align + align
    vb = pw.Tensor(big._buf.view(b_at, b.nbytes), b.shape, np.float32, dev).copy_(b)
    out_big = pw.tensor(host, dev)
    vc = pw.Tensor(out_big._buf.view(2 * align, 33 * 9 * 4), (33, 9), np.float32, dev)
    pw.gemm(va, vb, out=vc)
    assert_close(vc.numpy(), ref_gemm(a, b), atol_scale=k_tolerance(17))
    rest = out_big.numpy()
    lo, hi = 2 * align // 4, 2 * align // 4 + 33 * 9
    np.testing.assert_array_equal(np.delete(rest, np.arange(lo, hi)), np.delete(host, np.arange(lo, hi)))
    with pytest.raises(ValueError, match="shares a device buffer"):
        pw.gemm(
            va,
            vb,
            out=pw.Tensor(
                big._buf.view(b_at + 2 * align + b.nbytes // align * align, 33 * 9 * 4), (33, 9), np.float32, dev
            ),
        )


def test_buffer_view_bounds_and_alignment(dev):
    align = dev.limits["min_storage_buffer_offset_alignment"]
    big = pw.zeros(1024, device=dev)
    with pytest.raises(ValueError, match="alignment"):
        big._buf.view(4, 16)
    with pytest.raises(ValueError, match="overruns"):
        big._buf.view(align, 4096)


@pytest.mark.parametrize("ta,tb", [(False, False), (True, True)])
def test_gemm_ragged_edges(dev, rng, ta, tb):
    """A large output a row and two columns past 128 multiples: the aligned part
    and the thin strips (split-K on small tiles) run as separate dispatches;
    every element, the corner included, must be written (the output is
    poisoned). The smallest shape that takes this path (>= 256 big tiles,
    K >= 512): about a minute per product on lavapipe."""
    m, n, k = 2049, 2050, 520
    a, b = rand(rng, m, k), rand(rng, k, n)
    out = poisoned(dev, (m, n))
    pw.gemm(pw.tensor(stored(a, ta), dev), pw.tensor(stored(b, tb), dev), ta, tb, alpha=0.5, out=out)
    assert_close(out.numpy(), ref_gemm(a, b, 0.5), atol_scale=k_tolerance(k))


@pytest.mark.parametrize("ta,tb", TRANS)
def test_gemm_on_padded_copies(dev, rng, ta, tb):
    """Large products whose m-major A or n-major B has a leading dimension not a
    multiple of 4 run on padded copies (128-bit loads); 1030 and 4097 are not,
    so NN pads B, TN both, TT A, NT neither. Twice, with a larger product in
    between, so the grow-only copy buffers are reused and regrown."""
    for m, n, k in [(1030, 4097, 33), (1031, 4101, 45), (1030, 4097, 33)]:
        a, b = rand(rng, m, k), rand(rng, k, n)
        out = poisoned(dev, (m, n))
        pw.gemm(pw.tensor(stored(a, ta), dev), pw.tensor(stored(b, tb), dev), ta, tb, alpha=-0.5, out=out)
        assert_close(out.numpy(), ref_gemm(a, b, -0.5), atol_scale=k_tolerance(k))


def run_with_tiles(tmp_path, tiles, code):
    """Run `code` in a fresh process with PYWGTRAIN_GEMM_TILES=tiles (read when
    its Device opens); the child resolves pywgtrain exactly as this process did."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYWGTRAIN_GEMM_TILES=tiles, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


@pytest.mark.parametrize(
    "tiles",
    [
        "64,64,32,4,4",
        "64,128,16,8,4,8",
        "64,128,16,8,4,8,1",
        "64,128,16,8,4,4,1",
        "32,128,16,8,4,8,1",
        "128,128,16,8,8,8",
        "64,64,16,4,4,4",
    ],
)
def test_forced_tile_configurations(tmp_path, tiles):
    """Tile configurations forced through PYWGTRAIN_GEMM_TILES in a fresh
    process, so every one runs here whatever lavapipe's shapes pick: the
    H100's large-output tiles (64x128, warps on 8x4 thread blocks, and on
    4x8 as TN products run them), with and without the separate unchecked K
    loop (LEAN_LOOP), the tuner's 32x128
    (the same 8x4 on 128 threads), K steps of 32, 8x8 per
    thread, 4x4 with warps narrower than the workgroup's rows. Every transpose
    mode, ragged shapes, workgroups inside and at the edges, a K tail, split-K,
    and shapes every tile configuration covers with whole tiles (ALIGNED)."""
    code = (
        "import numpy as np, pywgtrain as pw\n"
        "rng = np.random.default_rng(1)\n"
        "for (m, n, k) in [(65, 127, 33), (130, 70, 600), (7, 300, 1000), (200, 300, 100), (130, 260, 1000),\n"
        "                  (128, 256, 160), (256, 128, 1024)]:\n"
        "    for ta in (False, True):\n"
        "        for tb in (False, True):\n"
        "            a = rng.standard_normal((m, k)).astype(np.float32)\n"
        "            b = rng.standard_normal((k, n)).astype(np.float32)\n"
        "            sa = np.ascontiguousarray(a.T) if ta else a\n"
        "            sb = np.ascontiguousarray(b.T) if tb else b\n"
        "            got = pw.gemm(sa, sb, ta, tb).astype(np.float64)\n"
        "            ref = a.astype(np.float64) @ b\n"
        "            err = np.max(np.abs(got - ref)) / np.max(np.abs(ref))\n"
        "            assert err < 1e-5, (m, n, k, ta, tb, err)\n"
        "print('ok')\n"
    )
    assert run_with_tiles(tmp_path, tiles, code).strip() == "ok"


@pytest.mark.parametrize(
    "tiles, message",
    [
        ("128,64,16,8,4,3", "WARP_W 3 must divide 32"),
        ("128,64,8,8,4", "whole number (>= 1) of vec4s"),
        ("64,128,16,8,4,8,8,1", "expected BM,BN,BK,TM,TN[,WARP_W[,LEAN_LOOP]]"),
        ("64,128,16,8,4,8,2", "(LEAN_LOOP 0 or 1)"),
        ("64,128,16", "got '64,128,16'"),
    ],
)
def test_forced_tiles_must_fit_the_kernel(tmp_path, tiles, message):
    """A forced configuration the kernel cannot run (a WARP_W that does not
    tile the thread grid, tiles with less than one vec4 per thread) or that is
    not the documented list (a field too many, LEAN_LOOP other than 0 or 1,
    too few fields) is refused with the rule, not compiled into a shader
    error, run with threads missing or silently read another way."""
    code = (
        "import numpy as np, pywgtrain as pw\n"
        "a = np.ones((130, 70), np.float32)\n"
        "try:\n"
        "    pw.gemm(a, a.T.copy())\n"
        "except ValueError as e:\n"
        "    print('refused:', e)\n"
    )
    out = run_with_tiles(tmp_path, tiles, code)
    assert "refused: PYWGTRAIN_GEMM_TILES: " in out and message in out, out


def ref_batched(a, b, ta, tb, alpha=1.0, beta=0.0, c=None):
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    r = alpha * ((a64.transpose(0, 2, 1) if ta else a64) @ (b64.transpose(0, 2, 1) if tb else b64))
    return r if c is None else r + beta * c.astype(np.float64)


@pytest.mark.parametrize("ta,tb", TRANS)
@pytest.mark.parametrize(
    "batch,m,n,k",
    # one row against a growing cache (decoding), tiles partial along every
    # dimension, K of one and of many 16-steps, a single matrix
    [(6, 1, 20, 64), (3, 1, 7, 1), (5, 65, 33, 17), (2, 129, 130, 7), (4, 7, 1, 129), (1, 33, 65, 31)],
)
def test_batched_gemm_kernel(dev, rng, batch, m, n, k, ta, tb):
    """_core.gemm_batched (bmm.wgsl, compiled without wgpu's injected bounds
    checks) against float64: outputs poisoned, operands read through buffer
    views that start past other data, alpha and beta both ways."""
    from pywgtrain import _core

    a = rand(rng, batch, k, m) if ta else rand(rng, batch, m, k)
    b = rand(rng, batch, n, k) if tb else rand(rng, batch, k, n)
    align = max(dev.limits["min_storage_buffer_offset_alignment"], 4)
    lead = align // 4 * 3  # floats of other data ahead of each operand

    def placed(x):
        """A view of x placed inside a larger buffer, after `lead` floats of NaN."""
        whole = pw.tensor(np.concatenate([np.full(lead, np.nan, np.float32), x.ravel()]), dev)
        return whole._buf.view(lead * 4, x.size * 4)

    va, vb = placed(a), placed(b)
    out = poisoned(dev, (batch, m, n))
    with dev.batch() as rec:
        _core.gemm_batched(rec, va, vb, out._buf, batch, m, n, k, ta, tb, 1.0, 0.0)
    assert_close(out.numpy(), ref_batched(a, b, ta, tb), atol_scale=k_tolerance(k))
    c0 = rand(rng, batch, m, n)
    acc = pw.tensor(c0, dev)
    with dev.batch() as rec:
        _core.gemm_batched(rec, va, vb, acc._buf, batch, m, n, k, ta, tb, -0.5, 2.0)
    assert_close(acc.numpy(), ref_batched(a, b, ta, tb, -0.5, 2.0, c0), atol_scale=k_tolerance(k))
