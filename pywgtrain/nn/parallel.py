"""Data-parallel training over ``torch.distributed`` (``torch.nn.parallel``'s shape).

One process per GPU (per :class:`pywgtrain.Device`), each training the same model
on its own shard of the global batch; ``DistributedDataParallel`` keeps the
replicas equal: it broadcasts rank 0's parameters when it wraps the model, and
after every backward pass it averages the gradients across the processes, so
each optimizer step sees the gradient of the global batch. The collectives run
on the host through any ``torch.distributed`` backend that takes CPU tensors
(gloo): gradients are downloaded, reduced and uploaded back, in buckets. torch
is imported only when a ``DistributedDataParallel`` is created.

::

    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=5))
    dev = pw.Device(local_rank)                 # torchrun's LOCAL_RANK: this process's GPU
    pw.manual_seed(seed + dist.get_rank())      # dropout: every rank its own masks
    model = DistributedDataParallel(build_model(dev))
    opt = pw.optim.AdamW(model.parameters(), lr=1e-3)
    for x, y in shard_of_each_batch:
        opt.zero_grad()
        loss_fn(model(x), y).backward()         # gradients averaged when backward() returns
        opt.step()
"""

from __future__ import annotations

import contextlib
import time
import weakref
import zlib
from typing import Any, Iterator, Optional, Sequence

import numpy as np

from .. import autograd
from ..tensor import Tensor
from ._host_reduce import HostReducer
from .modules.module import Module

__all__ = ["DistributedDataParallel", "register_flat_gradients"]

# Flat gradient buffers (a fused optimizer's arena) register here; the optimizers sit above nn,
# so they come to DistributedDataParallel, not it to them.
_flat_gradients: "weakref.WeakSet[Any]" = weakref.WeakSet()


def register_flat_gradients(flat: Any) -> None:
    """Let DistributedDataParallel reduce a run of gradients that live in one device buffer as
    one span of it. ``flat`` (held weakly) has ``params`` (in buffer order), ``offsets`` (each
    one's first element in the buffer), ``size`` (the buffer's elements), ``holds_grad(i)``
    (whether parameter i's ``.grad`` is its place in the buffer) and ``span("grad", first,
    last)`` (a flat tensor over parameters first..last-1 and the gaps after them)."""
    _flat_gradients.add(flat)


class DistributedDataParallel(Module):
    """``torch.nn.parallel.DistributedDataParallel`` for pywgtrain modules, over an
    initialized ``torch.distributed`` process group with a CPU backend (gloo).

    - At construction every rank checks that the others wrap a model with the same
      parameter shapes, and rank 0's parameter values are broadcast to all
      (``init_sync``), so every replica starts equal.
    - ``forward`` calls the wrapped module; ``module`` is the wrapped module;
      ``parameters()``, ``state_dict()`` (keys ``module.<name>``, as torch's) and
      ``train()``/``eval()`` reach it as a submodule.
    - Gradient averaging: when a backward pass (``loss.backward()``) that wrote
      gradients of this model's parameters returns, every parameter's ``.grad`` holds
      the mean over the ranks (a sum ``all_reduce``, divided by the world size). It runs
      from a post-backward hook (``pywgtrain.autograd.register_post_backward_hook``);
      inside a ``pywgtrain.graph`` capture it runs right after the captured block and
      after every ``Graph.replay``, so ``Trainer`` steps average too.
    - Buckets: gradients that live in a fused AdamW's flat arena (``register_flat_gradients``)
      are reduced as spans of it, a run of neighbouring parameters per bucket (one download and
      one upload each); other gradients are concatenated on the host. A bucket holds up to ``bucket_cap_mb`` MiB (a larger
      parameter is a bucket of its own). Each bucket is downloaded and its ``all_reduce`` started
      (asynchronously) on a transfer thread, in the same order on every rank; a finishing thread
      waits for it, averages and uploads, so several buckets are in flight at once.
    - Overlap (``overlap=True``, from the second backward pass on, outside graph captures): a
      bucket starts as soon as the backward pass has recorded the last gradient of its parameters
      (``pywgtrain.autograd.register_gradient_ready_hook``; the recorded work is submitted first),
      while the rest of backward is recorded and runs. ``backward()`` returns once every bucket is
      averaged and uploaded; the first pass (which finds the buckets), passes whose gradients
      moved, and captured or replayed passes start them all when backward returns.
    - ``host_reduction="shm"`` (the default): the ranks of one host (torchrun's node; one hostname)
      average through shared memory (``/dev/shm``): each writes its bucket into a file the others
      map, each sums one slice of it, and small collectives on a per-host process group are the
      sync points (so a dead rank fails the others as any collective does). Across hosts, one rank
      per host all-reduces its host's sum through gloo. ``"gloo"``: every byte through the process
      group, as across hosts.
    - ``gradient_compression="fp16"``: what goes through gloo (across hosts, or everything with
      ``host_reduction="gloo"``) is each rank's (host's) gradient divided by the world size as fp16,
      summed in fp16 (torch's ``fp16_compress_hook``): half the bytes, the mean within fp16's
      precision, still identical on every rank.
    - :meth:`comm_stats`: seconds spent per phase (download, all_reduce, upload, blocked).
    - :meth:`no_sync`: backward passes inside accumulate gradients locally; the first
      backward outside reduces the accumulated gradients (gradient accumulation).
    - Gradient clipping (``AdamW(max_grad_norm=...)``, ``clip_grad_norm_``) after backward
      sees the averaged, global gradients.

    Every rank must run the same sequence of backward passes and produce gradients for the
    same parameters, with the same optimizer setup (fused or not), as torch's DDP with
    ``find_unused_parameters=False`` requires; otherwise the collectives mismatch and fail
    or wait until the process group's timeout. A rank that dies makes the others' next
    collective raise (a ``RuntimeError`` naming the bucket and rank), bounded by the
    timeout given to ``init_process_group``. Dropout: seed each rank differently
    (``pywgtrain.manual_seed(seed + rank)``), or every rank draws the same masks.
    Module buffers (none of pywgtrain's modules has any) are not broadcast.
    """

    def __init__(
        self,
        module: Module,
        process_group: Any = None,
        bucket_cap_mb: float = 25.0,
        init_sync: bool = True,
        gradient_compression: Optional[str] = None,
        overlap: bool = True,
        host_reduction: str = "shm",
    ) -> None:
        import torch
        import torch.distributed as dist

        if not isinstance(module, Module):
            raise TypeError(
                f"DistributedDataParallel: module must be a pywgtrain.nn.Module, got {type(module).__name__}"
            )
        if not float(bucket_cap_mb) > 0:
            raise ValueError(f"bucket_cap_mb must be > 0, got {bucket_cap_mb}")
        if gradient_compression not in (None, "fp16"):
            raise ValueError(f"gradient_compression must be None or 'fp16', got {gradient_compression!r}")
        if host_reduction not in ("shm", "gloo"):
            raise ValueError(f"host_reduction must be 'shm' or 'gloo', got {host_reduction!r}")
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "DistributedDataParallel: the default process group has not been initialized; call "
                "torch.distributed.init_process_group('gloo') first"
            )
        super().__init__()
        self.module = module
        device = module.device
        if device is None:
            raise ValueError("DistributedDataParallel: the module has no parameters and no device")
        object.__setattr__(self, "_torch", torch)
        object.__setattr__(self, "_dist", dist)
        object.__setattr__(self, "process_group", process_group)
        self.world_size: int = dist.get_world_size(process_group)
        self.rank: int = dist.get_rank(process_group)
        self.bucket_cap_mb = float(bucket_cap_mb)
        self.require_backward_grad_sync = True
        self.gradient_compression = gradient_compression
        self._stats = dict.fromkeys(
            ("download_s", "upload_s", "all_reduce_s", "blocked_s", "syncs", "buckets", "early_buckets"), 0.0
        )
        self._threads: Optional[tuple[Any, Any]] = None
        # The buckets of the last reduction (reused while the gradients stay where they were), which
        # bucket each parameter is in, how many of each bucket's gradients are still being computed
        # in this backward pass, and the buckets started during it.
        self._plan: Optional[list[_Bucket]] = None
        self._bucket_of: dict[int, int] = {}
        self._remaining: list[int] = []
        self._inflight: dict[int, Any] = {}
        object.__setattr__(self, "_device", device)
        params = module.parameters()
        self._check_same_model(params)
        if init_sync:
            self._broadcast_parameters(params)
        self._host: Optional[HostReducer] = None
        if host_reduction == "shm" and self.world_size > 1:
            host = self._collective(
                "setting up the shared-memory reduction",
                lambda: HostReducer(
                    torch, dist, process_group, self.rank, self.world_size, sum(p.numel() for p in params)
                ),
            )
            self._host = host if host.active else None
        ref = weakref.ref(self)

        def hook(leaves: Sequence[Any]) -> None:
            ddp = ref()
            if ddp is not None:
                ddp._after_backward(leaves)

        handle = autograd.register_post_backward_hook(device, hook)
        weakref.finalize(self, handle.remove)
        if overlap:

            def ready(leaves: Sequence[Any]) -> None:
                ddp = ref()
                if ddp is not None:
                    ddp._on_gradients_ready(leaves)

            weakref.finalize(self, autograd.register_gradient_ready_hook(device, ready).remove)

    # -- PyTorch's surface -------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside the block accumulate gradients without averaging them; the
        first backward after it averages what accumulated (torch's ``no_sync``)."""
        prev = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = prev

    def extra_repr(self) -> str:
        return f"world_size={self.world_size}, rank={self.rank}"

    # -- construction ----------------------------------------------------------------------
    def _collective(self, what: str, fn: Any) -> Any:
        """Run a collective, turning a failure (a rank gone, a timeout) into an error naming it."""
        try:
            return fn()
        except RuntimeError as e:
            raise RuntimeError(
                f"DistributedDataParallel (rank {self.rank} of {self.world_size}): {what} failed: {e} "
                "(another process may have exited or stopped responding; the process group's timeout "
                "bounds the wait)"
            ) from e

    def _check_same_model(self, params: list[Any]) -> None:
        shapes = repr([tuple(p.shape) for p in params]).encode()
        mine = np.array([len(params), sum(p.numel() for p in params), zlib.crc32(shapes)], np.int64)
        torch, dist = self._torch, self._dist
        gathered = [torch.zeros(3, dtype=torch.int64) for _ in range(self.world_size)]
        self._collective(
            "comparing the models' parameter shapes",
            lambda: dist.all_gather(gathered, torch.from_numpy(mine.copy()), group=self.process_group),
        )
        for r, t in enumerate(gathered):
            if not np.array_equal(t.numpy(), mine):
                raise ValueError(
                    f"DistributedDataParallel: rank {r} wraps another model ({int(t[0])} parameters, "
                    f"{int(t[1])} values) than rank {self.rank} ({mine[0]} parameters, {mine[1]} values, or other shapes)"
                )

    def _broadcast_parameters(self, params: list[Any]) -> None:
        """Rank 0's parameter values to every rank, in buckets of concatenated parameters."""
        torch, dist = self._torch, self._dist
        for i, bucket in enumerate(_host_buckets(params, self._cap_floats())):
            flat = np.concatenate([p.numpy().reshape(-1) for p in bucket])
            self._collective(
                f"broadcasting parameter bucket {i}",
                lambda: dist.broadcast(torch.from_numpy(flat), 0, group=self.process_group),
            )
            if self.rank != 0:
                with autograd.no_grad():
                    _scatter(flat, bucket)

    def _cap_floats(self) -> int:
        return max(int(self.bucket_cap_mb * (1 << 20)) // 4, 1)

    # -- gradient averaging --------------------------------------------------------------------
    def _after_backward(self, leaves: Sequence[Any]) -> None:
        if not self.require_backward_grad_sync or self.world_size == 1:
            return  # (a world of one has nothing to average: no transfers)
        mine = {id(p) for p in self.module.parameters()}
        if any(id(t) in mine for t in leaves):
            self.sync_gradients()

    def _on_gradients_ready(self, leaves: Sequence[Any]) -> None:
        """During backward: start reducing each bucket of the current plan whose gradients are all
        complete (flushing the recorded work first, so the download finds it submitted)."""
        if not self.require_backward_grad_sync or self._plan is None or self.world_size == 1:
            return
        for t in leaves:
            k = self._bucket_of.get(id(t))
            if k is None or k in self._inflight:
                continue
            self._remaining[k] -= 1
            if self._remaining[k] == 0 and self._plan[k].current():
                self._device.flush()
                self._inflight[k] = self._start(k, self._plan[k])
                self._stats["early_buckets"] += 1

    def sync_gradients(self) -> None:
        """Average every parameter's ``.grad`` across the ranks now (what each backward outside
        :meth:`no_sync` does when it returns; buckets already started during that backward are
        waited for). Every rank must call it."""
        t0 = time.perf_counter()
        inflight, self._inflight = self._inflight, {}
        try:
            # The transfers run on other threads: what this thread recorded (its batch too) must be
            # submitted for their downloads to see it.
            self._device.flush()
            params = [p for p in self.module.parameters() if p.grad is not None]
            plan = self._gradient_buckets(params)
            started = list(inflight.values())
            if self._plan is not None and [b.key for b in plan] == [b.key for b in self._plan]:
                plan = self._plan  # the same buckets: keep their spans
                rest = [(k, b) for k, b in enumerate(plan) if k not in inflight]
            else:  # the first pass, or the gradients moved: what was started covers its own parameters
                done = {id(p) for k in inflight for p in self._plan[k].params} if self._plan else set()
                left = [p for p in params if id(p) not in done]
                rest = list(enumerate(self._gradient_buckets(left) if done else plan))
            started += [self._start(k, b) for k, b in rest]
            for transfer in started:
                transfer.result().result()  # the download and all_reduce start, then wait, average, upload
        except BaseException:
            self._use_plan(None)
            raise
        else:
            self._use_plan(plan)
        finally:
            self._stats["blocked_s"] += time.perf_counter() - t0
            self._stats["syncs"] += 1

    def _use_plan(self, plan: Any) -> None:
        self._plan = plan
        self._bucket_of = {} if plan is None else {id(p): k for k, b in enumerate(plan) for p in b.params}
        self._remaining = [] if plan is None else [len(b.params) for b in plan]
        self._inflight = {}

    def _start(self, k: int, bucket: "_Bucket") -> Any:
        """Download bucket k and start its all_reduce on the transfer thread (in the order of the
        calls, the same on every rank); its averaging and upload follow on the finishing thread.
        Returns the transfer's future, whose result is the finishing future."""
        if self._threads is None:
            from concurrent.futures import ThreadPoolExecutor

            self._threads = (
                ThreadPoolExecutor(1, "pywgtrain-ddp-transfer"),
                ThreadPoolExecutor(1, "pywgtrain-ddp-finish"),
            )
            weakref.finalize(self, _shutdown, self._threads)
        return self._threads[0].submit(self._transfer, k, bucket)

    def _transfer(self, k: int, bucket: "_Bucket") -> Any:
        torch, dist = self._torch, self._dist
        t0 = time.perf_counter()
        grads = [p.grad for p in bucket.params]
        if self._host is not None:
            n = bucket.span.numel() if bucket.span is not None else sum(g.numel() for g in grads)
            slot = self._host.slot(k, n)
            if bucket.span is not None:
                bucket.span.numpy(out=slot)  # straight into the shared memory the other ranks read
            else:
                np.concatenate([g.numpy().reshape(-1) for g in grads], out=slot)
            self._stats["download_s"] += time.perf_counter() - t0
            return self._threads[1].submit(self._finish_on_host, k, n, bucket, grads)  # type: ignore[index]
        if bucket.span is not None:
            if bucket.host is None:  # one array per bucket, reused by every step (the last one's is finished)
                bucket.host = np.empty(bucket.span.shape, np.float32)
            flat = bucket.span.numpy(out=bucket.host)
        else:
            flat = np.concatenate([g.numpy().reshape(-1) for g in grads])
        t = torch.from_numpy(flat)
        if self.gradient_compression == "fp16":
            t = t.to(torch.float16).div_(self.world_size)  # averaged before the sum, as torch's fp16 hook
        t1 = time.perf_counter()
        what = f"all_reduce of gradient bucket {k} ({flat.size} values)"
        work = self._collective(
            what, lambda: dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.process_group, async_op=True)
        )
        self._stats["download_s"] += t1 - t0
        return self._threads[1].submit(self._finish, what, work, t, t1, flat, bucket, grads)  # type: ignore[index]

    def _finish(
        self, what: str, work: Any, t: Any, t1: float, flat: np.ndarray, bucket: "_Bucket", grads: list
    ) -> None:
        self._collective(what, work.wait)
        t2 = time.perf_counter()
        if self.gradient_compression == "fp16":
            flat[:] = t.numpy()
        else:
            t.div_(self.world_size)
        if bucket.span is not None:
            bucket.span.copy_(flat)
        else:
            _scatter(flat, grads)
        self._stats["all_reduce_s"] += t2 - t1
        self._stats["upload_s"] += time.perf_counter() - t2
        self._stats["buckets"] += 1

    def _finish_on_host(self, k: int, n: int, bucket: "_Bucket", grads: list) -> None:
        assert self._host is not None
        t1 = time.perf_counter()
        what = f"all_reduce of gradient bucket {k} ({n} values)"
        pieces = self._host.reduce(k, n, self._collective, what, self.gradient_compression)
        t2 = time.perf_counter()
        if bucket.span is not None:
            for where, values in pieces:
                bucket.span[where].copy_(values)
        else:
            _scatter(np.concatenate([values for _, values in pieces]), grads)
        self._stats["all_reduce_s"] += t2 - t1
        self._stats["upload_s"] += time.perf_counter() - t2
        self._stats["buckets"] += 1

    def comm_stats(self, reset: bool = False) -> dict[str, float]:
        """Seconds spent since the last reset: ``download_s`` and ``upload_s`` (host transfers of the
        buckets; a download counts from its request, so it includes waiting for the GPU to reach the
        bucket), ``all_reduce_s`` (from each bucket's all_reduce start to its end), ``blocked_s`` (the
        caller's time inside the post-backward reduction: what was not overlapped with backward),
        and the counts ``syncs``, ``buckets`` and ``early_buckets`` (started while backward ran). Buckets run concurrently: the times are summed
        over buckets, not wall clock."""
        out = dict(self._stats)
        if reset:
            for key in self._stats:
                self._stats[key] = 0.0
        return out

    def _gradient_buckets(self, params: list[Any]) -> list["_Bucket"]:
        """Arena spans for runs of gradients in a fused AdamW's arena, host-concatenated groups for
        the rest; in the same order on every rank (that of the model's parameters)."""
        pos = {id(p): k for k, p in enumerate(params)}
        runs: list[tuple[int, Any, list[int]]] = []  # (first position, arena, arena indices)
        in_arena: set[int] = set()
        for arena in list(_flat_gradients):
            idx = [i for i, q in enumerate(arena.params) if id(q) in pos and arena.holds_grad(i)]
            run: list[int] = []
            for i in idx:
                if run and (i != run[-1] + 1 or _end(arena, i) - arena.offsets[run[0]] > self._cap_floats()):
                    runs.append((pos[id(arena.params[run[0]])], arena, run))
                    run = []
                run.append(i)
            if run:
                runs.append((pos[id(arena.params[run[0]])], arena, run))
            in_arena.update(id(arena.params[i]) for i in idx)
        out = [(first, _Bucket(arena, run)) for first, arena, run in runs]
        loose = [p for p in params if id(p) not in in_arena]
        for bucket in _host_buckets(loose, self._cap_floats()):
            out.append((pos[id(bucket[0])], _Bucket(None, bucket)))
        out.sort(key=lambda b: b[0])
        return [b for _, b in out]


class _Bucket:
    """Gradients reduced together: a span of an AdamW arena (``arena`` and its indices ``items``),
    or loose parameters (``items``) whose gradients are concatenated on the host."""

    __slots__ = ("arena", "items", "params", "span", "key", "host")

    def __init__(self, arena: Any, items: list[Any]) -> None:
        self.arena, self.items = arena, items
        self.host: Optional[np.ndarray] = None  # the span's host copy, downloaded into on every step
        self.params = items if arena is None else [arena.params[i] for i in items]
        self.span = None if arena is None else arena.span("grad", items[0], items[-1] + 1)
        self.key = (id(arena), tuple(id(p) for p in self.params))

    def current(self) -> bool:
        """Whether the gradients still live where this bucket reads them."""
        if self.arena is None:
            return all(p.grad is not None for p in self.params)
        return all(self.arena.holds_grad(i) for i in self.items)


def _shutdown(threads: Any) -> None:
    for pool in threads:
        pool.shutdown(wait=False)


def _end(arena: Any, i: int) -> int:
    """The arena offset where parameter i's region (and the gap after it) ends."""
    return arena.offsets[i + 1] if i + 1 < len(arena.offsets) else arena.size


def _host_buckets(tensors: list[Any], cap: int) -> list[list[Any]]:
    """Consecutive tensors in groups of at most ``cap`` values (a larger one alone)."""
    buckets: list[list[Any]] = []
    size = 0
    for t in tensors:
        if buckets and size + t.numel() <= cap:
            buckets[-1].append(t)
            size += t.numel()
        else:
            buckets.append([t])
            size = t.numel()
    return buckets


def _scatter(flat: np.ndarray, tensors: list[Tensor]) -> None:
    """Upload consecutive pieces of ``flat`` into ``tensors``."""
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].reshape(t.shape))
        offset += t.numel()
