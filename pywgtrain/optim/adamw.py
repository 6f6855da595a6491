"""AdamW with PyTorch's semantics, updating parameters on the GPU."""

from __future__ import annotations

import functools
import math
import threading
import weakref
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from .. import _core, graphs
from .._checked import CheckedState
from ..autograd import no_grad
from ..nn.modules.module import float32_values
from ..nn.parallel import register_flat_gradients
from ..ops import check_adamw_hyperparameters, record_grad_norm
from ..tensor import HalfShadow, Tensor, empty, zeros
from .optimizer import Optimizer, Params


def _half_view(arena_ref, i, shape, device):
    """Parameter i's float16 copy: its place in the arena's twin, or, once the optimizer is
    gone (the parameters live on), memory of its own."""
    arena = arena_ref()
    return empty(shape, np.float16, device) if arena is None else arena.half_view(i)


class _FlatArena:
    """One device buffer each for the parameters, gradients and both moments,
    every parameter at a storage-aligned offset (gaps stay zero, and AdamW
    maps zeros to zeros), parameters of a group next to each other.
    Parameters are moved into it with ``Tensor.move_storage_`` (views of them
    follow) and their gradients go to it through ``Tensor.grad_home``, so a group's update is one AdamW
    dispatch and the norm one reduction, whatever the number of tensors.

    Each parameter gets a float16 shadow (``tensor.HalfShadow``) in ``param_half``, a float16
    twin of ``param`` at the same offsets (aligned for 2-byte elements too), made when autocast
    first reads a shadow; from then on every flat step writes the twin in the update's dispatch."""

    def __init__(self, params, device):
        align = max(device.limits["min_storage_buffer_offset_alignment"] // 2, 1)  # elements of 2 or 4 bytes
        self.offsets, total = [], 0
        for p in params:
            self.offsets.append(total)
            total += -(-p.numel() // align) * align
        self.size = total
        self.buffers = {  # zeroed: moments start at 0, and so do the gaps between parameters
            name: _core._Buffer(device._dev, total * 4, f"pywgtrain.{name}_arena", zeroed=True)
            for name in ("param", "grad", "exp_avg", "exp_avg_sq")
        }
        # Each parameter's place and its gradient's: holds() checks that they are still in use.
        self.param_views = [self.view("param", p, off) for p, off in zip(params, self.offsets)]
        self.grad_views = [self.view("grad", p, off) for p, off in zip(params, self.offsets)]
        with no_grad():
            for p, home, grad_home in zip(params, self.param_views, self.grad_views):
                p.move_storage_(home)
                if p.grad is not None:
                    grad_home.copy_(p.grad)
                    p.grad = grad_home
                p.grad_home = grad_home
        self.params = list(params)
        self.device = device
        self._spans = {}
        self._half_lock = threading.Lock()
        me = weakref.ref(self)  # the shadows live with the parameters: no cycle through the arena
        self.shadows = [
            HalfShadow(p, functools.partial(_half_view, me, i, p.shape, device)) for i, p in enumerate(self.params)
        ]
        register_flat_gradients(self)  # DistributedDataParallel reduces runs of them as one span

    @property
    def has_half(self):
        """Whether the float16 twin exists (a shadow has been read): steps then write it."""
        return "param_half" in self.buffers

    def half_view(self, i):
        """Parameter i's place in the float16 twin, made (for every parameter) on first call: steps write
        the whole twin, gaps included, so its contents before the first step do not matter."""
        with self._half_lock:  # threads reading shadows at once must share one twin (steps write that one)
            if not self.has_half:
                self.buffers["param_half"] = _core._Buffer(
                    self.device._dev, self.size * 2, "pywgtrain.param_half_arena"
                )
        return self.view("param_half", self.params[i], self.offsets[i])

    def holds_grad(self, i):
        """Whether parameter i's gradient is the one this arena holds (its span is its .grad)."""
        return self.params[i].grad is self.grad_views[i]

    @staticmethod
    def _dtype(name):
        return np.dtype(np.float16 if name == "param_half" else np.float32)

    def view(self, name, p, off):
        dt = self._dtype(name)
        return Tensor(self.buffers[name].view(off * dt.itemsize, p.numel() * dt.itemsize), p.shape, dt, p.device)

    def span(self, name, first, last):
        """Parameters first..last-1 (and the gaps after them) as one flat tensor (made once: steps reuse it)."""
        key = (name, first, last)
        t = self._spans.get(key)
        if t is None:
            dt = self._dtype(name)
            start = self.offsets[first]
            end = self.offsets[last] if last < len(self.offsets) else self.size
            buf = self.buffers[name].view(start * dt.itemsize, (end - start) * dt.itemsize)
            t = self._spans[key] = Tensor(buf, (end - start,), dt, self.device)
        return t

    def half_span(self, first, last):
        """span("param_half", ...) when the twin exists, else None."""
        return self.span("param_half", first, last) if self.has_half else None

    def half_written(self, matched=None):
        """After a flat step that wrote the twin (and bumped the parameters' versions): every
        shadow still this arena's matches again. ``matched``: per shadow, whether it matched
        before the step; a step the GPU may skip keeps only those."""
        for i, (p, sh) in enumerate(zip(self.params, self.shadows)):
            if (matched is None or matched[i]) and p.half_shadow is sh:
                sh.written()

    def holds(self, params):
        """Whether every parameter and its gradient still live in this arena."""
        return len(params) == len(self.params) and all(
            p is q and p.untyped_storage().buf is home.untyped_storage().buf and p.grad is grad
            for p, q, home, grad in zip(params, self.params, self.param_views, self.grad_views)
        )


class AdamW(Optimizer):
    """``torch.optim.AdamW`` (amsgrad=False): per-parameter step counts and
    moment estimates on the GPU; parameter groups with their own ``lr``,
    ``betas``, ``eps``, ``weight_decay`` (e.g. no decay for biases and norms).

    ``max_grad_norm``: when set, ``step()`` first computes the global gradient
    norm on the GPU and applies the clip coefficient inside the AdamW kernel
    (gradients are read once and left unscaled in memory); the norm is
    available, without a GPU wait until read, as ``last_grad_norm()``.

    ``fused`` (default): the parameters move into one flat device buffer (the
    Parameter objects stay the same, their data becomes views), so a step in
    which every parameter has a gradient is one norm reduction and one AdamW
    dispatch per group instead of one per tensor. Other steps update tensor by
    tensor. Learning-rate schedulers change ``param_groups[i]["lr"]``.
    A fused AdamW also keeps each parameter's float16 copy for autocast
    (``Tensor.half_shadow``): made by a cast the first time autocast reads it,
    then written by those one-dispatch steps with the update, so autocast's
    products read it instead of casting every parameter every step (a
    parameter written any other way is cast afresh). ``fused=False`` keeps
    autocast's casts.

    ``capturable`` (torch's name): step counts and bias corrections live in
    device memory and advance on the GPU, and each ``step()`` writes the
    groups' current ``lr`` into a device buffer in stream order
    (:func:`pywgtrain.graphs.feed`), so ``step()`` can be captured in a
    :class:`pywgtrain.Graph` with forward and backward: each replay uses the
    current ``lr`` (betas, eps and weight_decay are fixed at capture). A
    ``GradScaler`` that found inf/NaN gradients skips such a step on the GPU
    (parameters, moments and step counts unchanged) without a readback. The
    bias corrections are float32 on the GPU (torch's capturable form does the
    same) instead of double on the host, and a step is one more dispatch per
    group, so this is not the default. ``state_dict()`` reads the step counts back
    (``state[i]["step"]`` counts the calls that reached parameter i, skipped ones included).
    """

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        betas: Sequence[float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        max_grad_norm: Optional[float] = None,
        fused: bool = True,
        capturable: bool = False,
    ) -> None:
        check_adamw_hyperparameters(lr, betas, eps, weight_decay)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        for g in self.param_groups:
            check_adamw_hyperparameters(g["lr"], g["betas"], g["eps"], g["weight_decay"])
        if max_grad_norm is not None and not float(max_grad_norm) >= 0.0:
            raise ValueError(f"max_grad_norm must be >= 0, got {max_grad_norm}")
        self.max_grad_norm = None if max_grad_norm is None else float(max_grad_norm)
        self.state: list[dict[str, Any]] = [{} for _ in self.params]
        self._norm: Optional[Tensor] = None
        self._arena: Any = None  # a _FlatArena when the step is fused
        if fused and all(p.device is self.device for p in self.params):
            self._arena = _FlatArena(self.params, self.device)
        self.capturable = bool(capturable)
        # Which step() calls touched each parameter, as a hash chain: equal chains mean equal
        # step counts on the GPU whichever of those calls a GradScaler skipped.
        self._touched = [0] * len(self.params)
        self._calls = 0
        if self.capturable:
            if any(p.device is not self.device for p in self.params):
                raise ValueError(f"{type(self).__name__}(capturable=True): every parameter must live on one device")
            # Per parameter: step, bits of 1 - beta1^step and 1 - beta2^step, then coefficients
            # the GPU derives from them each step (optim.wgsl).
            self._steps = zeros((len(self.params), _core.ADAM_SLOT_WORDS), dtype=np.int32, device=self.device)
            self._lrs = zeros((len(self.param_groups),), device=self.device)
            self._no_inf = zeros((1,), device=self.device)

    def _state_for(self, i):
        st = self.state[i]
        if not st:
            p = self.params[i]
            if self._arena is not None:
                off = self._arena.offsets[i]
                st.update(
                    step=0,
                    exp_avg=self._arena.view("exp_avg", p, off).zero_(),
                    exp_avg_sq=self._arena.view("exp_avg_sq", p, off).zero_(),
                )
            else:
                st.update(
                    step=0, exp_avg=zeros(p.shape, device=self.device), exp_avg_sq=zeros(p.shape, device=self.device)
                )
        return st

    def _flat_step(self, live):
        """Whether this step can update the arena group by group: every
        parameter has a gradient in the arena and all step counts agree."""
        if self._arena is None or len(live) != len(self.params) or not self._arena.holds(self.params):
            return False
        steps = {self._state_for(i)["step"] for i in range(len(self.params))}
        return len(set(self._touched) if self.capturable else steps) == 1

    # Whether weight_decay is an L2 term added to the gradient (Adam) rather than a decoupled decay.
    _l2_decay = False

    def _hyper(self, group):
        """(lr, beta1, beta2, eps, decoupled weight decay, L2 weight decay) of a group."""
        lr, (b1, b2), eps, wd = check_adamw_hyperparameters(
            group["lr"], group["betas"], group["eps"], group["weight_decay"]
        )
        return (lr, b1, b2, eps, 0.0, wd) if self._l2_decay else (lr, b1, b2, eps, wd, 0.0)

    def _current_lrs(self):
        return np.array([self._hyper(g)[0] for g in self.param_groups], dtype=np.float32)

    def step(self, *, found_inf: Optional[Tensor] = None) -> None:
        """Apply one update to every parameter that has a gradient, in one submission.
        ``found_inf`` (capturable only; GradScaler passes it): a one-element tensor whose
        nonzero value skips the step on the GPU."""
        if found_inf is not None and not self.capturable:
            raise ValueError(f"{type(self).__name__}.step(found_inf=...) needs capturable=True")
        if found_inf is not None and (
            found_inf.device is not self.device or found_inf.shape != (1,) or found_inf.dtype != np.float32
        ):
            raise ValueError(
                f"{type(self).__name__}.step: found_inf must be a float32 tensor of shape (1,) on {self.device!r}, "
                f"got {found_inf.dtype} {found_inf.shape} on {found_inf.device!r}"
            )
        if self.capturable:
            self._current_lrs()  # a bad lr raises here, before anything changes
        live: list[tuple[int, Any]] = [(i, p) for i, p in enumerate(self.params) if p.grad is not None]
        if not live:
            return
        flat = self._flat_step(live)
        # A capturable step may be skipped on the GPU: then only copies that matched still match.
        was_current = [sh.current() for sh in self._arena.shadows] if flat and self.capturable else None
        self._calls += 1
        for i, _ in live:
            self._touched[i] = hash((self._touched[i], self._calls))
        with self.device._recording() as rec:
            clip = None
            if self.max_grad_norm is not None:
                grads = [self._arena.span("grad", 0, len(self.params))] if flat else [p.grad for _, p in live]
                self._norm = record_grad_norm(rec, self.device, grads, self.max_grad_norm)
                clip = self._norm._buf
            if self.capturable:
                self._device_step(rec, live, flat, clip, self._no_inf if found_inf is None else found_inf)
            elif flat:
                for i in range(len(self.params)):
                    self.state[i]["step"] += 1
                step = self.state[0]["step"]
                for gi, (first, last) in enumerate(self._group_ranges):
                    if first == last:
                        continue
                    lr, b1, b2, eps, wd, l2 = self._hyper(self.param_groups[gi])
                    t = {
                        name: self._arena.span(name, first, last) for name in ("param", "grad", "exp_avg", "exp_avg_sq")
                    }
                    half = self._arena.half_span(first, last)
                    _core.adamw(
                        rec,
                        t["param"]._buf,
                        t["grad"]._buf,
                        t["exp_avg"]._buf,
                        t["exp_avg_sq"]._buf,
                        t["param"]._numel,
                        lr,
                        b1,
                        b2,
                        eps,
                        wd,
                        step,
                        clip,
                        None if half is None else half._buf,
                        l2,
                    )
            else:
                for i, p in live:
                    gi = self._group_of[i]
                    lr, b1, b2, eps, wd, l2 = self._hyper(self.param_groups[gi])
                    st = self._state_for(i)
                    st["step"] += 1
                    _core.adamw(
                        rec,
                        p._buf,
                        p.grad._buf,
                        st["exp_avg"]._buf,
                        st["exp_avg_sq"]._buf,
                        p._numel,
                        lr,
                        b1,
                        b2,
                        eps,
                        wd,
                        st["step"],
                        clip,
                        l2=l2,
                    )
        for _, p in live:
            p._bump_version()  # written in place: a graph that saved the old values refuses to backward
        if flat and self._arena.has_half:  # the float16 twin was written with the parameters
            self._arena.half_written(was_current)

    def _device_step(self, rec, live, flat, clip, found_inf):
        """The capturable step: this step's lrs fed to the GPU, then per group (or per
        tensor) the step counts advanced and the update, both skipped there on found_inf."""
        graphs.feed(rec, self._lrs, self._current_lrs)
        if flat:
            for i in range(len(self.params)):
                self.state[i]["step"] += 1
            work = [
                (
                    gi,
                    first,
                    last,
                    [self._arena.span(n, first, last) for n in ("param", "grad", "exp_avg", "exp_avg_sq")]
                    + [self._arena.half_span(first, last)],
                )
                for gi, (first, last) in enumerate(self._group_ranges)
                if first != last
            ]
        else:
            work = []
            for i, p in live:
                st = self._state_for(i)
                st["step"] += 1
                work.append((self._group_of[i], i, i + 1, [p, p.grad, st["exp_avg"], st["exp_avg_sq"], None]))
        for gi, first, last, (param, grad, m, v, half) in work:
            _, b1, b2, eps, wd, l2 = self._hyper(self.param_groups[gi])
            _core.adamw_prepare(
                rec, self._steps._buf, first, last - first, found_inf._buf, b1, b2, eps, wd, self._lrs._buf, gi
            )
            _core.adamw_device(
                rec,
                param._buf,
                grad._buf,
                m._buf,
                v._buf,
                param._numel,
                b1,
                b2,
                eps,
                wd,
                self._steps._buf,
                first,
                found_inf._buf,
                clip,
                None if half is None else half._buf,
                l2,
            )

    def _device_steps(self) -> list[int]:
        """Each parameter's step count on the GPU (a readback)."""
        return [int(s) for s in self._steps.numpy()[:, 0]]

    def last_grad_norm(self) -> Optional[float]:
        """Global gradient norm computed by the last clipped ``step()`` (reads 4 bytes back)."""
        return None if self._norm is None else float(self._norm.numpy()[0])

    def state_dict(self) -> dict[str, Any]:
        state = {}
        steps = self._device_steps() if self.capturable else [st.get("step") for st in self.state]
        for i, st in enumerate(self.state):
            if st:
                state[i] = {
                    "step": steps[i],
                    "exp_avg": st["exp_avg"].numpy(),
                    "exp_avg_sq": st["exp_avg_sq"].numpy(),
                }
        groups = self._saved_groups()
        for g in groups:
            g["max_grad_norm"] = self.max_grad_norm
        return {"state": state, "param_groups": groups}

    def check_state_dict(self, sd: Mapping[str, Any]) -> CheckedState:
        """Validate a ``state_dict()`` of this optimizer without changing anything; returns it
        normalized (float32 moments, float hyperparameters) as a ``CheckedState`` that this
        optimizer's ``load_state_dict`` applies. Checks the
        group count and sizes, every group's hyperparameters (finite lr >= 0, betas in [0, 1),
        finite eps > 0, finite weight_decay >= 0, max_grad_norm None or finite >= 0 and the same
        in every group, no unknown options), each state's parameter index, step (an int >= 0)
        and moments (float32-compatible, the parameter's shape, exp_avg_sq >= 0)."""
        groups, states = self._check_frame(sd, ("max_grad_norm",))
        out_groups, norms = [], set()
        for where, saved in groups:
            betas = saved["betas"]
            if not isinstance(betas, (list, tuple)) or len(betas) != 2:
                raise ValueError(f"{where}: betas must be a pair of numbers, got {betas!r}")
            hyper = {k: saved[k] for k in ("lr", "eps", "weight_decay")} | {"beta1": betas[0], "beta2": betas[1]}
            if "initial_lr" in saved:
                hyper["initial_lr"] = saved["initial_lr"]
            for k, v in hyper.items():
                if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                    raise ValueError(f"{where}: {k} must be a number, got {type(v).__name__} {v!r}")
                if not math.isfinite(v):
                    raise ValueError(f"{where}: {k} must be finite, got {v!r}")
            try:
                lr, betas, eps, wd = check_adamw_hyperparameters(
                    hyper["lr"], betas, hyper["eps"], hyper["weight_decay"]
                )
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
            group = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": wd}
            if "initial_lr" in saved:
                group["initial_lr"] = float(saved["initial_lr"])
            out_groups.append(group)
            norm = saved.get("max_grad_norm")
            if norm is not None and (
                isinstance(norm, bool)
                or not isinstance(norm, (int, float, np.integer, np.floating))
                or not (math.isfinite(norm) and norm >= 0)
            ):
                raise ValueError(f"{where}: max_grad_norm must be None or a finite number >= 0, got {norm!r}")
            norms.add(None if norm is None else float(norm))
        if len(norms) > 1:
            raise ValueError(f"optimizer state: the groups disagree on max_grad_norm ({sorted(norms, key=str)})")
        out_state = {}
        for i, st in states:
            if not isinstance(st, Mapping) or set(st) != {"step", "exp_avg", "exp_avg_sq"}:
                got = sorted(st) if isinstance(st, Mapping) else type(st).__name__
                raise ValueError(f"optimizer state {i} must hold step, exp_avg and exp_avg_sq, got {got}")
            step = st["step"]
            if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)) or not 0 <= step < 2**63:
                raise ValueError(f"optimizer state {i}: step must be an int >= 0, got {type(step).__name__} {step!r}")
            p = self.params[i]
            m, v = (float32_values(st[k], p.shape, f"optimizer state {i}.{k}") for k in ("exp_avg", "exp_avg_sq"))
            if (v < 0).any():
                raise ValueError(f"optimizer state {i}.exp_avg_sq holds negative values (min {v.min()!r})")
            out_state[i] = {"step": int(step), "exp_avg": m, "exp_avg_sq": v}
        return CheckedState(self, {"state": out_state, "param_groups": out_groups, "max_grad_norm": norms.pop()})

    def load_state_dict(self, sd: Union[Mapping[str, Any], CheckedState]) -> None:
        """Restore a ``state_dict()``; everything is checked first (``check_state_dict``), so a bad
        one raises with the optimizer unchanged. A ``CheckedState`` from this optimizer's
        ``check_state_dict`` is applied as it is."""
        checked = (sd if isinstance(sd, CheckedState) else self.check_state_dict(sd)).value_for(self)
        for saved, mine in zip(checked["param_groups"], self.param_groups):
            mine.update(saved)
        self.max_grad_norm = checked["max_grad_norm"]
        self.state = [{} for _ in self.params]
        steps = np.zeros((len(self.params), _core.ADAM_SLOT_WORDS), dtype=np.int32)
        for i, st in checked["state"].items():
            s = self._state_for(i)
            s["step"] = st["step"]
            s["exp_avg"].copy_(st["exp_avg"])
            s["exp_avg_sq"].copy_(st["exp_avg_sq"])
            steps[i, 0] = st["step"]
        self._touched = [hash(("loaded", int(row[0]))) for row in steps]
        if self.capturable:
            # The bias corrections of the loaded counts, from the float32 betas the GPU uses.
            for gi, (first, last) in enumerate(self._group_ranges):
                _, b1, b2, *_ = self._hyper(self.param_groups[gi])
                for col, beta in ((1, b1), (2, b2)):
                    bc = 1.0 - np.float64(np.float32(beta)) ** steps[first:last, 0].astype(np.float64)
                    steps[first:last, col] = bc.astype(np.float32).view(np.int32)
            self._steps.copy_(steps)


class Adam(AdamW):
    """``torch.optim.Adam`` (amsgrad=False): AdamW's machinery (fused flat steps,
    ``max_grad_norm``, ``capturable``, GradScaler, state_dict) with torch's Adam update:
    ``weight_decay`` (default 0) is an L2 term added to the gradient before the moments,
    not a decoupled decay."""

    _l2_decay = True

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        betas: Sequence[float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        max_grad_norm: Optional[float] = None,
        fused: bool = True,
        capturable: bool = False,
    ) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, max_grad_norm, fused, capturable)
