"""Training state that must survive bad luck and bad input: atomic checkpoints
(a real SIGINT/SIGKILL in the middle of a save), Trainer input checks (labels
out of range, float64 batches), gradient clipping of non-finite gradients as
PyTorch does it, arguments that used to be coerced silently, and tensors of a
discarded ``Device.batch()``."""

import json
import math
import os
import signal
import sys
import textwrap

import numpy as np
import pytest

import pywgtrain as pw
from pywgtrain.train import Trainer

from helpers import spawn_interruptible, rand


def make_trainer(dev, sizes=(10, 16, 3), loss=None, seed=3, **kw):
    model = pw.nn.MLP(list(sizes), activation="relu", device=dev, seed=seed)
    opt = pw.optim.AdamW(model.parameters(), lr=1e-2, max_grad_norm=1.0)
    return Trainer(model, opt, loss or pw.nn.CrossEntropyLoss(), **kw)


def snapshot(model):
    return {k: v.copy() for k, v in model.state_dict().items()}


def npz_contents(path):
    with np.load(path) as z:
        return {k: z[k].copy() for k in z.files}


# -- atomic checkpoints ---------------------------------------------------------

CHILD = textwrap.dedent("""
    import sys, time
    import numpy as np
    import numpy.lib.format as npformat
    import pywgtrain as pw
    from pywgtrain.train import Trainer

    path = sys.argv[1]
    dev = pw.Device()
    model = pw.nn.MLP([256, 1024, 1024, 10], activation="relu", device=dev, seed=0)
    trainer = Trainer(model, pw.optim.AdamW(model.parameters(), lr=1e-3), pw.nn.CrossEntropyLoss())
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((32, 256)).astype(np.float32), rng.integers(0, 10, 32)
    trainer.step(x, y).item()
    trainer.save(path)                      # the good checkpoint (step 1)
    print("GOOD", flush=True)
    for _ in range(2):
        trainer.step(x, y).item()
    # A slow disk: every array written takes 0.5 s more, so the signal lands
    # while the new checkpoint is half written.
    write_array = npformat.write_array
    def slow_write_array(*args, **kwargs):
        write_array(*args, **kwargs)
        print("WRITING", flush=True)
        time.sleep(0.5)
    npformat.write_array = slow_write_array
    trainer.save(path)
    print("SAVED", flush=True)
""")


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
@pytest.mark.parametrize("sig", ["SIGINT", "SIGKILL"])
def test_interrupted_save_keeps_previous_checkpoint(tmp_path, sig):
    """A process saving a checkpoint over a good one is interrupted mid-save by
    a real signal: the good checkpoint must still be there, whole, and load."""
    ckdir = tmp_path / "ck"
    ckdir.mkdir()
    sig = getattr(signal, sig)
    path = ckdir / "run.npz"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    proc = spawn_interruptible([sys.executable, str(script), str(path)], tmp_path)
    try:
        assert proc.stdout.readline().strip() == "GOOD", proc.stderr.read()
        good = npz_contents(path)
        assert proc.stdout.readline().strip() == "WRITING"  # inside the second save
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "SAVED" not in out, "the save finished before the signal: the test proved nothing"
    assert proc.returncode != 0
    if sig == signal.SIGINT:
        assert "KeyboardInterrupt" in err
    after = npz_contents(path)
    assert after.keys() == good.keys()
    for k in good:
        np.testing.assert_array_equal(after[k], good[k], err_msg=k)
    assert json.loads(bytes(after["meta"]).decode())["step_count"] == 1
    # It loads into a trainer, too.
    dev = pw.Device()
    model = pw.nn.MLP([256, 1024, 1024, 10], activation="relu", device=dev, seed=5)
    t = Trainer(model, pw.optim.AdamW(model.parameters(), lr=1e-3), pw.nn.CrossEntropyLoss())
    t.load(path)
    assert t.step_count == 1
    np.testing.assert_array_equal(model.state_dict()["0.weight"], good["model/0.weight"])
    leftovers = sorted(p.name for p in ckdir.iterdir() if p.name != "run.npz")
    if sig == signal.SIGINT:
        assert leftovers == []  # KeyboardInterrupt removes the temporary file
    else:
        assert all(n.startswith(".run.npz.") and n.endswith(".tmp") for n in leftovers), leftovers


def test_failed_save_keeps_previous_checkpoint_and_no_temp_file(dev, rng, tmp_path, monkeypatch):
    t = make_trainer(dev)
    x, y = rand(rng, 8, 10), rng.integers(0, 3, 8)
    t.step(x, y).item()
    path = tmp_path / "c.npz"
    t.save(path)
    good = npz_contents(path)
    t.step(x, y).item()

    def failing_savez(f, **arrays):
        f.write(b"PK\x03\x04 half a zip")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("pywgtrain.train.np.savez", failing_savez)
    with pytest.raises(OSError, match="No space left"):
        t.save(path)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.npz"]
    after = npz_contents(path)
    for k in good:
        np.testing.assert_array_equal(after[k], good[k], err_msg=k)


def test_save_replaces_atomically_with_umask_mode(dev, rng, tmp_path):
    t = make_trainer(dev)
    t.step(rand(rng, 8, 10), rng.integers(0, 3, 8)).item()
    path = tmp_path / "c.npz"
    old = os.umask(0o022)
    try:
        t.save(path)
        t.save(str(path))  # over an existing file; str and PathLike both work
    finally:
        os.umask(old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.npz"]
    if os.name == "posix":
        assert path.stat().st_mode & 0o777 == 0o644
    fresh = make_trainer(dev, seed=9)
    fresh.load(path)
    assert fresh.step_count == 1


# -- Trainer input checks ----------------------------------------------------------


@pytest.mark.parametrize("bad", [3, -1])
def test_trainer_rejects_labels_out_of_range(dev, rng, bad):
    """The loss function rejects such labels; Trainer.step used to let them
    through (loss NaN, weights still updated)."""
    t = make_trainer(dev)  # 3 classes
    x = rand(rng, 8, 10)
    y = rng.integers(0, 3, 8)
    y[5] = bad
    with pytest.raises(ValueError, match=r"target must lie in \[0, 3\)"):
        pw.nn.CrossEntropyLoss()(t.model(x), y)  # what the loss function says
    before = snapshot(t.model)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        t.step(x, y)  # first (uncaptured) step
    assert t.step_count == 0
    for k, v in snapshot(t.model).items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)
    good = rng.integers(0, 3, 8)
    for _ in range(3):  # captured and replayed steps
        assert math.isfinite(t.step(x, good).item())
    before = snapshot(t.model)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        t.step(x, y)  # replay path
    assert t.step_count == 3
    for k, v in snapshot(t.model).items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)


def test_trainer_rejects_float64_inputs_like_the_model(dev, rng):
    t = make_trainer(dev)
    x64 = rng.standard_normal((8, 10))
    y = rng.integers(0, 3, 8)
    with pytest.raises(TypeError, match="input must have dtype float32, got float64"):
        t.model(x64)  # what the model says
    with pytest.raises(TypeError, match=r"x must have dtype float32 \(or hold integer ids\), got float64"):
        t.step(x64, y)
    with pytest.raises(TypeError, match="x must be a numpy.ndarray or pywgtrain.Tensor, got list"):
        t.step(x64.tolist(), y)
    with pytest.raises(TypeError, match="labels must be integers, got dtype float64"):
        t.step(x64.astype(np.float32), y.astype(np.float64))
    mse = make_trainer(dev, sizes=(10, 16, 2), loss=pw.nn.MSELoss())
    with pytest.raises(TypeError, match=r"y must have dtype float32 \(or hold integer ids\), got float64"):
        mse.step(x64.astype(np.float32), rng.standard_normal((8, 2)))
    assert t.step_count == 0 and mse.step_count == 0
    assert math.isfinite(mse.step(x64.astype(np.float32), rand(rng, 8, 2)).item())


# -- clip_grad_norm_ with non-finite gradients, as PyTorch ---------------------------


def _clip_cases():
    cases = {}
    for name, value in [("finite", None), ("inf", np.inf), ("neg_inf", -np.inf), ("nan", np.nan)]:
        for err in (False, True):
            cases[f"{name}-error_if_nonfinite={err}"] = (value, err)
    return cases


CLIP_CASES = _clip_cases()


@pytest.mark.parametrize("case", list(CLIP_CASES))
@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_clip_grad_norm_matches_torch(dev, rng, case, max_norm):
    torch = pytest.importorskip("torch")
    value, error_if_nonfinite = CLIP_CASES[case]
    grads = [rand(rng, 7), rand(rng, 33, 5), rand(rng, 1000)]
    if value is not None:
        grads[1][3, 2] = value
    tparams = []
    for g in grads:
        p = torch.nn.Parameter(torch.zeros(g.shape))
        p.grad = torch.from_numpy(g.copy())
        tparams.append(p)
    ours = [pw.tensor(g.copy(), dev) for g in grads]
    try:
        want = float(torch.nn.utils.clip_grad_norm_(tparams, max_norm, error_if_nonfinite=error_if_nonfinite))
        want_error = None
    except RuntimeError as e:
        want_error = e
    if want_error is not None:
        with pytest.raises(RuntimeError, match="non-finite"):
            pw.clip_grad_norm_(ours, max_norm, error_if_nonfinite=error_if_nonfinite)
    else:
        got = pw.clip_grad_norm_(ours, max_norm, error_if_nonfinite=error_if_nonfinite)
        if math.isfinite(want):
            assert got == pytest.approx(want, rel=1e-5)
        else:
            assert (math.isnan(got) and math.isnan(want)) or got == want
    for t, p in zip(ours, tparams):
        # Left untouched where torch raised; scaled (to NaN/0 for non-finite norms) otherwise.
        np.testing.assert_allclose(t.numpy(), p.grad.numpy(), rtol=1e-5, atol=1e-6, equal_nan=True)


def test_clip_error_leaves_numpy_gradients_untouched(rng):
    g = rand(rng, 64)
    g[9] = np.inf
    before = g.copy()
    with pytest.raises(RuntimeError, match="non-finite"):
        pw.clip_grad_norm_([g], 1.0, error_if_nonfinite=True)
    np.testing.assert_array_equal(g, before)


# -- no silent coercions ---------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(alpha="2"), "gemm: alpha must be a real number, got str '2'"),
        (dict(beta=True), "gemm: beta must be a real number, got bool True"),
        (dict(alpha=None), "gemm: alpha must be a real number, got NoneType"),
        (dict(trans_a="no"), "gemm: trans_a must be a bool, got str 'no'"),
        (dict(trans_b=1), "gemm: trans_b must be a bool, got int 1"),
    ],
)
def test_gemm_rejects_coerced_arguments(dev, kwargs, match):
    a = np.ones((4, 4), np.float32)
    with pytest.raises(TypeError, match=match):
        pw.gemm(a, a, **kwargs)


def test_gemm_accepts_numpy_scalars(dev):
    a = np.ones((4, 4), np.float32)
    out = pw.gemm(a, a, trans_a=np.bool_(True), alpha=np.float32(0.5), beta=np.int64(0))
    np.testing.assert_array_equal(out, np.full((4, 4), 2.0, np.float32))


@pytest.mark.parametrize(
    "step,match",
    [
        (2.7, "step must be an int .*got float 2.7"),
        (2.0, "step must be an int .*got float 2.0"),
        (True, "step must be an int .*got bool True"),
        ("2", "step must be an int .*got str '2'"),
    ],
)
def test_adamw_step_rejects_non_integer_step(dev, step, match):
    t = pw.zeros(4, device=dev)
    with pytest.raises(TypeError, match=match):
        pw.adamw_step(t, t.clone(), t.clone(), t.clone(), step)


def test_adamw_step_accepts_numpy_integer_step(dev):
    p, g = np.ones(4, np.float32), np.ones(4, np.float32)
    m, v = np.zeros(4, np.float32), np.zeros(4, np.float32)
    pw.adamw_step(p, g, m, v, np.int64(1), lr=0.1, weight_decay=0.0)
    np.testing.assert_allclose(p, 0.9, rtol=1e-5)


# -- tensors of a discarded batch ------------------------------------------------------


def test_batch_token_marks_discarded_batches(dev):
    """The device side of the check: tensors created inside a batch keep
    Device._current_batch_token(); an exception discards the batch and flags
    its token; a read inside the block retires the token (its work ran).
    Outside a batch the token is the device stream's."""
    assert dev._current_batch_token() is dev._stream.token
    with dev.batch():
        ok = dev._current_batch_token()
        assert ok is not None and ok is not dev._stream.token and not ok.discarded
    assert not ok.discarded
    assert dev._current_batch_token() is dev._stream.token

    a = pw.tensor(np.ones((4, 4), np.float32), dev)
    with pytest.raises(KeyError):
        with dev.batch():
            first = dev._current_batch_token()
            c = pw.gemm(a, a)
            np.testing.assert_array_equal(c.numpy(), np.full((4, 4), 4.0, np.float32))  # submits what is recorded
            second = dev._current_batch_token()
            assert second is not first
            pw.gemm(a, a)
            raise KeyError("boom")
    assert not first.discarded  # its work was submitted before the exception
    assert second.discarded
    with pytest.raises(RuntimeError, match="discarded by KeyError: 'boom'"):
        second.check()
    first.check()
    assert dev._current_batch_token() is dev._stream.token and not dev._stream.token.discarded
    np.testing.assert_array_equal(pw.gemm(a, a).numpy(), np.full((4, 4), 4.0, np.float32))  # device still fine


def test_tensor_of_discarded_batch_raises_on_read(dev):
    a = pw.tensor(np.ones((4, 4), np.float32), dev)
    with pytest.raises(KeyError):
        with dev.batch():
            c = pw.gemm(a, a)
            raise KeyError("boom")
    with pytest.raises(RuntimeError, match="discarded"):
        c.numpy()
    np.testing.assert_array_equal(a.numpy(), np.ones((4, 4), np.float32))  # created before the batch: fine


def test_long_batch_submits_in_parts(dev):
    """A batch hands its work to the GPU every BATCH_SUBMIT_COMMANDS commands; an
    exception discards only the part not yet submitted."""
    a = pw.tensor(np.ones(4, np.float32), dev)
    n = pw.Device.BATCH_SUBMIT_COMMANDS
    with pytest.raises(KeyError):
        with dev.batch() as rec:
            early = [a + float(i) for i in range(n)]  # one command each
            assert rec.pending == 0  # submitted with the n-th
            late = a * 3.0
            assert rec.pending == 1
            raise KeyError("boom")
    np.testing.assert_array_equal(early[5].numpy(), np.full(4, 6.0, np.float32))
    with pytest.raises(RuntimeError, match="discarded"):
        late.numpy()
