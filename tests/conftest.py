import os
import zlib

import numpy as np
import pytest

import pywgtrain as pw

# Fresh random data every run; the seed is printed so a failure can be replayed
# with PYWGTRAIN_TEST_SEED=<seed>.
SEED = int(os.environ.get("PYWGTRAIN_TEST_SEED", np.random.SeedSequence().entropy % 2**32))


def pytest_report_header(config):
    dev = pw.default_device()
    return [f"pywgtrain adapter: {dev.name} ({dev.backend}, {dev.info['driver']})", f"test seed: {SEED}"]


@pytest.fixture(scope="session")
def dev():
    return pw.default_device()


@pytest.fixture
def rng(request):
    # Distinct stream per test, reproducible from SEED.
    # zlib.crc32, not hash(): str hashes change per process.
    return np.random.default_rng([SEED, zlib.crc32(request.node.nodeid.encode())])


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def poisoned(dev, shape):
    """A device tensor full of NaN, so elements a kernel fails to write show up."""
    return pw.tensor(np.full(shape, np.nan, np.float32), dev)


def assert_close(actual, expected, rtol=1e-5, atol_scale=1e-5):
    """float32 result vs float64 reference; atol scales with the reference's magnitude."""
    actual = np.asarray(actual)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert np.all(np.isfinite(actual)), "non-finite values in the result (unwritten or poisoned elements)"
    scale = max(float(np.max(np.abs(expected))), 1e-30)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol_scale * scale)


def pytest_terminal_summary(terminalreporter):
    # Shown even with -q (the header is not): what PYWGTRAIN_TEST_SEED replays this run.
    terminalreporter.write_line(f"pywgtrain test seed: {SEED} (replay with PYWGTRAIN_TEST_SEED={SEED})")
