"""Capture GPU work once, replay it many times (``torch.cuda.CUDAGraph``'s idea).

``with pw.graph(g): ...`` runs the block as usual and also keeps its dispatches
in ``g``; ``g.replay()`` records them again in one call, without the Python
that issued them, kernel lookups or bind-group creation. A replay reads and
writes the tensors the capture used, or others of the same shape and dtype
put in their place (``inputs``), so one captured training step serves every
batch::

    g = pw.Graph()
    with pw.graph(g):
        loss = loss_fn(model(static_x), static_y)
        loss.backward()
    for x, y in batches:
        g.replay({static_x: x, static_y: y})
        optimizer.step()

What the block computed on the host (shapes, Python branches, scalars baked
into kernel arguments) is fixed at capture; a block that reads GPU data on the
host mid-capture cannot be replayed and raises :class:`CaptureError`. Values
an operation feeds from the host on every call (a capturable ``AdamW``'s
learning rates, through :func:`feed`) are the exception: the graph keeps how
to compute them, and each replay uploads their current values, so a captured
``optimizer.step()`` follows a learning-rate scheduler. Float16 shadows
(:class:`pywgtrain.tensor.HalfShadow`, which autocast reads for parameters)
are kept honest the same way: a replay first refreshes each shadow the capture
read whose master was written since, and afterwards moves the version of each
master the capture wrote, as the eager block would have.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Mapping, Optional, Union

import numpy as np

from . import _core, autograd
from .device import Device, resolve_device
from .tensor import HalfShadow, Tensor, half_shadows


class CaptureError(RuntimeError):
    """The captured block read GPU data on the host (or otherwise submitted
    work) mid-capture, so its graph would miss part of the block. The block
    itself ran completely, in order; ``where`` names the read."""

    def __init__(self, where: str) -> None:
        super().__init__(
            f"{where} read GPU data (or submitted work) in the middle of a graph capture, so the "
            "graph cannot be replayed (the block itself ran); move the read out of the captured block"
        )
        self.where = where


class Graph:
    """A captured sequence of GPU work (see the module docstring). Empty until
    a :func:`graph` block has captured into it; capturing again replaces it."""

    def __init__(self) -> None:
        self.device: Optional[Device] = None
        self._graph = None
        self._backwards: list = []  # leaves of each captured backward pass (post-backward hooks)
        self._feeds: dict = {}  # id(tensor) -> (tensor, values): host values each replay uploads (feed())
        self._shadow_reads: list[HalfShadow] = []  # float16 shadows the captured work reads
        self._shadow_writes: list[tuple[HalfShadow, bool]] = []  # (shadow, copy rewritten) of masters it writes

    def __len__(self) -> int:
        """The number of captured dispatches."""
        return 0 if self._graph is None else len(self._graph)

    def kernel_names(self) -> list[str]:
        """The kernel of each captured dispatch, in order."""
        return [] if self._graph is None else self._graph.kernel_names()

    def profile(self, reps: int = 5) -> dict[str, Any]:
        """GPU time of a replay (medians of ``reps``), from timestamp queries
        (the device needs the ``timestamp-query`` feature): ``gpu_us`` of the
        whole replay in one timed pass; ``kernels``, each dispatch timed in a
        pass of its own and summed per kernel, slowest first. Waits for the GPU."""
        if self._graph is None or self.device is None:
            raise RuntimeError("Graph.profile(): nothing captured yet")
        dev = self.device
        if "timestamp-query" not in dev.features:
            raise RuntimeError(f"Graph.profile(): {dev.name!r} does not offer the timestamp-query feature")
        names = self.kernel_names()
        dev.flush()
        whole, each = [], []
        for _ in range(reps):
            rec = _core._Recorder(dev._dev)
            timer = _core._PassTimer(dev._dev, 1)
            self._before_replay(rec)
            timer.time_next_pass(rec, 0)
            rec.replay(self._graph)
            self._after_replay()
            whole.append(timer.read(rec, 1)[0] / 1e3)
            rec = _core._Recorder(dev._dev)
            timer = _core._PassTimer(dev._dev, len(names))
            self._before_replay(rec)
            rec.replay(self._graph, timer)
            self._after_replay()
            each.append(timer.read(rec, len(names)))
        per_dispatch = np.median(np.array(each), axis=0) / 1e3
        by_kernel: dict[str, tuple[int, float]] = {}
        for name, us in zip(names, per_dispatch):
            n, t = by_kernel.get(name, (0, 0.0))
            by_kernel[name] = (n + 1, t + float(us))
        top = sorted(by_kernel.items(), key=lambda kv: -kv[1][1])
        return {
            "gpu_us": float(np.median(whole)),
            "dispatches": len(names),
            "sum_of_dispatches_us": float(per_dispatch.sum()),
            "kernels": [{"kernel": k, "count": n, "us": t} for k, (n, t) in top],
        }

    def replay(self, inputs: Optional[Mapping[Tensor, Union[Tensor, np.ndarray]]] = None) -> None:
        """Record the captured work again, into this thread's ``Device.batch()``
        or the device's stream, like any operation. ``inputs`` maps tensors the
        capture used to what this replay uses in their place: a tensor of the
        same shape and dtype on the same device (read or written, as the
        capture did), or a C-contiguous NumPy array (uploaded with the replay;
        the captured work may only read it). Nothing else is checked: the
        captured work writes the tensors it wrote, whatever they hold now."""
        if self._graph is None or self.device is None:
            raise RuntimeError("Graph.replay(): nothing captured yet (capture with `with pywgtrain.graph(g): ...`)")
        dev = self.device
        inputs = dict(inputs or {})
        for static, values in self._feeds.values():
            if static not in inputs:
                inputs[static] = _fed_array(static, values)
        pairs = []
        for static, source in inputs.items():
            if not isinstance(static, Tensor):
                raise TypeError(f"Graph.replay(): inputs keys must be captured Tensors, got {type(static).__name__}")
            if not static._bindable:
                raise ValueError("Graph.replay(): a strided view cannot be rebound; capture a contiguous tensor")
            if isinstance(source, Tensor):
                if source.device is not dev:
                    raise ValueError(f"Graph.replay(): an input lives on {source.device!r}, the graph on {dev!r}")
                if not source._bindable:
                    raise ValueError("Graph.replay(): a strided view cannot stand in for a captured tensor")
                source._batch = dev._current_batch_token()  # written by the work recorded now
                target = source._buf
            elif isinstance(source, np.ndarray):
                if not source.flags.c_contiguous:
                    raise ValueError("Graph.replay(): NumPy inputs must be C-contiguous")
                target = source
            else:
                raise TypeError(
                    f"Graph.replay(): inputs values must be Tensors or NumPy arrays, got {type(source).__name__}"
                )
            if source.shape != static.shape or np.dtype(source.dtype) != static.dtype:
                raise ValueError(
                    f"Graph.replay(): an input of shape {tuple(source.shape)} and dtype {np.dtype(source.dtype).name} "
                    f"for a captured tensor of shape {static.shape} and dtype {static.dtype.name}"
                )
            pairs.append((static._buf, target))
        with dev._recording() as rec:
            self._before_replay(rec)
            rec.replay(self._graph, inputs=pairs)
        self._after_replay()
        # The replayed backward passes produced gradients again: what runs after a backward
        # (DistributedDataParallel's gradient averaging) runs now, as it did after the capture.
        autograd.run_post_backward_hooks(dev, self._backwards)

    def _before_replay(self, rec: Any) -> None:
        """The float16 shadows the captured work reads, refreshed where their masters changed."""
        for sh in self._shadow_reads:
            if sh.alive:  # (a master that is gone can be written by nobody)
                sh.read(rec)

    def _after_replay(self) -> None:
        for sh, consistent in self._shadow_writes:
            sh.replayed(consistent)


def _shadow_effects(
    dev: Device, before: dict[HalfShadow, tuple[int, Optional[int]]]
) -> tuple[list[HalfShadow], list[tuple[HalfShadow, bool]]]:
    """The float16 shadows a capture read, and those whose masters it wrote with whether it
    rewrote the copy after (the copy then matches when the capture ends), from their read counts
    and master versions ``before`` it."""
    reads, writes = [], []
    for sh in half_shadows(dev):
        n, version = before.get(sh, (0, None))
        if sh.reads != n:
            reads.append(sh)
        if sh.master_version != version:
            writes.append((sh, sh.current()))
    return reads, writes


@contextlib.contextmanager
def graph(g: Graph, device: Optional[Device] = None) -> Iterator[Graph]:
    """Run the block and capture its GPU work into ``g`` (``torch.cuda.graph``'s
    shape). The block runs as one ``Device.batch()`` of ``device`` (default:
    the default device); an exception inside it discards the block's work and
    leaves ``g`` as it was. Raises :class:`CaptureError` at the end of a block
    that read GPU data on the host."""
    if not isinstance(g, Graph):
        raise TypeError(f"graph(): g must be a pywgtrain.Graph, got {type(g).__name__}")
    dev = resolve_device(device)
    if dev._in_batch():
        raise RuntimeError("graph(): cannot capture inside a Device.batch() block")
    feeds: dict = {}
    shadows = {sh: (sh.reads, sh.master_version) for sh in half_shadows(dev)}
    with dev.batch() as rec:
        dev.capture_interrupted(reset=True)
        rec.begin_capture()
        dev._local.graph_feeds = feeds
        try:
            with autograd.deferred_post_backward_hooks(dev) as backwards:
                yield g
        finally:
            dev._local.graph_feeds = None
        captured = rec.end_capture()
        where = dev.capture_interrupted(reset=True)
    # Post-backward hooks (a host round trip) were held back during the capture; the block's
    # backward passes have run now, and so do their hooks, whether or not the graph is usable.
    autograd.run_post_backward_hooks(dev, backwards)
    if where is not None:
        raise CaptureError(where)
    g.device, g._graph, g._backwards, g._feeds = dev, captured, backwards, feeds
    g._shadow_reads, g._shadow_writes = _shadow_effects(dev, shadows)


def _fed_array(t: Tensor, values: Callable[[], Any]) -> np.ndarray:
    a = np.ascontiguousarray(values(), dtype=t.dtype)
    if a.shape != t.shape:
        raise ValueError(f"feed: values of shape {a.shape} for a tensor of shape {t.shape}")
    return a


def feed(rec: Any, t: Tensor, values: Callable[[], Any]) -> None:
    """Write ``values()`` (an array of ``t``'s shape and dtype) into ``t`` at this
    point of the recording ``rec`` (``t.device._recording()``'s), in stream
    order and without a wait. Inside a :func:`graph` capture the graph keeps
    ``values``, and every replay uploads ``values()`` again and binds it in
    ``t``'s place, so captured dispatches may read ``t`` but must not write it.
    One feed per tensor and capture."""
    a = _fed_array(t, values)
    if not t._bindable:
        raise ValueError("feed: a strided view cannot be fed; feed a contiguous tensor")
    rec.write(t._buf, 0, a)
    if rec.capturing:
        feeds = getattr(t.device._local, "graph_feeds", None)
        if feeds is None:
            raise RuntimeError("feed: the recording captures, but not through pywgtrain.graph()")
        if id(t) in feeds:
            raise RuntimeError(
                "feed: a tensor fed twice in one capture (e.g. optimizer.step() twice) would replay "
                "with one value for both; capture one step per graph"
            )
        feeds[id(t)] = (t, values)
