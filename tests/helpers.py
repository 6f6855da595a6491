"""Helpers shared by the tests (fixtures and hooks are in conftest.py)."""

import signal
import subprocess

import threading

import numpy as np

import pywgtrain as pw


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def poisoned(dev, shape):
    """A device tensor full of NaN, so elements a kernel fails to write show up."""
    return pw.tensor(np.full(shape, np.nan, np.float32), dev)


def switched_device(monkeypatch, **switches):
    """A new Device opened with the environment variables `switches` set
    (None removes one) on top of those set before: the GEMM's experiment
    switches (PYWGTRAIN_GEMM_*, PYWGTRAIN_GEMV_*) are read when a Device opens."""
    for name, value in switches.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    return pw.Device()


def stream_schedule(ops, cap=None):
    """(submissions, operations left pending) of ``ops`` operations streamed right after a
    flush: the stream submits chunks of 1, 2, 4, ... operations, at most ``cap``
    (``Device.BATCH_SUBMIT_COMMANDS``)."""
    cap = pw.Device.BATCH_SUBMIT_COMMANDS if cap is None else cap
    submits, chunk = 0, 1
    while ops >= chunk:
        ops -= chunk
        submits += 1
        chunk = min(2 * chunk, cap)
    return submits, ops


def t64(a, grad=False):
    """A float64 torch tensor of `a` (the reference side of a comparison with torch)."""
    import torch

    return torch.tensor(np.asarray(a, np.float64), requires_grad=grad)


def same_as_torch(ours, ref, rtol=2e-5, atol=1e-6):
    """A float32 result against torch's float64 one: NaN where torch has NaN, inf where it has inf."""
    import torch

    ref = ref.detach().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
    ours = np.asarray(ours)
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(ref))
    np.testing.assert_allclose(ours, ref, rtol=rtol, atol=atol, equal_nan=True)


def assert_close(actual, expected, rtol=1e-5, atol_scale=1e-5, magnitude=None):
    """float32 result vs float64 reference; atol scales with the reference's
    magnitude, or with `magnitude` where terms of that size may cancel in it."""
    actual = np.asarray(actual)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert np.all(np.isfinite(actual)), "non-finite values in the result (unwritten or poisoned elements)"
    scale = max(float(np.max(np.abs(expected))) if magnitude is None else magnitude, 1e-30)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol_scale * scale)


def bias_residual(dev, a, b, bias, res, out, trans_b=True):
    """_core.gemm_bias_residual: out = a @ op(b) + bias + res (op(b) = b.T when trans_b) for NumPy
    arrays or device tensors, into the device tensor out; returns out as NumPy."""
    from pywgtrain import _core

    def buf(x):
        return (x if isinstance(x, pw.Tensor) else pw.tensor(x, dev))._buf

    m, k = a.shape
    n = b.shape[0] if trans_b else b.shape[1]
    with dev.batch() as rec:
        _core.gemm_bias_residual(rec, buf(a), buf(b), buf(bias), buf(res), out._buf, m, n, k, False, trans_b)
    return out.numpy()


def spawn_interruptible(args, cwd):
    """A child process with text pipes whose SIGINT reaches Python's handler,
    even when the tests run from a shell job that ignores SIGINT."""
    return subprocess.Popen(
        args,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def eager_step(dev, model, opt, loss_fn, x, y):
    """One step of the README's plain loop in a batch; the loss (not read)."""
    with dev.batch():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    return loss


def backward_and_step(loss, opt, scaler=None):
    """loss.backward() and opt.step(), through the GradScaler when one is given (scale, step, update)."""
    if scaler is None:
        loss.backward()
        opt.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()


def run_threads(calls, timeout=None):
    """Run each callable on a thread of its own, all at once, and join them all."""
    threads = [threading.Thread(target=call) for call in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
