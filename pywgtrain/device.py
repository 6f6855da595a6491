"""Devices and batched recording."""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import traceback
import weakref
from typing import Any, Iterator, Optional, Union

from . import _core
from ._cache import cache_dir


_ordinal_lock = threading.Lock()
_next_ordinal = 0


# Where an operation records (Device._recording()), the device's stream and
# the tokens of unsubmitted work live in the core (_core.pyx): every op pays
# them per call.
_Recording = _core._Recording
_Stream = _core._Stream
BatchToken = _core.BatchToken


class DeviceCache:
    """Python-side objects kept per device and reused across calls: grow-only
    scratch tensors by key (``ops._scratch``) and the autograd's constant 1.0
    (``autograd._one``). One per Device, created with it; entries live as long
    as the Device. Threads sharing a Device may race to fill an entry: both
    objects are equivalent and the last one written stays."""

    __slots__ = ("scratch", "one", "offset_align", "grad_lock")

    def __init__(self, offset_align: int = 256) -> None:
        self.scratch: dict[str, Any] = {}  # key -> float32 Tensor of at least the requested size
        self.one: Any = None  # float32 Tensor [1.0], uploaded on first backward of a scalar
        self.offset_align = offset_align  # bytes: where a view may start and still be bound as it is
        self.grad_lock = threading.RLock()  # held by backward(): leaf gradients accumulate atomically

    def __repr__(self):
        return f"<DeviceCache scratch={sorted(self.scratch)} one={'set' if self.one is not None else 'unset'}>"


# Mesa's Vulkan device-selection layer (VK_LAYER_MESA_device_select, an
# implicit layer installed with Mesa's drivers) asks Wayland for the default
# GPU while adapters are enumerated; libwayland prints "error: XDG_RUNTIME_DIR
# is invalid or not set in the environment." four times when the variable is
# unset (headless machines, CI, containers). Only instance and adapter set-up
# enumerate, so the variable is set just around those calls and removed again;
# an existing value is left alone. A counter keeps it set while any thread is
# inside (the last one out removes it).
_runtime_dir_lock = threading.Lock()
_runtime_dir_users = 0


@contextlib.contextmanager
def _wayland_quiet():
    global _runtime_dir_users
    with _runtime_dir_lock:
        ours = _runtime_dir_users > 0 or "XDG_RUNTIME_DIR" not in os.environ
        if ours:
            if _runtime_dir_users == 0:
                os.environ["XDG_RUNTIME_DIR"] = tempfile.gettempdir()
            _runtime_dir_users += 1
    try:
        yield
    finally:
        if ours:
            with _runtime_dir_lock:
                _runtime_dir_users -= 1
                if _runtime_dir_users == 0 and os.environ.get("XDG_RUNTIME_DIR") == tempfile.gettempdir():
                    del os.environ["XDG_RUNTIME_DIR"]


def _gemm_autotune_default(info: dict[str, Any]) -> bool:
    value = os.environ.get("PYWGTRAIN_GEMM_AUTOTUNE", "").strip()
    if value in ("0", "1"):
        return value == "1"
    if value:
        raise ValueError(f"PYWGTRAIN_GEMM_AUTOTUNE must be 0 or 1, got {value!r}")
    return info.get("adapter_type") != "cpu"


def host_memory_stats() -> dict[str, int]:
    """The process's pool of host memory for ``Tensor.numpy()`` results of
    4 MiB and more, in bytes: ``in_use_bytes`` (blocks arrays hold),
    ``cached_bytes`` (idle blocks kept, pages faulted in, for the next
    download of their size class), ``limit_bytes`` (the most kept
    idle: ``PYWGTRAIN_HOST_CACHE_MIB``, default 2048, read on first use),
    and the counts ``hits`` and ``misses`` (blocks reused, blocks mapped).
    ``Device.empty_cache()`` releases the idle ones."""
    return _core.host_pool_stats()


def list_adapters() -> list[dict[str, Any]]:
    """Every WebGPU adapter wgpu-native sees (Vulkan, Metal, DX12), as dicts."""
    with _wayland_quiet():
        return _core.list_adapters()


class Device:
    """One GPU. ``adapter`` picks it: ``None`` (then ``$PYWGTRAIN_ADAPTER``, then
    the high-performance adapter), an index into ``list_adapters()``, or a
    case-insensitive substring of the adapter name.

    Threads may share a Device: its operations are serialized in the core and
    the GIL is released while the GPU works. Each thread has its own batch.

    The first Device a process opens becomes the default (``default_device()``,
    where ``pw.tensor(x)`` and NumPy operands go) unless a default was chosen
    before: ``dev = pw.Device(); pw.tensor(x)`` puts ``x`` on ``dev``. Later
    Devices, also of the same adapter, are separate devices (tensors of two
    devices do not mix in one op).
    """

    # A batch submits what it has recorded once it holds this many commands
    # (not while capturing a step graph), so the GPU runs while Python records;
    # the stream outside batches submits chunks of 1, 2, 4, ... operations, at most this many commands.
    BATCH_SUBMIT_COMMANDS = 64

    def __init__(self, adapter: Union[int, str, None] = None) -> None:
        if adapter is not None and not isinstance(adapter, (int, str)):
            raise TypeError(f"adapter must be None, an int index or a name substring, got {type(adapter).__name__}")
        with _wayland_quiet():
            self._dev = _core._Device("" if adapter is None else str(adapter))
        self._local = threading.local()
        self._stream = _Stream(self._dev)
        self._cache = DeviceCache(self._dev.limits["min_storage_buffer_offset_alignment"])
        self._dev.configure_gemm_tuning(_gemm_autotune_default(self._dev.info), cache_dir())
        with _ordinal_lock:
            global _next_ordinal
            self.ordinal = _next_ordinal  # tells apart two Devices of one adapter in reprs
            _next_ordinal += 1
        _offer_default(self)

    # -- description -------------------------------------------------------
    @property
    def info(self) -> dict[str, Any]:
        return self._dev.info

    @property
    def name(self) -> str:
        return self._dev.info["name"]

    @property
    def backend(self) -> str:
        return self._dev.info["backend"]

    @property
    def spin_wait_us(self) -> int:
        """Microseconds a wait for the GPU (``synchronize()``, reading a
        result) polls without blocking before it sleeps: 1000 on GPUs, 0 on
        CPU adapters, ``PYWGTRAIN_SPIN_WAIT_US`` when set before the device
        opens. Spinning trades a CPU core for a wake-up tens of microseconds
        sooner after short GPU work."""
        return self._dev.spin_wait_us

    @property
    def transfer_settings(self) -> dict[str, int]:
        """How ``tensor()``, ``copy_`` and ``numpy()`` move data, read from
        the environment when the device opens: ``chunk_bytes`` per staging
        buffer (``PYWGTRAIN_TRANSFER_CHUNK_KIB``), ``slots`` staging buffers
        each way, the chunks in flight (``PYWGTRAIN_TRANSFER_SLOTS``),
        ``copy_threads`` sharing each host copy (``PYWGTRAIN_COPY_THREADS``)
        and ``queue_write_max``, the largest upload written through the
        queue instead (``PYWGTRAIN_QUEUE_WRITE_MAX_KIB``)."""
        return self._dev.transfer_settings

    @property
    def limits(self) -> dict[str, int]:
        return self._dev.limits

    @property
    def features(self) -> list[str]:
        return self._dev.features

    @property
    def lost(self) -> bool:
        return self._dev.lost

    def __repr__(self):
        return f"<pywgtrain.Device #{self.ordinal} {self.name!r} ({self.backend})>"

    # -- GEMM autotuning ---------------------------------------------------
    @property
    def gemm_autotune(self) -> bool:
        """Whether the first matrix product of each shape times a set of tile,
        split-K and stream-K plans on this GPU and keeps the fastest (once per shape:
        ~1 ms of GPU work per candidate and round for small products, ~30 runs
        of the product in all for large ones; later products of the shape,
        and later processes through the plan cache, reuse the choice). It
        times with GPU timestamps, so adapters without the ``timestamp-query``
        feature keep the heuristic. On by default on GPUs, off on CPU
        adapters; ``PYWGTRAIN_GEMM_AUTOTUNE=0`` or ``1`` sets the default. Plans persist under
        ``$PYWGTRAIN_CACHE`` (default ``~/.cache/pywgtrain``, beside the main
        job's corpus) in a file per adapter, driver and kernel version. Results
        are correct under any plan; the split-K count changes the order of
        the sums, so bits may differ from a run with another plan."""
        return self._dev.gemm_tuning_enabled

    @gemm_autotune.setter
    def gemm_autotune(self, enabled: bool) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"gemm_autotune must be a bool, got {type(enabled).__name__}")
        self._dev.configure_gemm_tuning(enabled, cache_dir())

    def gemm_plans(self) -> list[dict[str, Any]]:
        """The measured GEMM plans this device uses, one dict per shape: ``m``,
        ``n``, ``k``, ``ta``, ``tb``, ``tc`` (C stored transposed: an NT product
        run as C^T = B A^T, whose m and n are the product's N and M),
        ``tiles`` (BM, BN, BK, TM, TN, WARP_W,
        LEAN_LOOP), ``splits``, ``stream_k_workers`` (0: tiles and splits;
        else stream-K over that many workgroups) and ``us`` (the tuner's time
        for one call)."""
        return self._dev.gemm_plans()

    @property
    def gemm_plan_cache(self) -> str:
        """The file the measured plans persist in."""
        return self._dev.gemm_tuning_path

    # -- recording ---------------------------------------------------------
    @contextlib.contextmanager
    def batch(self) -> Iterator[_core._Recorder]:
        """Record every operation inside the block and submit them in few
        submissions: at its end, and whenever ``BATCH_SUBMIT_COMMANDS``
        commands are waiting (so the GPU works while the rest is recorded; not
        while a step graph is being captured). Reading a tensor inside the
        block submits what is recorded so far first. An exception inside the
        block discards the work not yet submitted and propagates; reading a
        tensor that work was to write raises."""
        outer = getattr(self._local, "recorder", None)
        if outer is not None:  # nested batches join the outer one
            yield outer
            return
        self._stream.submit()  # work recorded before the block runs before it
        rec = _core._Recorder(self._dev)
        self._local.recorder = rec
        self._local.batch_token = BatchToken()
        try:
            yield rec
            self._local.recorder = None
            rec.submit()
        except BaseException as e:
            token = self._local.batch_token
            token.reason = (
                f"this tensor was produced inside a Device.batch() block that was discarded by "
                f"{type(e).__name__}: {e}; the work that would have written it never ran"
            )
            token.discarded = True
            raise
        finally:
            self._local.recorder = None
            self._local.batch_token = None

    def _current_batch_token(self):
        """The token of the work that will write tensors created now: this
        thread's open ``batch()``, else the device's stream. Tensors keep it
        and check ``token.discarded`` on read."""
        if getattr(self._local, "recorder", None) is None:
            return self._stream.token
        return getattr(self._local, "batch_token", None)

    def _recording(self) -> Any:
        """Where one operation records (a ``_Recording`` context manager giving
        the ``_core._Recorder``): this thread's open batch, else the device's
        stream (``_Stream``)."""
        return _Recording(self)

    def _in_batch(self) -> bool:
        """Whether this thread is inside a ``batch()`` block of this device."""
        return getattr(self._local, "recorder", None) is not None

    def flush(self) -> None:
        """Submit whatever is recorded and not yet submitted: the device's
        stream, and this thread's batch."""
        self._stream.submit()
        rec = getattr(self._local, "recorder", None)
        if rec is not None and rec.capturing and getattr(self._local, "capture_read", None) is None:
            # A captured graph cannot replay a host read: capture_interrupted() names it.
            self._local.capture_read = _caller_outside_package()
        if rec is not None and rec.pending:
            self._submit_batch_part(rec)

    def _submit_batch_part(self, rec):
        rec.submit()
        # What the batch recorded so far will run whatever happens to the
        # block now; tensors created from here on belong to the rest.
        self._local.batch_token = BatchToken()

    def capture_interrupted(self, reset: bool = False) -> Optional[str]:
        """Where this thread read GPU data on the host (or otherwise flushed)
        while its batch was capturing a step graph, as ``file:line (source)``;
        None if it did not. ``reset``: forget it (before a new capture)."""
        where = getattr(self._local, "capture_read", None)
        if reset:
            self._local.capture_read = None
        return where

    def synchronize(self) -> None:
        """Wait until all submitted work has finished."""
        self.flush()
        self._dev.wait(0)

    def query(self) -> bool:
        """Whether all work recorded outside a batch has finished, without
        waiting (like ``torch.cuda.Stream.query``; it submits the stream).
        Work still being recorded in a batch has not been submitted and does
        not count."""
        self._stream.submit()
        return self._dev.query()

    def memory_stats(self, reset_peak: bool = False) -> dict[str, int]:
        """The caching allocator's figures, in bytes (``torch.cuda.memory_stats``'
        idea): ``allocated_bytes`` in use by tensors and scratch, of blocks
        rounded up to their size class, and ``peak_allocated_bytes``;
        ``cached_bytes`` (free blocks kept for reuse); ``graph_bytes`` (blocks
        no tensor uses that captured step graphs still bind: cached when the
        graph goes); ``reserved_bytes`` (the three together: what the driver
        holds for pywgtrain) and ``peak_reserved_bytes``; ``driver_allocations``
        and ``cache_hits`` count the requests the driver served and the ones
        the cache did. A lower bound of the driver's use (its own overheads and
        pywgtrain's fixed pools are left out). ``bind_group_hits`` and
        ``bind_group_misses`` count the dispatches that found their bind group
        in the device's bind-group cache and the ones that created it,
        ``bind_groups_cached`` the groups it holds (``PYWGTRAIN_BIND_GROUP_CACHE``
        at most). ``reset_peak``: start new high-water marks at the current
        values."""
        return self._dev.memory_stats(reset_peak)

    def empty_cache(self) -> int:
        """Release the cached blocks no tensor uses back to the driver (as
        ``torch.cuda.empty_cache``), the host-transfer staging buffers, and
        the idle blocks of the process's pool of host memory for ``numpy()``
        results (``host_memory_stats()``); blocks still waiting for recorded
        work to be submitted stay. Returns the device-memory bytes released.
        An allocation the driver refuses for lack of memory does this once by
        itself and retries."""
        _core.empty_host_pool()
        return self._dev.empty_cache()

    def resource_report(self) -> dict[str, int]:
        """Live wgpu objects by kind (wgpuGenerateReport): buffers, bind groups, pipelines..."""
        return self._dev.resource_report()

    def destroy(self) -> None:
        """Destroy the device now (its tensors become unusable). Tests use this
        to provoke device loss."""
        self._dev.destroy()


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _caller_outside_package() -> str:
    """The innermost frame outside pywgtrain's own top-level modules (tensor.py,
    device.py, ...): the user's code, or a module in nn/ or models/."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if os.path.dirname(os.path.abspath(frame.filename)) != _PACKAGE_DIR:
            return f"{frame.filename}:{frame.lineno} ({frame.line})"
    return "a host read inside pywgtrain"


_default: Optional[Device] = None  # chosen by default_device(); kept alive from then on
_candidate: Optional["weakref.ref[Device]"] = None  # the first Device opened while no default was chosen
_default_lock = threading.RLock()  # reentrant: default_device() opens a Device, whose __init__ offers itself


def _offer_default(dev: Device) -> None:
    """Remember ``dev`` as the default-to-be when no default is chosen and no
    earlier candidate is alive (held weakly: a Device nobody keeps is not
    kept open for this)."""
    global _candidate
    with _default_lock:
        if _default is None or _default.lost:
            earlier = _candidate() if _candidate is not None else None
            if earlier is None or earlier.lost:
                _candidate = weakref.ref(dev)


def default_device() -> Device:
    """The process-wide device used when none is given: the first ``Device``
    the process opened, if it is still alive, else one opened here on first
    use (``$PYWGTRAIN_ADAPTER`` or the high-performance adapter). Once chosen
    it stays the default (kept alive) until it is lost; then the next call
    opens a fresh one."""
    global _default, _candidate
    with _default_lock:
        if _default is None or _default.lost:
            dev = _candidate() if _candidate is not None else None
            _default = dev if dev is not None and not dev.lost else Device()
            _candidate = None  # (the Device() above offered itself)
        return _default


def resolve_device(device: Optional[Device]) -> Device:
    """``device``, or the default device when it is None; TypeError for anything else."""
    if device is None:
        return default_device()
    if not isinstance(device, Device):
        raise TypeError(f"device must be a pywgtrain.Device, got {type(device).__name__}")
    return device
