"""GEMM autotuning: the plans it measures give correct products, persist per
device in the cache directory, and a cache written under another signature
(adapter, driver, shaders, heuristic) is ignored."""

import os

import numpy as np
import pytest

import pywgtrain as pw
from helpers import assert_close, poisoned, rand


def ref(a, b):
    return a.astype(np.float64) @ b.astype(np.float64)


@pytest.fixture
def tuned(tmp_path, monkeypatch):
    """A device of its own with autotuning on and its plan cache in tmp_path."""
    monkeypatch.setenv("PYWGTRAIN_CACHE", str(tmp_path))
    monkeypatch.setenv("PYWGTRAIN_GEMM_AUTOTUNE", "1")
    monkeypatch.setenv("PYWGTRAIN_GEMM_TUNE_ROUNDS", "1")  # which plan wins is not what these tests check
    d = pw.Device()
    assert d.gemm_autotune
    return d


def gemm_checked(d, rng, m, n, k, ta, tb):
    a, b = rand(rng, m, k), rand(rng, k, n)
    out = poisoned(d, (m, n))
    a_s = np.ascontiguousarray(a.T) if ta else a
    b_s = np.ascontiguousarray(b.T) if tb else b
    pw.gemm(pw.tensor(a_s, d), pw.tensor(b_s, d), trans_a=ta, trans_b=tb, out=out)
    assert_close(out.numpy(), ref(a, b), atol_scale=1e-5 * max(1.0, np.sqrt(k) / 4))


def plan_of(p):
    """What runs under a plan dict (gemm_plans, the tuner's candidates): tiles, splits, stream-K workers."""
    return p["tiles"], p["splits"], p["stream_k_workers"]


def device_with_plans(d, rng, lines):
    """A fresh device reading d's plan cache rewritten to hold only `lines`
    under d's signature (d tunes one product first so the file exists)."""
    gemm_checked(d, rng, 100, 300, 600, False, False)
    path = d.gemm_plan_cache
    with open(path) as f:
        signature = f.readline().rstrip("\n")
    with open(path, "w") as f:
        f.write("".join(line + "\n" for line in [signature, *lines]))
    return pw.Device()


@pytest.mark.parametrize("m,n,k,ta,tb", [(129, 200, 777, False, True), (65, 130, 1500, True, False)])
def test_tuned_plan_is_recorded_and_correct(tuned, rng, m, n, k, ta, tb):
    gemm_checked(tuned, rng, m, n, k, ta, tb)
    plans = [p for p in tuned.gemm_plans() if (p["m"], p["n"], p["k"], p["ta"], p["tb"]) == (m, n, k, ta, tb)]
    assert len(plans) == 1
    plan = plans[0]
    assert plan["splits"] >= 1 and plan["us"] > 0
    assert plan["tiles"][:2] in ((64, 64), (64, 128), (32, 128))
    # The second product of the shape reuses the plan (no new entry) and is right again.
    gemm_checked(tuned, rng, m, n, k, ta, tb)
    assert len(tuned.gemm_plans()) == 1


def test_plans_persist_and_reload(tuned, rng, tmp_path):
    gemm_checked(tuned, rng, 100, 300, 600, False, False)
    path = tuned.gemm_plan_cache
    assert path and os.path.dirname(path) == str(tmp_path) and os.path.exists(path)
    before = tuned.gemm_plans()
    with open(path) as f:
        lines = f.read().splitlines()
    assert lines[0].startswith("pywgtrain gemm plans v3 | ") and len(lines) == 2
    again = pw.Device()
    assert again.gemm_plans() == [dict(p, us=pytest.approx(p["us"], rel=1e-5)) for p in before]
    gemm_checked(again, rng, 100, 300, 600, False, False)
    assert len(again.gemm_plans()) == 1


def test_stale_or_damaged_cache_is_ignored(tuned, rng, tmp_path):
    gemm_checked(tuned, rng, 100, 300, 600, False, False)
    path = tuned.gemm_plan_cache
    with open(path) as f:
        signature, line = f.read().splitlines()
    # A cut-short line after a valid one: the valid one loads, the rest is skipped.
    with open(path, "w") as f:
        f.write(f"{signature}\n{line}\n100 300 60")
    assert len(pw.Device().gemm_plans()) == 1
    # Another signature (another driver or kernel version): nothing loads, and
    # the first new plan rewrites the file under this signature.
    with open(path, "w") as f:
        f.write(f"pywgtrain gemm plans v0 | elsewhere\n{line}\n")
    fresh = pw.Device()
    assert fresh.gemm_plans() == []
    gemm_checked(fresh, rng, 100, 300, 600, False, False)
    with open(path) as f:
        assert f.readline().rstrip("\n") == signature


def test_unsupported_plans_in_the_cache_are_not_run(tuned, rng, tmp_path):
    """A plan line with tiles the tuner never picks (a damaged or foreign
    file) is ignored: the shape is tuned afresh and the product is right."""
    again = device_with_plans(
        tuned,
        rng,
        [
            "129 200 777 0 0 0 48 48 16 3 3 0 0 1 0 1.0",  # tiles the tuner never picks
            "129 200 777 0 1 0 64 64 16 4 4 0 0 0 0 1.0",  # zero splits
            "129 200 777 1 0 0 64 64 16 4 4 0 0 1 9 1.0",  # stream-K on tiles it never uses
            "129 200 777 1 1 0 64 128 16 8 4 8 0 2 9 1.0",  # stream-K with splits
        ],
    )
    for ta, tb in [(False, False), (False, True), (True, False), (True, True)]:
        gemm_checked(again, rng, 129, 200, 777, ta, tb)
    for plan in again.gemm_plans():
        assert plan["tiles"][:5] in ((64, 64, 16, 4, 4), (64, 128, 16, 8, 4), (32, 128, 16, 8, 4))
        assert plan["splits"] >= 1
        assert plan["stream_k_workers"] == 0 or (plan["tiles"][:2] == (64, 128) and plan["splits"] == 1)


@pytest.mark.parametrize("lean,splits", [(0, 1), (1, 1), (0, 3), (1, 2)])
def test_32x128_plans_from_the_cache_run(tuned, rng, lean, splits):
    """The 32x128 candidate (8x4 per thread on 128 threads), read from the
    cache with and without LEAN_LOOP and split-K, runs as that plan in every
    transpose mode and gives the product (lavapipe's suite otherwise never
    tunes, so it would not run these tiles at all)."""
    modes = [(False, False), (False, True), (True, False), (True, True)]
    again = device_with_plans(
        tuned, rng, [f"97 260 777 {int(ta)} {int(tb)} 0 32 128 16 8 4 8 {lean} {splits} 0 1.0" for ta, tb in modes]
    )
    assert {(p["tiles"], p["splits"]) for p in again.gemm_plans()} == {((32, 128, 16, 8, 4, 8, lean), splits)}
    for ta, tb in modes:
        gemm_checked(again, rng, 97, 260, 777, ta, tb)


@pytest.mark.slow
def test_tn_plans_run_4x8_warps(tuned, rng):
    """TN products (the weight gradients) on 64x128 tiles run warps on 4x8
    thread blocks, the other modes on 8x4: the tuner's 64x128 and stream-K
    candidates take them, and cached plans are read the same way (a TN plan
    on 8x4 warps, stream-K included, or an NN one on 4x8, is a plan the tuner
    never picks: ignored and tuned afresh)."""
    # Which candidate wins is a timing; the candidate set is not (CI's lavapipe
    # once tuned both modes onto other tiles).
    for ta, tb in [(True, False), (False, False)]:
        warp = 4 if (ta, tb) == (True, False) else 8
        candidates = tuned._dev.gemm_tune_candidates(300, 1000, 700, ta, tb)
        wide = [p for p in candidates if p["tiles"][:2] == (64, 128)]
        assert any(p["stream_k_workers"] for p in wide) and any(not p["stream_k_workers"] for p in wide), candidates
        assert {p["tiles"][5] for p in wide} == {warp}, (ta, tb, wide)
        gemm_checked(tuned, rng, 300, 1000, 700, ta, tb)
        (chosen,) = [p for p in tuned.gemm_plans() if (p["ta"], p["tb"]) == (ta, tb)]
        assert plan_of(chosen) in [plan_of(p) for p in candidates], chosen
    again = device_with_plans(
        tuned,
        rng,
        [
            "129 200 777 1 0 0 64 128 16 8 4 4 1 2 0 1.0",  # TN on 4x8 warps
            "129 260 777 1 0 0 64 128 16 8 4 4 0 1 9 1.0",  # TN stream-K on 4x8 warps
            "129 300 777 1 0 0 64 128 16 8 4 8 1 1 9 1.0",  # TN stream-K on 8x4 warps
            "97 200 300 1 0 0 64 128 16 8 4 8 0 1 0 1.0",  # TN on 8x4 warps
            "97 200 300 0 0 0 64 128 16 8 4 4 0 1 0 1.0",  # NN on 4x8 warps
        ],
    )
    for m, n, ta in [(129, 200, True), (129, 260, True), (129, 300, True), (97, 200, True), (97, 200, False)]:
        gemm_checked(again, rng, m, n, 777 if m == 129 else 300, ta, False)
    plans = {(p["m"], p["n"], p["ta"]): plan_of(p) for p in again.gemm_plans()}
    assert plans[(129, 200, True)] == ((64, 128, 16, 8, 4, 4, 1), 2, 0)
    assert plans[(129, 260, True)] == ((64, 128, 16, 8, 4, 4, 0), 1, 9)
    assert plans[(129, 300, True)] != ((64, 128, 16, 8, 4, 8, 1), 1, 9)
    for ta, warp in [(True, 4), (False, 8)]:  # tuned afresh: whatever won, its warps match the mode
        tiles, _, _ = plans[(97, 200, ta)]
        assert tiles != (64, 128, 16, 8, 4, 12 - warp, 0), (ta, tiles)
        assert tiles[:2] != (64, 128) or tiles[5] == warp, (ta, tiles)


def test_stream_k_plan_from_the_cache_runs(tuned, rng, tmp_path):
    """A stream-K plan read from the cache file runs as stream-K (its two
    passes are recorded) and gives the product."""
    again = device_with_plans(tuned, rng, ["129 200 777 0 1 0 64 128 16 8 4 8 1 1 9 1.0"])
    assert [p["stream_k_workers"] for p in again.gemm_plans()] == [9]
    with again.batch() as rec:
        rec.begin_capture()
        gemm_checked(again, rng, 129, 200, 777, False, True)
        names = rec.end_capture().kernel_names()
    assert sum(n.startswith("gemm:gemm_stream_k;") for n in names) == 1
    assert sum(n.startswith("gemm:stream_k_fixup;") for n in names) == 1


def test_autotune_off_and_small_products_keep_the_heuristic(tuned, rng, monkeypatch):
    gemm_checked(tuned, rng, 20, 30, 40, False, False)  # below the tuning threshold
    assert tuned.gemm_plans() == []
    tuned.gemm_autotune = False
    assert not tuned.gemm_autotune
    gemm_checked(tuned, rng, 129, 200, 777, False, False)
    assert tuned.gemm_plans() == []
    # PYWGTRAIN_GEMM_TILES forces one configuration: no tuning under it (on a
    # Device opened with it set).
    monkeypatch.setenv("PYWGTRAIN_GEMM_TILES", "64,64,16,4,4")
    forced = pw.Device()
    assert forced.gemm_autotune
    gemm_checked(forced, rng, 129, 200, 777, False, False)
    assert forced.gemm_plans() == []


@pytest.mark.parametrize("ta,tb", [(False, True), (True, False)])
def test_tuning_rotates_copies_and_leaves_the_operands_alone(tuned, rng, ta, tb):
    """The tuner times on copies of A and B rotated like the bench's sets:
    the caller's operands are unchanged, its output written once, by the
    product, with a plan that is recorded."""
    m, n, k = 131, 257, 600
    a, b = rand(rng, m, k), rand(rng, k, n)
    a_s = np.ascontiguousarray(a.T) if ta else a
    b_s = np.ascontiguousarray(b.T) if tb else b
    ta_t, tb_t = pw.tensor(a_s, tuned), pw.tensor(b_s, tuned)
    out = poisoned(tuned, (m, n))
    pw.gemm(ta_t, tb_t, trans_a=ta, trans_b=tb, out=out)
    assert_close(out.numpy(), ref(a, b), atol_scale=1e-5 * max(1.0, np.sqrt(k) / 4))
    np.testing.assert_array_equal(ta_t.numpy(), a_s)
    np.testing.assert_array_equal(tb_t.numpy(), b_s)
    assert [(p["m"], p["n"], p["k"]) for p in tuned.gemm_plans()] == [(m, n, k)]


@pytest.mark.parametrize("after", [0, 2])
def test_tuning_without_memory_for_the_copies(tuned, rng, after):
    """The tuner's operand copies failing to allocate (out of GPU memory,
    injected from the first or the third set on) leave it the caller's
    operands or fewer sets: the product still runs right and a plan is recorded."""
    from pywgtrain import _core

    _core._inject_allocation_failures("pywgtrain.tensor", 0, 1)  # the hook itself works
    with pytest.raises(pw.OutOfMemoryError, match=r"\(pywgtrain.tensor\): injected failure"):
        pw.zeros((4,), device=tuned)
    _core._inject_allocation_failures("pywgtrain.gemm_tune_a", after, 100)
    try:
        gemm_checked(tuned, rng, 129, 200, 777, False, True)
    finally:
        _core._inject_allocation_failures("", 0, 0)
    assert [(p["m"], p["n"], p["k"]) for p in tuned.gemm_plans()] == [(129, 200, 777)]


def test_tuning_a_product_on_a_repacked_operand(tuned, rng, monkeypatch):
    """NT products with many rows run as NN on a transposed copy of B in the
    device's repack space (PYWGTRAIN_GEMM_NT_ROWS=1 sends small ones there):
    the tuner's operand copies read it (the H100 sweep stopped on a
    validation error here before the space allowed copies). N = 301: the
    copy's rows are padded to 304 floats, and the copy must hold the 128-bit
    view the kernel binds past the last row's end."""
    monkeypatch.setenv("PYWGTRAIN_GEMM_NT_ROWS", "1")
    d = pw.Device()  # the tuned fixture's settings, and the switch, read when a Device opens
    gemm_checked(d, rng, 300, 301, 257, False, True)
    assert [(p["m"], p["n"], p["k"], p["tb"]) for p in d.gemm_plans()] == [(300, 301, 257, False)]


@pytest.mark.parametrize("low_us,splits", [(300.0, True), (600.0, False)])
def test_row_split_by_measured_plans(tuned, rng, low_us, splits):
    """A product with ragged M (260 = 4 x 64 + 4 rows, 2^30 multiply-adds or
    more) runs as its whole tile rows and the rest where the tuner's times of
    the two (here read from the cache: 400 us and low_us) beat the whole
    product's (1000 us) by the tuner's margin."""
    again = device_with_plans(
        tuned,
        rng,
        [
            "260 2048 2048 0 1 0 64 128 16 8 4 8 0 1 0 1000",
            "256 2048 2048 0 1 0 64 128 16 8 4 8 0 1 0 400",
            f"4 2048 2048 0 1 0 64 64 16 4 4 0 0 1 0 {low_us}",
        ],
    )
    with again.batch() as rec:
        rec.begin_capture()
        gemm_checked(again, rng, 260, 2048, 2048, False, True)
        names = rec.end_capture().kernel_names()
    assert sum(n.startswith("gemm:gemm;") for n in names) == (2 if splits else 1), names
    assert len(again.gemm_plans()) == 3  # nothing tuned afresh


def test_tuning_a_swapped_product(tuned, rng, monkeypatch, tmp_path):
    """An NT product run as C^T = B A^T (PYWGTRAIN_GEMM_NT_SWAP_COLS=1 sends
    small ones there) is tuned as the swapped product, N x M x K NN with C
    transposed, on copies of B and of the transposed A (rows padded from 301
    to 304 floats), and its plan persists with the transposed-C flag."""
    monkeypatch.setenv("PYWGTRAIN_GEMM_NT_SWAP_COLS", "1")
    d = pw.Device()  # the tuned fixture's settings, and the switch, read when a Device opens
    gemm_checked(d, rng, 301, 300, 257, False, True)
    key = [(p["m"], p["n"], p["k"], p["ta"], p["tb"], p["tc"]) for p in d.gemm_plans()]
    assert key == [(300, 301, 257, False, False, True)]
    again = pw.Device()
    assert [(p["m"], p["n"], p["tc"]) for p in again.gemm_plans()] == [(300, 301, True)]
    gemm_checked(again, rng, 301, 300, 257, False, True)
    assert len(again.gemm_plans()) == 1


def test_tuned_products_on_views_and_fused_epilogues(tuned, rng):
    """With autotuning on (the default on GPUs; the rest of the lavapipe suite
    runs without it), products whose operands are views inside larger
    buffers, and the fused epilogues, are tuned on copies and come out right;
    nothing outside the output view is written."""
    from pywgtrain import _core

    from helpers import bias_residual

    align = tuned.limits["min_storage_buffer_offset_alignment"]
    m, n, k = 130, 200, 300
    a, b = rand(rng, m, k), rand(rng, k, n)
    host = rand(rng, 2 * (m * k + k * n) + 4 * align)
    big = pw.tensor(host, tuned)
    va = pw.Tensor(big._buf.view(align, a.nbytes), a.shape, np.float32, tuned).copy_(a)
    b_at = (2 * align + a.nbytes) // align * align
    vb = pw.Tensor(big._buf.view(b_at, b.nbytes), b.shape, np.float32, tuned).copy_(b)
    out_host = rand(rng, m * n + 2 * align)
    out_big = pw.tensor(out_host, tuned)
    vc = pw.Tensor(out_big._buf.view(align, m * n * 4), (m, n), np.float32, tuned)
    pw.gemm(va, vb, out=vc)
    tol = 1e-5 * max(1.0, np.sqrt(k) / 4)
    assert_close(vc.numpy(), ref(a, b), atol_scale=tol)
    rest, lo = out_big.numpy(), align // 4
    np.testing.assert_array_equal(
        np.delete(rest, np.arange(lo, lo + m * n)), np.delete(out_host, np.arange(lo, lo + m * n))
    )
    # Fused epilogues on x @ W.T (the plan of that shape is tuned by the first).
    w, bias, res = rand(rng, n, k), rand(rng, n), rand(rng, m, n)
    z = ref(a, w.T)
    y = pw.linear(pw.tensor(a, tuned), pw.tensor(w, tuned), pw.tensor(bias, tuned), activation="relu")
    assert_close(y.numpy(), np.maximum(z + bias, 0), atol_scale=tol)
    out = poisoned(tuned, (m, n))
    assert_close(bias_residual(tuned, a, w, bias, res, out), z + bias + res, atol_scale=tol)
    # dW = dZ^T X with db = dZ^T 1 beside it (row sums in the product, or its own pass).
    dz, x = rand(rng, k, m), rand(rng, k, n)
    dw, db = poisoned(tuned, (m, n)), poisoned(tuned, (m,))
    with tuned.batch() as rec:
        _core.linear_weight_grads(
            rec, pw.tensor(dz, tuned)._buf, pw.tensor(x, tuned)._buf, dw._buf, db._buf, k, m, n, 0.0
        )
    assert_close(dw.numpy(), ref(dz.T, x), atol_scale=tol)
    assert_close(db.numpy(), dz.astype(np.float64).sum(0), atol_scale=tol)
    assert {(p["m"], p["n"], p["k"], p["ta"], p["tb"]) for p in tuned.gemm_plans()} == {
        (m, n, k, False, False),
        (m, n, k, False, True),
        (m, n, k, True, False),
    }


def test_autotune_settings_are_checked(dev, monkeypatch):
    with pytest.raises(TypeError, match="gemm_autotune must be a bool"):
        dev.gemm_autotune = 1
    monkeypatch.setenv("PYWGTRAIN_GEMM_AUTOTUNE", "yes")
    with pytest.raises(ValueError, match="PYWGTRAIN_GEMM_AUTOTUNE must be 0 or 1"):
        pw.Device()
    monkeypatch.setenv("PYWGTRAIN_GEMM_AUTOTUNE", "1")
    for rounds in ("0", "10"):
        monkeypatch.setenv("PYWGTRAIN_GEMM_TUNE_ROUNDS", rounds)
        with pytest.raises(ValueError, match=f"PYWGTRAIN_GEMM_TUNE_ROUNDS must be from 1 to 9, got {rounds}"):
            pw.Device()
