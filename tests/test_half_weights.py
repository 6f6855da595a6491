"""optim.wgsl's _half AdamW entries: the update and each new parameter's float16 copy in one
dispatch, the copy equal to a cast of the new parameter bit for bit."""

import numpy as np
import pytest

import pywgtrain as pw
from helpers import rand
from pywgtrain import _core
from test_optim import numpy_adamw

F16 = np.dtype(np.float16)


def bits(a):
    return np.asarray(a, F16).view(np.uint16)


@pytest.mark.parametrize("n", [1, 7, 33, 129, 1000, 4097])
@pytest.mark.parametrize("clipped", [False, True])
@pytest.mark.parametrize("capturable", [False, True])
def test_adamw_half_kernel_matches_numpy(dev, rng, n, clipped, capturable):
    """The _half entries against float64 AdamW, the copy equal to the new float32 parameters
    rounded to float16 bit for bit (poisoned first; an odd count's last word keeps its high half)."""
    p = rand(rng, n)
    tp, tm, tv = pw.tensor(p, dev), pw.zeros(n, device=dev), pw.zeros(n, device=dev)
    rp, rm, rv = p.astype(np.float64), np.zeros(n), np.zeros(n)
    words = (n + 1) // 2 + 1  # a word past the copy, poisoned: it must stay as it was
    half = pw.tensor(np.full(2 * words, np.nan, F16), dev)
    steps = pw.zeros((1, _core.ADAM_SLOT_WORDS), dtype=np.int32, device=dev)
    lrs, no_inf = pw.tensor(np.array([3e-2], np.float32), dev), pw.zeros((1,), device=dev)
    clip = pw.tensor(np.array([2.0, 0.5], np.float32), dev) if clipped else None
    for step in range(1, 5):
        g = rand(rng, n)
        with dev.batch() as rec:
            cb = None if clip is None else clip._buf
            if capturable:
                _core.adamw_prepare(rec, steps._buf, 0, 1, no_inf._buf, 0.8, 0.99, 1e-6, 0.1, lrs._buf, 0)
                _core.adamw_device(
                    rec, tp._buf, pw.tensor(g, dev)._buf, tm._buf, tv._buf, n, 0.8, 0.99, 1e-6, 0.1,
                    steps._buf, 0, no_inf._buf, cb, half._buf,
                )  # fmt: skip
            else:
                _core.adamw(
                    rec, tp._buf, pw.tensor(g, dev)._buf, tm._buf, tv._buf, n, 3e-2, 0.8, 0.99, 1e-6, 0.1, step,
                    cb, half._buf,
                )  # fmt: skip
        rp, rm, rv = numpy_adamw(rp, g * (0.5 if clipped else 1.0), rm, rv, step, 3e-2, (0.8, 0.99), 1e-6, 0.1)
        got = tp.numpy()
        np.testing.assert_allclose(got, rp, rtol=1e-5, atol=1e-6 * max(1.0, float(np.abs(p).max())))
        copy = half.numpy()
        np.testing.assert_array_equal(bits(copy[:n]), bits(got.astype(F16)))
        assert np.isnan(copy[n:]).all()  # an odd count's neighbour and the word past it: untouched


def test_adamw_half_refuses_a_short_copy(dev):
    p, g, m, v = (pw.zeros(8, device=dev) for _ in range(4))
    half = pw.zeros(4, dtype=np.float16, device=dev)
    with pytest.raises(ValueError, match="float16 copy"):
        with dev.batch() as rec:
            _core.adamw(rec, p._buf, g._buf, m._buf, v._buf, 8, 1e-3, 0.9, 0.999, 1e-8, 0.0, 1, None, half._buf)
