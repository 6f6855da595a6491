"""State pywgtrain keeps outside tensors: the process environment (importing
the package or opening a device leaves it as it was) and the per-device
Python caches (declared on the Device, not stuffed into its __dict__)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import pywgtrain as pw
from pywgtrain.device import DeviceCache

from helpers import assert_close, poisoned, rand

PROBE = """
import json, os, sys
import numpy as np
import pytest
before = dict(os.environ)
import pywgtrain as pw
after_import = dict(os.environ)
pw.list_adapters()
dev = pw.Device()
(pw.tensor(np.ones(4, np.float32), dev) * 2.0).numpy()
print(json.dumps({"import": after_import == before, "device": dict(os.environ) == before,
                  "xdg": os.environ.get("XDG_RUNTIME_DIR")}))
"""


def _probe(env, cwd):
    # cwd outside the checkout: `-c` puts it first on sys.path, and the source tree has no extension.
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_import_and_device_leave_the_environment_unchanged(tmp_path):
    """With XDG_RUNTIME_DIR unset (headless machines, CI) neither the import
    nor opening a device changes os.environ, and Mesa's device-selection
    layer still says nothing about the variable on stderr."""
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    result, err = _probe(env, tmp_path)
    assert result == {"import": True, "device": True, "xdg": None}, result
    assert "XDG_RUNTIME_DIR" not in err, err


def test_a_set_runtime_dir_is_left_alone(tmp_path):
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path))
    result, _ = _probe(env, tmp_path)
    assert result == {"import": True, "device": True, "xdg": str(tmp_path)}, result


def test_device_caches_are_declared_per_device():
    """Scratch tensors (clip_grad_norm_) and the autograd's seed 1.0 live in
    Device._cache, one per device."""
    a, b = pw.Device(), pw.Device()
    assert isinstance(a._cache, DeviceCache) and a._cache is not b._cache
    assert a._cache.scratch == {} and a._cache.one is None
    p = pw.tensor(np.ones(4, np.float32), a, requires_grad=True)
    (p * p).sum().backward()
    one = a._cache.one
    assert one is not None and one.device is a and one.numpy().tolist() == [1.0]
    (p * 2.0).sum().backward()
    assert a._cache.one is one  # uploaded once, reused
    pw.clip_grad_norm_([p], 1.0)
    assert a._cache.scratch and all(t.device is a for t in a._cache.scratch.values())
    assert b._cache.scratch == {} and b._cache.one is None
    assert not {"_scratch", "_autograd_one"} & set(vars(a))


# --- waits: spin first, then block (PYWGTRAIN_SPIN_WAIT_US) ---


def test_cpu_adapters_do_not_spin(monkeypatch):
    """A spinning wait would take a core from the CPU adapter's own workers."""
    monkeypatch.delenv("PYWGTRAIN_SPIN_WAIT_US", raising=False)
    fresh = pw.Device()
    if fresh.info["adapter_type"] != "cpu":
        pytest.skip(f"adapter type {fresh.info['adapter_type']!r}: GPUs spin by default")
    assert fresh.spin_wait_us == 0


@pytest.mark.parametrize("spin_us", ["1", "5000000"])
def test_spinning_waits_return_finished_results(monkeypatch, rng, spin_us):
    """A budget shorter than the work falls back to the blocking wait; a long
    one returns from the spin. Either way synchronize() and reads see every
    result (each product depends on the one before, so a wait that returned
    early would read a stale or partial chain)."""
    monkeypatch.setenv("PYWGTRAIN_SPIN_WAIT_US", spin_us)
    spin_dev = pw.Device()
    assert spin_dev.spin_wait_us == int(spin_us)
    a = (rng.standard_normal((129, 129)) / 12).astype(np.float32)
    x = rng.standard_normal((129, 33)).astype(np.float32)
    ta, tx = pw.tensor(a, spin_dev), pw.tensor(x, spin_dev)
    ref = x.astype(np.float64)
    for _ in range(6):
        tx = pw.gemm(ta, tx)
        ref = a.astype(np.float64) @ ref
        spin_dev.synchronize()
    np.testing.assert_allclose(tx.numpy(), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("spin_us", ["0", "1", "5000000"])
def test_synchronize_returns_only_when_the_gpu_is_done(monkeypatch, spin_us):
    """query() after synchronize() must say the queue is done: the spin once
    trusted wgpuDevicePoll's "queue empty" answer, which on the H100 read true
    while 24 ms of submitted GEMMs still ran (reads were right, they wait on
    their own map; wall-clock timings and synchronize() were not)."""
    monkeypatch.setenv("PYWGTRAIN_SPIN_WAIT_US", spin_us)
    spin_dev = pw.Device()
    spin_dev.gemm_autotune = False
    a = pw.zeros((384, 384), device=spin_dev)
    c = pw.zeros((384, 384), device=spin_dev)
    for _ in range(3):
        with spin_dev.batch():
            for _ in range(4):
                pw.gemm(a, a, out=c)
        spin_dev.synchronize()
        assert spin_dev.query()


@pytest.mark.parametrize("value", ["-1", "abc", "1e3", "10000001", " 5"])
def test_bad_spin_setting_names_the_variable(monkeypatch, value):
    monkeypatch.setenv("PYWGTRAIN_SPIN_WAIT_US", value)
    with pytest.raises(ValueError, match=r"PYWGTRAIN_SPIN_WAIT_US must be an integer from 0 to 10000000"):
        pw.Device()


def test_uniform_blocks_are_written_whenever_they_change(rng):
    """A submission whose uniform blocks equal what its (pooled) uniform
    memory last held skips the write (Recorder::submit). Calls that reuse
    that memory with other parameters (alpha, beta, shapes, fewer or more
    blocks) must still see theirs: each result against float64."""
    dev = pw.Device()
    x = rand(rng, 7, 33)
    w = rand(rng, 129, 33)
    tx, tw = pw.tensor(x, dev), pw.tensor(w, dev)
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    for alpha in (1.0, 1.0, 2.0, 2.0, -0.5, 1.0, 3.0, 3.0):
        out = poisoned(dev, (7, 129))
        pw.gemm(tx, tw, trans_b=True, alpha=alpha, out=out)
        assert_close(out.numpy(), alpha * ref)
    # Batches of several blocks, then a prefix of them, then other shapes.
    for calls in ((1.0, 2.0, 3.0), (1.0, 2.0), (1.0, 2.0, 3.0), (4.0,), (1.0, 2.0, 5.0)):
        outs = [poisoned(dev, (7, 129)) for _ in calls]
        with dev.batch():
            for alpha, out in zip(calls, outs):
                pw.gemm(tx, tw, trans_b=True, alpha=alpha, out=out)
        for alpha, out in zip(calls, outs):
            assert_close(out.numpy(), alpha * ref)
        y = rand(rng, 33, 5)
        assert_close(pw.gemm(tx, pw.tensor(y, dev)).numpy(), x.astype(np.float64) @ y)
