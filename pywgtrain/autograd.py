"""Reverse-mode automatic differentiation over device tensors.

Every differentiable op that runs while gradients are enabled and sees an
input with ``requires_grad`` records a :class:`Node`: its inputs, what its
backward needs, and a backward function that records GPU work (nothing is
read back). ``Tensor.backward()`` walks the nodes in reverse topological
order; gradients flow through *slots*:

* a leaf (a tensor the user created with ``requires_grad=True``, such as a
  parameter) accumulates into ``.grad`` as PyTorch does (written in place
  when it already exists, or straight into an optimizer's flat gradient
  arena when the parameter has one);
* an intermediate tensor's gradient is summed over its uses. A gradient
  handed on unchanged (an add, a reshape) is shared by several slots; the
  last slot still holding it may write it in place instead of copying it
  first (a residual connection's gradient, once the branch has read it).

Backward functions either ask a sink for a ``(tensor, beta)`` target and
write into it with a kernel that accumulates when ``beta`` is 1 (GEMMs,
element-wise and reduction kernels all take ``beta``), or hand over a
finished tensor. Nodes are released after their backward ran, so a step's
graph, and the device memory it holds, is freed once ``backward()``
returns.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any, Callable, Iterator, Sequence

from . import _core

_state: threading.local = threading.local()


def is_grad_enabled() -> bool:
    return getattr(_state, "enabled", True)


class set_grad_enabled(contextlib.ContextDecorator):
    """Context manager / decorator switching gradient recording on or off (this thread)."""

    def __init__(self, mode: bool) -> None:
        self.mode = bool(mode)

    def __enter__(self):
        self.prev = is_grad_enabled()
        _state.enabled = self.mode

    def __exit__(self, *exc):
        _state.enabled = self.prev
        return False


class no_grad(set_grad_enabled):
    """``with pywgtrain.no_grad():`` ops inside record no graph (like ``torch.no_grad``)."""

    def __init__(self) -> None:
        super().__init__(False)


class enable_grad(set_grad_enabled):
    def __init__(self):
        super().__init__(True)


class Node:
    """One recorded op: ``backward_fn(grad, sinks)`` records the input
    gradients. ``inputs`` are the op's tensor inputs (None where an input
    takes no gradient); ``edges`` the nodes that produced them when the op
    ran (None for leaves): an in-place op later gives its tensor a new node,
    and the ops that read the old value must still reach the old one.
    ``versions`` the (storage, version) of each tensor whose values backward
    reads, checked before it runs."""

    __slots__ = ("name", "inputs", "edges", "backward_fn", "versions", "released", "__weakref__")

    def __init__(self, name, inputs, backward_fn, keep=()):
        self.name = name
        self.edges = tuple(None if t is None else t._node for t in inputs)
        # Leaves are held (their .grad is written); other inputs only weakly: a node must not keep
        # alive an activation its backward does not read (what it reads, its closure holds).
        self.inputs = tuple(t if e is None else _Input(t) for t, e in zip(inputs, self.edges))
        self.backward_fn = backward_fn
        self.versions = tuple((t._store, t._store.version) for t in keep if t is not None)
        self.released = False

    def release(self):
        self.inputs = ()
        self.edges = ()
        self.backward_fn = None
        self.versions = ()  # they reference storages: a released graph must not keep memory alive
        self.released = True

    def check_versions(self):
        for store, version in self.versions:
            if store.version != version:
                raise RuntimeError(
                    f"one of the variables needed for gradient computation has been modified by an inplace "
                    f"operation: the input or output of {self.name} is at version {store.version}; expected "
                    f"version {version} instead (clone it before the in-place operation, or do the in-place "
                    "operation after backward)"
                )

    def __repr__(self):
        return f"<{self.name}Backward>"


def needs_grad(*tensors):
    """Whether an op over these inputs records a node."""
    for t in tensors:  # a loop, not any(): this runs for every op
        if t is not None and getattr(t, "requires_grad", False):
            return is_grad_enabled()
    return False


def attach(out, name, inputs, backward_fn, keep=()):
    """Make ``out`` the result of a recorded op (when any input requires grad).
    ``keep``: the tensors (inputs or ``out``) whose values ``backward_fn``
    reads; writing one of them in place before backward makes backward raise."""
    if needs_grad(*inputs):
        for t in inputs:
            if t is not None and t._base is not None and t.requires_grad and t._view_of is not t._base._node:
                raise RuntimeError(
                    f"{name}: this view was taken before its base was modified by an in-place operation that "
                    "autograd recorded, so its history is out of date; take the view again after the in-place "
                    "operation"
                )
        out.requires_grad = True
        out._node = Node(name, [t if t is not None and t.requires_grad else None for t in inputs], backward_fn, keep)
    return out


class _Input:
    """A non-leaf input of a node: what its gradient slot needs (shape, dtype, device) and a
    weak reference to the tensor, for ``retain_grad`` while it lives."""

    __slots__ = ("ref", "cls", "shape", "dtype", "device")
    _retains_grad = False
    _node = None

    def __init__(self, t):
        self.ref, self.cls = weakref.ref(t), type(t)
        self.shape, self.dtype, self.device = t.shape, t.dtype, t.device

    def tensor(self):
        """The tensor while it lives, else this record (which retains no gradient)."""
        t = self.ref()
        return self if t is None else t

    def new_empty(self, size):
        """An uninitialized tensor of the input's class, dtype and device (built here: tensor.py
        imports this module, not the other way round)."""
        count = 1
        for d in size:
            count *= d
        return self.cls(_core._Buffer(self.device._dev, count * self.dtype.itemsize), size, self.dtype, self.device)


class _Slot:
    """Where the gradient of one tensor collects during a backward pass."""

    __slots__ = ("tensor", "shape", "leaf", "value", "owned", "share")

    def __init__(self, tensor, leaf):
        self.tensor = tensor
        self.shape = tensor.shape
        self.leaf = leaf
        self.value = None  # intermediate: the gradient so far
        self.owned = False  # whether `value` may be written in place
        self.share = None  # the _Share of a value other slots may hold too (owned is then False)

    # -- leaves: .grad as in PyTorch -----------------------------------------
    def _leaf_target(self):
        t = self.tensor
        if t.grad is None:
            home = t._grad_home
            t.grad = home if home is not None else _empty_like(t)
            return t.grad, 0.0
        return t.grad, 1.0

    def _own(self):
        """Make ``value`` writable: take it over when no other slot holds it any more, else copy it."""
        share = self.share
        self.share = None
        if share is not None:
            share.holders -= 1
            if share.holders == 0:
                self.owned = True
                return
        self.value, self.owned = _copy(self.value), True

    def drop(self):
        """The value was consumed (its producer's backward ran)."""
        if self.share is not None:
            self.share.holders -= 1
            self.share = None
        self.value = None

    def target(self):
        """(tensor, beta): write the contribution into tensor, accumulating when beta is 1."""
        if self.leaf:
            return self._leaf_target()
        if self.value is None:
            self.value, self.owned = _empty_like(self.tensor), True
            return self.value, 0.0
        if not self.owned:
            self._own()
        return self.value, 1.0

    def put(self, g, owned=True, share=None):
        """Hand over a finished contribution ``g`` (``owned``: no one else holds it; ``share``: the
        _Share of the writable gradient g was passed on from, which this slot joins)."""
        if g.shape != self.shape:
            g = g.reshape(self.shape)
        if self.leaf:
            t = self.tensor
            if t.grad is None and t._grad_home is None and owned:
                t.grad = g
                return
            dst, beta = self._leaf_target()
            copy_into(g, dst, beta)
            return
        if self.value is None:
            self.value, self.owned = g, owned
            if share is not None:  # only passed with owned=False
                share.holders += 1
                self.share = share
            return
        if not self.owned:
            self._own()
        copy_into(g, self.value, 1.0)


class _Share:
    """Counts the slots holding one writable gradient passed on unchanged."""

    __slots__ = ("holders",)

    def __init__(self):
        self.holders = 1


class Sink:
    """What a backward function sees of one input: its shape and where its gradient goes."""

    __slots__ = ("_slot", "_incoming")

    def __init__(self, slot, incoming):
        self._slot = slot
        self._incoming = incoming  # the slot whose gradient the backward function is handing on

    @property
    def shape(self):
        return self._slot.shape

    def target(self):
        return self._slot.target()

    def put(self, g, owned=True):
        share = None
        src = self._incoming
        # A view of the incoming gradient, passed on unchanged: shared with it when it was writable.
        if not owned and src.value is not None and g._buf is src.value._buf and (src.owned or src.share is not None):
            if src.share is None:
                src.share, src.owned = _Share(), False
            share = src.share
        self._slot.put(g, owned, share)


def _empty_like(t):
    return t.new_empty(t.shape)


def copy_mask(src, dst):
    """The copy kernels' float16 mask for src's elements into dst's (bit 0: src is float16, bit 3:
    dst is): a float16 operand is widened, a float16 result rounded once."""
    return (1 if src.dtype.itemsize == 2 else 0) | (8 if dst.dtype.itemsize == 2 else 0)


def copy_into(src, dst, beta):
    """dst = src + beta * dst in float32 (rounded once into a float16 dst, as torch's half add)."""
    n = src._numel
    with dst.device._recording() as rec:
        _core.unary(rec, 0, src._buf, dst._buf, n, 0.0, 0.0, float(beta), copy_mask(src, dst))


def _copy(src):
    out = _empty_like(src)
    copy_into(src, out, 0.0)
    return out


def _topo_nodes(root_node):
    """Nodes reachable from root_node, each after every node that consumes its output."""
    order, seen = [], set()
    stack = [(root_node, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.released:
            raise RuntimeError(
                "Trying to backward through the graph a second time: the graph of this result was freed by the "
                "first backward() (compute the result again for a second backward)"
            )
        stack.append((node, True))
        for e in node.edges:
            if e is not None and id(e) not in seen:
                stack.append((e, False))
    order.reverse()  # root first
    return order


def backward(root, gradient, retain_graph=None):
    """Run the backward pass from ``root`` with the seed ``gradient``, a float32
    tensor of root's shape on its device (``Tensor.backward`` checks the arguments)."""
    if root._node is None:  # a leaf: its gradient is the seed itself
        with root.device._cache.grad_lock:
            _Slot(root, True).put(gradient, owned=False)
        _after_backward(root.device, (root,))
        return
    nodes = _topo_nodes(root._node)
    for node in nodes:  # before anything is recorded: a refused pass changes no .grad
        node.check_versions()
    # A slot per gradient: keyed by the node that produced the tensor, or by the leaf tensor itself.
    slots = {}  # tensors are kept alive by their consumers' inputs

    def slot_of(t, e):
        key = id(t) if e is None else id(e)
        s = slots.get(key)
        if s is None:
            s = slots[key] = _Slot(t.tensor() if type(t) is _Input else t, e is None)
        return s

    root_slot = slot_of(root, root._node)
    root_slot.put(gradient, owned=False)
    ready = _ready_leaves(root.device, nodes)
    # The device's gradient lock spans the pass and its submission: threads
    # accumulating into one leaf then reach the GPU in the order they decided
    # whether to create or add to its .grad.
    with root.device._cache.grad_lock, root.device.batch():
        for i, node in enumerate(nodes):
            slot = slots.get(id(node))
            if slot is None or slot.value is None:
                if not retain_graph:
                    node.release()  # no gradient reached it
                if i in ready:
                    _gradients_ready(root.device, ready[i])
                continue
            t = slot.tensor
            if t._retains_grad and t._node is node:
                if t.grad is None:
                    t.grad = _copy(slot.value)
                else:
                    copy_into(slot.value, t.grad, 1.0)
            sinks = [None if t is None else Sink(slot_of(t, e), slot) for t, e in zip(node.inputs, node.edges)]
            node.backward_fn(slot.value, sinks)
            slot.drop()
            if not retain_graph:
                node.release()
            if i in ready:
                _gradients_ready(root.device, ready[i])
    if _hooks.get(root.device):  # (the leaves are gathered only for a device with hooks)
        _after_backward(root.device, tuple(s.tensor for s in slots.values() if s.leaf))


# -- post-backward hooks ------------------------------------------------------------------
# DistributedDataParallel averages gradients across processes once a backward pass has
# produced them. A hook runs after the pass's work is recorded (outside its batch), with the
# leaf tensors the pass wrote gradients into. Inside a graph capture a host round trip would
# break the graph, so the pass's leaves are kept instead: ``graphs.graph`` runs the hooks
# after the captured block, and ``Graph.replay`` after every replay (a replayed backward
# produces the gradients again).
_hooks: "weakref.WeakKeyDictionary[Any, dict[int, Callable[[Sequence[Any]], None]]]" = weakref.WeakKeyDictionary()
_hook_ids = iter(range(1, 1 << 62))


class RemovableHandle:
    """Returned by :func:`register_post_backward_hook`; ``remove()`` unregisters the hook."""

    def __init__(self, device: Any, key: int, table: Any = None) -> None:
        self._device = weakref.ref(device)
        self._key = key
        self._table = _hooks if table is None else table

    def remove(self) -> None:
        dev = self._device()
        if dev is not None:
            self._table.get(dev, {}).pop(self._key, None)


def register_post_backward_hook(device: Any, hook: Callable[[Sequence[Any]], None]) -> RemovableHandle:
    """Call ``hook(leaves)`` after every backward pass on ``device`` (and after every replay
    of a graph that captured one), ``leaves`` being the leaf tensors the pass wrote gradients
    into. Hooks run in registration order; an exception propagates from ``backward()``."""
    key = next(_hook_ids)
    _hooks.setdefault(device, {})[key] = hook
    return RemovableHandle(device, key)


def _after_backward(device, leaves):
    if not _hooks.get(device):
        return
    pending = getattr(_state, "capture_backwards", None)
    if pending is not None and pending[0] is device:
        pending[1].append(leaves)  # run by graphs.graph after the block, by Graph.replay after each replay
        return
    run_post_backward_hooks(device, [leaves])


# -- gradient-ready hooks -----------------------------------------------------------------
# So that DistributedDataParallel can start reducing a bucket while the rest of the backward
# pass is still being recorded and run, the engine reports each leaf once the last node that
# contributes to its gradient has recorded its backward (inside the pass's batch: a hook that
# reads the gradient must ``Device.flush()`` first). Not inside a graph capture, where a host
# read would break the graph: there only the post-backward hooks run, after the block.
_ready_hooks: "weakref.WeakKeyDictionary[Any, dict[int, Callable[[Sequence[Any]], None]]]" = weakref.WeakKeyDictionary()


def register_gradient_ready_hook(device: Any, hook: Callable[[Sequence[Any]], None]) -> RemovableHandle:
    """Call ``hook(leaves)`` during every backward pass on ``device`` outside a graph capture,
    each time the gradients of ``leaves`` are complete (recorded, not yet submitted; every leaf
    of the pass is reported once, in the order their gradients finish). Hooks run in
    registration order; an exception propagates from ``backward()``."""
    key = next(_hook_ids)
    _ready_hooks.setdefault(device, {})[key] = hook
    return RemovableHandle(device, key, _ready_hooks)


def _ready_leaves(device, nodes) -> dict:
    """{node position: leaves whose last contribution that node records}, empty when no hook
    would see them (none registered, or inside a capture)."""
    if not _ready_hooks.get(device):
        return {}
    pending = getattr(_state, "capture_backwards", None)
    if pending is not None and pending[0] is device:
        return {}
    last: dict[int, tuple[int, Any]] = {}
    for i, node in enumerate(nodes):
        for t, e in zip(node.inputs, node.edges):
            if t is not None and e is None:
                last[id(t)] = (i, t)
    out: dict[int, list] = {}
    for i, t in last.values():
        out.setdefault(i, []).append(t)
    return out


def _gradients_ready(device, leaves) -> None:
    for hook in list(_ready_hooks.get(device, {}).values()):
        hook(leaves)


def run_post_backward_hooks(device: Any, passes: Sequence[Sequence[Any]]) -> None:
    """Run the device's post-backward hooks once per backward pass in ``passes``."""
    for leaves in passes:
        for hook in list(_hooks.get(device, {}).values()):
            hook(leaves)


@contextlib.contextmanager
def deferred_post_backward_hooks(device: Any) -> Iterator[list]:
    """Inside the block (a graph capture), backward passes on ``device`` in this thread keep
    their leaves in the yielded list instead of running the post-backward hooks."""
    prev = getattr(_state, "capture_backwards", None)
    pending: list = []
    _state.capture_backwards = (device, pending)
    try:
        yield pending
    finally:
        _state.capture_backwards = prev
