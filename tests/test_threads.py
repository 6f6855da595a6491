"""One device shared by several Python threads (see docs/reliability.md)."""

import numpy as np

import pywgtrain as pw
from helpers import assert_close, run_threads


def test_eight_threads_issue_gemms_concurrently(dev):
    errors, results = [], {}

    def worker(i):
        try:
            r = np.random.default_rng(i)
            for j in range(5):
                m, k, n = 40 + i, 30 + j, 20 + i + j
                a = r.standard_normal((m, k)).astype(np.float32)
                b = r.standard_normal((k, n)).astype(np.float32)
                with dev.batch():
                    c = pw.gemm(pw.tensor(a, dev), pw.tensor(b, dev))
                    c2 = pw.gemm(c, pw.tensor(np.ascontiguousarray(b.T), dev))
                results[(i, j)] = (c.numpy(), c2.numpy(), a, b)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    run_threads([lambda i=i: worker(i) for i in range(8)])
    assert not errors, errors
    assert len(results) == 40
    for c, c2, a, b in results.values():
        ref = a.astype(np.float64) @ b
        assert_close(c, ref)
        assert_close(c2, ref @ b.T, atol_scale=3e-5)
