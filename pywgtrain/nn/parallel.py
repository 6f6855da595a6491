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
import weakref
import zlib
from typing import Any, Iterator, Sequence

import numpy as np

from .. import autograd
from ..tensor import Tensor
from .modules.module import Module

__all__ = ["DistributedDataParallel"]


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
    - Buckets: gradients that live in a fused AdamW's flat arena are reduced as spans of
      it, a run of neighbouring parameters per bucket (one download and one upload each);
      other gradients are concatenated on the host. A bucket holds up to
      ``bucket_cap_mb`` MiB (a larger parameter is a bucket of its own). All buckets are
      downloaded, their ``all_reduce``s started together (asynchronously), then each is
      averaged and uploaded as it completes. The whole reduction is synchronous with
      respect to the caller: it waits for the GPU to finish the backward pass first (the
      download), and for every rank.
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
    ) -> None:
        import torch
        import torch.distributed as dist

        if not isinstance(module, Module):
            raise TypeError(
                f"DistributedDataParallel: module must be a pywgtrain.nn.Module, got {type(module).__name__}"
            )
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "DistributedDataParallel: the default process group has not been initialized; call "
                "torch.distributed.init_process_group('gloo') first"
            )
        if not float(bucket_cap_mb) > 0:
            raise ValueError(f"bucket_cap_mb must be > 0, got {bucket_cap_mb}")
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
        params = module.parameters()
        self._check_same_model(params)
        if init_sync:
            self._broadcast_parameters(params)
        ref = weakref.ref(self)

        def hook(leaves: Sequence[Any]) -> None:
            ddp = ref()
            if ddp is not None:
                ddp._after_backward(leaves)

        handle = autograd.register_post_backward_hook(device, hook)
        weakref.finalize(self, handle.remove)

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
        mine = np.array([len(params), sum(p._numel for p in params), zlib.crc32(shapes)], np.int64)
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
        if not self.require_backward_grad_sync:
            return
        mine = {id(p) for p in self.module.parameters()}
        if any(id(t) in mine for t in leaves):
            self.sync_gradients()

    def sync_gradients(self) -> None:
        """Average every parameter's ``.grad`` across the ranks now (what each backward outside
        :meth:`no_sync` does when it returns). Every rank must call it."""
        torch, dist = self._torch, self._dist
        buckets = self._gradient_buckets([p for p in self.module.parameters() if p.grad is not None])
        started = []
        for i, (span, grads) in enumerate(buckets):
            flat = span.numpy() if span is not None else np.concatenate([g.numpy().reshape(-1) for g in grads])
            t = torch.from_numpy(flat)
            work = self._collective(
                f"all_reduce of gradient bucket {i} ({flat.size} values)",
                lambda: dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.process_group, async_op=True),
            )
            started.append((i, work, t, flat, span, grads))
        for i, work, t, flat, span, grads in started:
            self._collective(f"all_reduce of gradient bucket {i} ({flat.size} values)", work.wait)
            t.div_(self.world_size)
            if span is not None:
                span.copy_(flat)
            else:
                _scatter(flat, grads)

    def _gradient_buckets(self, params: list[Any]) -> list[tuple[Any, list[Any]]]:
        """(arena span, None) for runs of gradients in a fused AdamW's arena, (None, grads) for
        the rest; in the same order on every rank (that of the model's parameters)."""
        from ..optim.adamw import _FlatArena  # the optimizer sits above nn: imported when used

        pos = {id(p): k for k, p in enumerate(params)}
        runs: list[tuple[int, Any, list[int]]] = []  # (first position, arena, arena indices)
        in_arena: set[int] = set()
        for arena in list(_FlatArena.live):
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
        out: list[tuple[int, Any, list[Any]]] = [
            (first, arena.span("grad", run[0], run[-1] + 1), []) for first, arena, run in runs
        ]
        loose = [p for p in params if id(p) not in in_arena]
        for bucket in _host_buckets(loose, self._cap_floats()):
            out.append((pos[id(bucket[0])], None, [p.grad for p in bucket]))
        out.sort(key=lambda b: b[0])
        return [(span, grads) for _, span, grads in out]


def _end(arena: Any, i: int) -> int:
    """The arena offset where parameter i's region (and the gap after it) ends."""
    return arena.offsets[i + 1] if i + 1 < len(arena.offsets) else arena.size


def _host_buckets(tensors: list[Any], cap: int) -> list[list[Any]]:
    """Consecutive tensors in groups of at most ``cap`` values (a larger one alone)."""
    buckets: list[list[Any]] = []
    size = 0
    for t in tensors:
        if buckets and size + t._numel <= cap:
            buckets[-1].append(t)
            size += t._numel
        else:
            buckets.append([t])
            size = t._numel
    return buckets


def _scatter(flat: np.ndarray, tensors: list[Tensor]) -> None:
    """Upload consecutive pieces of ``flat`` into ``tensors``."""
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t._numel].reshape(t.shape))
        offset += t._numel
