import os
import zlib

import numpy as np
import pytest

# Memory the caching allocator hands out again is filled with 0xFF (NaN) first,
# so no kernel or op may count on reused memory being zero (read once, when a
# device opens).
os.environ.setdefault("PYWGTRAIN_POISON_CACHED", "1")

import pywgtrain as pw  # noqa: E402

# Fixtures and hooks only; the helpers tests import are in tests/helpers.py.

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


def pytest_terminal_summary(terminalreporter):
    # Shown even with -q (the header is not): what PYWGTRAIN_TEST_SEED replays this run.
    terminalreporter.write_line(f"pywgtrain test seed: {SEED} (replay with PYWGTRAIN_TEST_SEED={SEED})")
