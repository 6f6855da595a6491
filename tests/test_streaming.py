"""Streaming submission (device.py's _Stream): operations outside a batch go
into one open recording per device, submitted every BATCH_SUBMIT_COMMANDS
commands and whenever the device is flushed; results and order are as if each
operation had been submitted on its own, also across threads, and a failed
recording makes the tensors it was to write raise instead of reading stale
memory."""

import queue

import numpy as np
import pytest

import pywgtrain as pw
from pywgtrain import _core
from helpers import run_threads, stream_schedule


def test_operations_share_submissions(dev, rng):
    dev.synchronize()
    a = rng.standard_normal((33, 7)).astype(np.float32)
    x = pw.tensor(a, dev)
    dev.synchronize()  # the upload above: the stream starts a new ramp
    before = dev._stream.submits
    y = x
    for _ in range(10):
        y = y * 1.5 + 0.25
    # 20 commands: chunks of 1, 2, 4 and 8 went (the GPU started on the first one), 5 wait.
    assert (dev._stream.submits - before, dev._stream.rec.pending) == stream_schedule(20) == (4, 5)
    ref = a.astype(np.float64)
    for _ in range(10):
        ref = ref * 1.5 + 0.25
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())  # the read submits
    assert dev._stream.submits == before + 5 and dev._stream.rec.pending == 0


def test_chunks_count_operations_not_their_commands(dev):
    """An operation of several dispatches (a split-K product) counts once in
    the stream's chunks: a submission costs the host far more than a command."""
    bufs = [pw.zeros(8, device=dev) for _ in range(20)]
    dev.synchronize()  # the stream starts a new ramp
    before = dev._stream.submits
    for i in range(10):
        with dev._recording() as rec:  # one operation, two commands
            _core.fill(rec, bufs[2 * i]._buf, 8, float(i))
            _core.fill(rec, bufs[2 * i + 1]._buf, 8, float(-i))
    # Chunks of 1, 2 and 4 operations went, 3 operations (6 commands) wait.
    assert stream_schedule(10) == (3, 3)
    assert (dev._stream.submits - before, dev._stream.rec.pending) == (3, 6)
    for i in range(10):
        np.testing.assert_array_equal(bufs[2 * i].numpy(), np.full(8, i, np.float32))
        np.testing.assert_array_equal(bufs[2 * i + 1].numpy(), np.full(8, -i, np.float32))


def test_long_streams_submit_in_parts(dev):
    dev.synchronize()
    x = pw.zeros(5, device=dev)
    before = dev._stream.submits
    n = 2 * pw.Device.BATCH_SUBMIT_COMMANDS + 5
    for _ in range(n):
        x.add_(1.0)
    # The GPU started on the first parts while Python recorded the rest.
    assert dev._stream.submits - before >= 2
    assert dev._stream.rec.pending < pw.Device.BATCH_SUBMIT_COMMANDS
    np.testing.assert_array_equal(x.numpy(), np.full(5, n, np.float32))


def test_query_and_synchronize_submit_the_stream(dev):
    x = pw.zeros(1000, device=dev)
    x.add_(2.0)
    dev.synchronize()
    assert dev._stream.rec.pending == 0
    x.add_(1.0)
    dev.query()
    assert dev._stream.rec.pending == 0
    np.testing.assert_array_equal(x.numpy(), np.full(1000, 3.0, np.float32))


def test_a_tensor_handed_to_another_thread_reads_right(dev, rng):
    """Thread A records without reading; thread B reads what A made."""
    a = rng.standard_normal((64, 9)).astype(np.float32)
    handoff, out = queue.Queue(), {}

    def producer():
        x = pw.tensor(a, dev)
        handoff.put((x * 2.0).exp())

    def consumer():
        out["y"] = handoff.get(timeout=30).numpy()

    run_threads([producer, consumer], timeout=60)
    np.testing.assert_allclose(out["y"], np.exp(2.0 * a.astype(np.float64)), rtol=1e-5)


def test_stream_work_runs_before_a_batch_and_a_host_write(dev, rng):
    a = rng.standard_normal(300).astype(np.float32)
    b = rng.standard_normal(300).astype(np.float32)
    x = pw.tensor(a, dev)
    y = x * 2.0  # recorded in the stream, not submitted
    with dev.batch():
        z = y + 1.0
    x.copy_(b)  # a host write into x: y's read of x must have been submitted first
    w = x - 1.0
    np.testing.assert_array_equal(y.numpy(), a * 2.0)
    np.testing.assert_array_equal(z.numpy(), a * 2.0 + 1.0)
    np.testing.assert_array_equal(w.numpy(), b - 1.0)


def test_a_failed_recording_makes_its_stream_tensors_raise(dev, rng):
    dev.synchronize()
    a = rng.standard_normal(50).astype(np.float32)
    x = pw.tensor(a, dev)  # an upload: its contents do not depend on the stream
    buf = pw.zeros(16, device=dev)
    dev.synchronize()  # the stream starts a new ramp of chunks
    w = x * 2.0  # the first chunk: submitted at once
    y = x * 3.0  # recorded, not submitted (the next chunk is 2 commands)
    assert dev._stream.rec.pending == 1
    with pytest.raises(pw.ValidationError):
        with dev._recording() as rec:
            _core._inject_invalid_binding(rec, buf._buf)
    with pytest.raises(RuntimeError, match="never ran: a later operation failed to record"):
        y.numpy()
    np.testing.assert_array_equal(w.numpy(), a * 2.0)  # submitted work is not lost
    np.testing.assert_array_equal(x.numpy(), a)
    np.testing.assert_array_equal((x * 3.0).numpy(), a * 3.0)  # the device goes on


def test_a_python_error_between_operations_loses_nothing(dev, rng):
    a = rng.standard_normal(40).astype(np.float32)
    x = pw.tensor(a, dev)
    y = x + 1.0
    with pytest.raises(ValueError):
        x.reshape(7, 3)  # refused before anything is recorded
    np.testing.assert_array_equal(y.numpy(), a + 1.0)


@pytest.mark.parametrize("in_batch", [False, True])
def test_reading_a_strided_view_reads_its_values(dev, rng, in_batch):
    """A strided view is read through a contiguous copy that the read itself
    records: the read must submit it before downloading (inside a batch this
    once returned memory nothing had written)."""
    a = rng.standard_normal((3, 5, 4)).astype(np.float32)
    x = pw.tensor(a, dev)
    if in_batch:
        with dev.batch():
            got = [x.transpose(0, 2).numpy(), x[:, 1:4, ::1].permute(2, 0, 1).numpy(), x[1, :, 2].numpy()]
    else:
        got = [x.transpose(0, 2).numpy(), x[:, 1:4, ::1].permute(2, 0, 1).numpy(), x[1, :, 2].numpy()]
    np.testing.assert_array_equal(got[0], a.transpose(2, 1, 0))
    np.testing.assert_array_equal(got[1], a[:, 1:4].transpose(2, 0, 1))
    np.testing.assert_array_equal(got[2], a[1, :, 2])
