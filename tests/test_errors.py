"""Every bad input and every GPU fault becomes a Python exception with a
message naming what was wrong; the process never aborts."""

import subprocess
import sys

import numpy as np
import pytest

import pywgtrain as pw
from pywgtrain import _core


@pytest.mark.parametrize(
    "a,match,exc",
    [
        (np.zeros((3, 4), np.float64), "a must have dtype float32, got float64", TypeError),
        (np.zeros((3, 4), np.int32), "a must have dtype float32, got int32", TypeError),
        (np.asfortranarray(np.ones((3, 4), np.float32)), "a must be C-contiguous", ValueError),
        (np.ones((4, 8), np.float32)[:, ::2], "a must be C-contiguous", ValueError),
        (np.array(1.0, np.float32), "at least one dimension", ValueError),
        (np.zeros((0, 4), np.float32), "a is empty", ValueError),
        (np.ones(4, np.float32), r"a must be 2-D, got shape \(4,\)", ValueError),
        ([[1.0, 2.0]], "a must be a numpy.ndarray or pywgtrain.Tensor, got list", TypeError),
    ],
)
def test_gemm_bad_a(dev, a, match, exc):
    with pytest.raises(exc, match=match):
        pw.gemm(a, np.ones((4, 2), np.float32))


def test_gemm_shape_mismatch(dev):
    with pytest.raises(ValueError, match=r"inner dimensions differ: op\(a\) is 3x4, op\(b\) is 5x2"):
        pw.gemm(np.ones((3, 4), np.float32), np.ones((5, 2), np.float32))
    with pytest.raises(ValueError, match=r"out has shape \(3, 3\), expected \(3, 2\)"):
        pw.gemm(np.ones((3, 4), np.float32), np.ones((4, 2), np.float32), out=pw.zeros((3, 3), device=dev))


def test_gemm_beta_needs_out_and_no_alias(dev):
    a = pw.tensor(np.ones((4, 4), np.float32), dev)
    with pytest.raises(ValueError, match="beta != 0 accumulates into out"):
        pw.gemm(a, a, beta=1.0)
    with pytest.raises(ValueError, match="out must not alias a or b"):
        pw.gemm(a, pw.tensor(np.ones((4, 4), np.float32), dev), out=a)
    arr = np.ones((4, 4), np.float32)
    with pytest.raises(ValueError, match="out must not alias a or b"):
        pw.gemm(arr, np.ones((4, 4), np.float32), out=arr)
    with pytest.raises(ValueError, match="alpha and beta must be finite"):
        pw.gemm(arr, arr, alpha=float("nan"))


def test_tensor_creation_errors(dev):
    with pytest.raises(TypeError, match="dtype must be float32, float16 or int32, got float64"):
        pw.empty((2, 2), np.float64, dev)
    with pytest.raises(ValueError, match="all dimensions >= 1"):
        pw.zeros((2, 0), device=dev)
    with pytest.raises(TypeError, match="data must have dtype float32, float16 or int32, got complex64"):
        pw.tensor(np.zeros(3, np.complex64), dev)
    with pytest.raises(ValueError, match=r"cannot reshape a tensor of shape \(2, 3\) \(6 elements\) into \(4, 2\)"):
        pw.zeros((2, 3), device=dev).reshape(4, 2)
    for bad in ((-2, -3), (2, 0), (-1, -1)):
        with pytest.raises(ValueError, match="reshape"):
            pw.zeros((2, 3), device=dev).reshape(*bad)


def test_tensors_of_another_device_are_rejected(dev):
    other = pw.Device()
    with pytest.raises(ValueError, match="lives on"):
        pw.gemm(pw.zeros((2, 2), device=dev), pw.zeros((2, 2), device=other))


def test_adapter_selection_errors():
    with pytest.raises(ValueError, match="no adapter name contains 'no-such-gpu'"):
        pw.Device("no-such-gpu")
    with pytest.raises(ValueError, match="adapter index 99 out of range"):
        pw.Device(99)
    with pytest.raises(TypeError, match="adapter must be None"):
        pw.Device(1.5)


def test_out_of_memory_beyond_max_buffer_size(dev):
    too_big = dev.limits["max_buffer_size"] + 4
    with pytest.raises(pw.OutOfMemoryError, match=f"allocating {too_big} bytes: exceeds the device's max_buffer_size"):
        _core._Buffer(dev._dev, too_big)
    # The device is still usable afterwards.
    assert pw.gemm(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32))[0, 0] == 2.0


def test_validation_error_surfaces_as_exception(dev):
    """A binding past the end of a buffer is a wgpu validation error; it must
    arrive as pywgtrain.ValidationError naming the kernel, not abort."""
    buf = pw.zeros(16, device=dev)
    rec = _core._Recorder(dev._dev)
    pw.gemm(pw.zeros((2, 2), device=dev), pw.zeros((2, 2), device=dev))
    with pytest.raises(pw.ValidationError, match="recording reduce:partial_sum.*(Validation|bind)"):
        _core._inject_invalid_binding(rec, buf._buf)
    assert rec.pending == 0  # the broken recording was discarded, never submitted
    assert rec.submit() == 0
    assert pw.gemm(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32))[0, 0] == 2.0


def test_bad_copy_is_rejected_before_submit(dev):
    """wgpu-native validates copies at submit, where errors abort; ours are checked first."""
    a, b = pw.zeros(16, device=dev), pw.zeros(8, device=dev)
    rec = _core._Recorder(dev._dev)
    with pytest.raises(pw.ValidationError, match="copy of 64 bytes at offset 0 overruns a buffer of 32 bytes"):
        rec.copy(a._buf, 0, b._buf, 0, 64)
    with pytest.raises(pw.ValidationError, match="multiples of 4"):
        rec.copy(a._buf, 2, b._buf, 0, 4)


def test_device_loss_raises_and_new_device_works():
    d = pw.Device()
    x = pw.tensor(np.ones((64, 64), np.float32), d)
    with d.batch():
        for _ in range(4):
            pw.gemm(x, x)
    d.destroy()
    assert d.lost
    with pytest.raises(pw.DeviceLostError, match="create a new pywgtrain.Device"):
        x.numpy()
    with pytest.raises(pw.DeviceLostError):
        pw.gemm(x, x)
    fresh = pw.Device()
    y = pw.tensor(np.ones((3, 3), np.float32), fresh)
    np.testing.assert_array_equal(pw.gemm(y, y).numpy(), np.full((3, 3), 3.0, np.float32))


def test_no_abort_in_subprocess(tmp_path):
    """Faults in a separate process end with exceptions and a clean exit code."""
    code = (
        "import numpy as np, pywgtrain as pw\n"
        "d = pw.Device(); t = pw.zeros((4,), device=d); d.destroy()\n"
        "try:\n    t.numpy()\nexcept pw.DeviceLostError as e:\n    print('caught', type(e).__name__)\n"
    )
    # cwd outside the checkout: `python -c` puts the cwd first on sys.path.
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "caught DeviceLostError" in r.stdout


def test_training_interrupted_by_device_loss_resumes_from_checkpoint(rng, tmp_path):
    """Train, checkpoint, lose the device mid-run: the failing step raises,
    and a new device resumed from the checkpoint continues exactly as an
    uninterrupted run would."""
    from pywgtrain.train import Trainer

    xs = [rng.standard_normal((16, 10)).astype(np.float32) for _ in range(4)]
    ys = [rng.integers(0, 3, 16) for _ in range(4)]

    def make(device):
        model = pw.nn.MLP([10, 16, 3], activation="relu", device=device, seed=11)
        return Trainer(model, pw.optim.AdamW(model.parameters(), lr=5e-3, max_grad_norm=1.0), pw.nn.CrossEntropyLoss())

    reference = make(pw.Device())
    for i in range(4):
        want = reference.step(xs[i], ys[i]).item()

    d = pw.Device()
    run = make(d)
    for i in range(2):
        run.step(xs[i], ys[i])
    ckpt = tmp_path / "run.npz"
    run.save(ckpt)
    d.destroy()  # the fault
    with pytest.raises(pw.DeviceLostError):
        run.step(xs[2], ys[2]).item()

    resumed = make(pw.Device())
    resumed.load(ckpt)
    for i in range(2, 4):
        got = resumed.step(xs[i], ys[i]).item()
    assert got == want
    for (name, p), (_, q) in zip(reference.model.named_parameters(), resumed.model.named_parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=name)


def test_sizes_beyond_32_bit_indices_are_rejected(dev):
    """Kernels index with 32-bit integers inside each bound range; larger
    dimensions are refused up front, larger totals by the buffer limit."""
    with pytest.raises(ValueError, match="dimension above 2147483647"):
        pw.empty((2**31, 1), device=dev)
    with pytest.raises(pw.OutOfMemoryError, match="exceeds the device's max_buffer_size"):
        pw.empty((100_000, 100_000), device=dev)  # 4e10 bytes: beyond 2^32 elements' worth


def test_core_wrappers_refuse_none_for_buffers(dev):
    """The Cython wrappers dereference their buffers: None is refused with a
    TypeError instead of crashing the process (optional ones, such as a
    pre-activation output, still take None)."""
    from pywgtrain import _core

    a = pw.zeros((2, 2), device=dev)
    rec = _core._Recorder(dev._dev)
    with pytest.raises(TypeError):
        _core.gemm(rec, None, a._buf, a._buf, 2, 2, 2, False, False, 1.0, 0.0)
    with pytest.raises(TypeError):
        _core.gemm(None, a._buf, a._buf, a._buf, 2, 2, 2, False, False, 1.0, 0.0)
    with pytest.raises(TypeError):
        _core.unary(rec, 0, a._buf, None, 4, 0.0, 0.0, 0.0)
    with pytest.raises(TypeError):
        _core._Buffer(None, 16)
    with pytest.raises(TypeError):
        rec.replay(None)
    b = pw.zeros((2, 2), device=dev)
    _core.gemm_bias_act(rec, a._buf, a._buf, pw.zeros(2, device=dev)._buf, b._buf, None, 2, 2, 2, False, True, 0)
    rec.submit()
