"""Property tests (hypothesis): GEMM over random shapes/transposes/alpha/beta/out=,
and sequences of AdamW and clip calls, against float64 NumPy."""

import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import pywgtrain as pw
from helpers import assert_close
from test_optim import numpy_adamw, ref_clip

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
finite = st.floats(-2.0, 2.0, allow_nan=False, width=32)


_STREAM_K_DEVICES = {}


def _stream_k_device(stream_k):
    """A Device opened with PYWGTRAIN_GEMM_STREAM_K=stream_k (read when a
    Device opens), one per value for all examples."""
    if stream_k not in _STREAM_K_DEVICES:
        saved = os.environ.get("PYWGTRAIN_GEMM_STREAM_K")
        os.environ["PYWGTRAIN_GEMM_STREAM_K"] = stream_k
        try:
            _STREAM_K_DEVICES[stream_k] = pw.Device()
        finally:
            if saved is None:
                del os.environ["PYWGTRAIN_GEMM_STREAM_K"]
            else:
                os.environ["PYWGTRAIN_GEMM_STREAM_K"] = saved
    return _STREAM_K_DEVICES[stream_k]


@SETTINGS
@given(
    m=st.integers(1, 300),
    n=st.integers(1, 300),
    k=st.integers(1, 300),
    ta=st.booleans(),
    tb=st.booleans(),
    alpha=finite,
    beta=finite,
    use_out=st.booleans(),
    seed=st.integers(0, 2**31),
    stream_k=st.sampled_from(["", "1", "3", "17", "264"]),
)
def test_gemm_property(m, n, k, ta, tb, alpha, beta, use_out, seed, stream_k):
    """stream_k: PYWGTRAIN_GEMM_STREAM_K, the stream-K path over that many
    workgroups where it applies ("" leaves the tiled plans), on a Device
    opened with it set."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = rng.standard_normal((m, n)).astype(np.float32)
    sa = np.ascontiguousarray(a.T) if ta else a
    sb = np.ascontiguousarray(b.T) if tb else b
    if not use_out:
        beta = 0.0
    ref = alpha * (a.astype(np.float64) @ b) + (beta * c.astype(np.float64) if use_out else 0.0)
    dev = _stream_k_device(stream_k)
    out = pw.tensor(c, dev) if use_out else None
    got = pw.gemm(pw.tensor(sa, dev), pw.tensor(sb, dev), ta, tb, alpha, beta, out=out)
    scale = max(np.abs(ref).max(), 1.0)
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-4, atol=2e-5 * scale * max(1, math.sqrt(k) / 4))


@SETTINGS
@given(
    sizes=st.lists(st.integers(1, 3000), min_size=1, max_size=4),
    ops=st.lists(st.tuples(st.sampled_from(["adamw", "clip"]), st.floats(0.05, 5.0)), min_size=1, max_size=6),
    lr=st.floats(1e-4, 1e-1),
    wd=st.floats(0.0, 0.1),
    seed=st.integers(0, 2**31),
)
def test_adamw_clip_sequences(dev, sizes, ops, lr, wd, seed):
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    tp = [pw.tensor(p, dev) for p in params]
    tm = [pw.zeros(n, device=dev) for n in sizes]
    tv = [pw.zeros(n, device=dev) for n in sizes]
    rp = [p.astype(np.float64) for p in params]
    rm = [np.zeros(n) for n in sizes]
    rv = [np.zeros(n) for n in sizes]
    step = 0
    grads = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    tg = [pw.tensor(g, dev) for g in grads]
    rg = [g.astype(np.float64) for g in grads]
    for op, arg in ops:
        if op == "clip":
            norm = pw.clip_grad_norm_(tg, arg)
            want, rg = ref_clip([g.astype(np.float32) for g in rg], arg)
            assert norm == pytest.approx(want, rel=1e-4)
        else:
            step += 1
            for i in range(len(sizes)):
                pw.adamw_step(tp[i], tg[i], tm[i], tv[i], step, lr=lr, weight_decay=wd)
                rp[i], rm[i], rv[i] = numpy_adamw(rp[i], rg[i], rm[i], rv[i], step, lr, (0.9, 0.999), 1e-8, wd)
    for i in range(len(sizes)):
        assert_close(tg[i].numpy(), rg[i], rtol=1e-4)
        assert_close(tp[i].numpy(), rp[i], rtol=1e-4, atol_scale=1e-4)
