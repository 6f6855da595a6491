"""Optimizers with PyTorch's semantics, updating parameters on the GPU."""
import numpy as np

from . import _core
from .ops import check_adamw_hyperparameters, record_grad_norm
from .tensor import Tensor, zeros


class _FlatArena:
    """One device buffer each for the parameters, gradients and both moments,
    every parameter at a storage-aligned offset (gaps stay zero, and AdamW
    maps zeros to zeros). Parameters are moved into it as views, so the whole
    update is one AdamW dispatch and the norm one reduction, whatever the
    number of tensors."""

    def __init__(self, params, device):
        align = max(device.limits["min_storage_buffer_offset_alignment"] // 4, 1)
        self.offsets, total = [], 0
        for p in params:
            self.offsets.append(total)
            total += -(-p.size // align) * align
        self.size = total
        # New wgpu buffers are zero-filled.
        self.buffers = {name: _core._Buffer(device._dev, total * 4, f"pywgtrain.{name}_arena")
                        for name in ("param", "grad", "exp_avg", "exp_avg_sq")}
        with device._recording() as rec:
            for p, off in zip(params, self.offsets):
                view = self.buffers["param"].view(off * 4, p.nbytes)
                rec.copy(p._buf, 0, view, 0, p.nbytes)
                p._buf = view
                grad_view = self.view("grad", p, off)
                if p.grad is not None:
                    rec.copy(p.grad._buf, 0, grad_view._buf, 0, p.nbytes)
                    p.grad = grad_view
                p._grad_home = grad_view
        self.params = list(params)
        self.device = device

    def view(self, name, p, off):
        return Tensor(self.buffers[name].view(off * 4, p.nbytes), p.shape, np.float32, p.device)

    def whole(self, name):
        return Tensor(self.buffers[name], (self.size,), np.float32, self.device)

    def holds(self, params):
        """Whether every parameter and its gradient still live in this arena."""
        return len(params) == len(self.params) and all(
            p is q and p._buf.shares_memory(self.buffers["param"]) and p.grad is p._grad_home
            for p, q in zip(params, self.params))


class AdamW:
    """``torch.optim.AdamW`` (amsgrad=False): per-parameter step counts and
    moment estimates on the GPU.

    ``max_grad_norm``: when set, ``step()`` first computes the global gradient
    norm on the GPU and applies the clip coefficient inside the AdamW kernel
    (gradients are read once and left unscaled in memory); the norm is
    available, without a GPU wait until read, as ``last_grad_norm()``.

    ``fused`` (default): the parameters move into one flat device buffer (the
    Parameter objects stay the same, their data becomes views), so a step in
    which every parameter has a gradient is one norm reduction and one AdamW
    dispatch instead of one per tensor. Other steps update tensor by tensor.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, max_grad_norm=None,
                 fused=True):
        self.params = list(params)
        if not self.params:
            raise ValueError("AdamW got an empty parameter list")
        self.lr, self.betas, self.eps, self.weight_decay = check_adamw_hyperparameters(lr, betas, eps, weight_decay)
        if max_grad_norm is not None and not float(max_grad_norm) >= 0.0:
            raise ValueError(f"max_grad_norm must be >= 0, got {max_grad_norm}")
        self.max_grad_norm = None if max_grad_norm is None else float(max_grad_norm)
        self.device = self.params[0].device
        self.state = [{} for _ in self.params]
        self._norm = None
        self._captured = None  # [(param indices, AdamW dispatch indices)] of a captured step
        # fused: parameters move into one flat arena (see _FlatArena); steps
        # where every parameter has a gradient then take one AdamW dispatch.
        self._arena = None
        if fused and all(hasattr(p, "_grad_home") and p.device is self.device for p in self.params):
            if len({id(p) for p in self.params}) != len(self.params):
                raise ValueError("AdamW got the same parameter twice")
            self._arena = _FlatArena(self.params, self.device)

    def zero_grad(self, set_to_none=True):
        """The next backward overwrites gradients instead of accumulating (no GPU work)."""
        for p in self.params:
            p._grad_fresh = True

    def _state_for(self, i):
        st = self.state[i]
        if not st:
            p = self.params[i]
            if self._arena is not None:
                off = self._arena.offsets[i]
                st.update(step=0, exp_avg=self._arena.view("exp_avg", p, off).zero_(),
                          exp_avg_sq=self._arena.view("exp_avg_sq", p, off).zero_())
            else:
                st.update(step=0, exp_avg=zeros(p.shape, device=self.device),
                          exp_avg_sq=zeros(p.shape, device=self.device))
        return st

    def _flat_step(self, live):
        """Whether this step can update the whole arena at once: every parameter
        has a gradient in the arena and all step counts agree."""
        if self._arena is None or len(live) != len(self.params) or not self._arena.holds(self.params):
            return False
        return len({self._state_for(i)["step"] for i in range(len(self.params))}) == 1

    def step(self):
        """Apply one update to every parameter that has a gradient, in one submission."""
        live = [(i, p) for i, p in enumerate(self.params) if p.grad is not None]
        if not live:
            return
        lr, (b1, b2), eps, wd = check_adamw_hyperparameters(self.lr, self.betas, self.eps, self.weight_decay)
        flat = self._flat_step(live)
        with self.device._recording() as rec:
            clip = None
            if self.max_grad_norm is not None:
                grads = [self._arena.whole("grad")] if flat else [p.grad for _, p in live]
                self._norm = record_grad_norm(rec, self.device, grads, self.max_grad_norm)
                clip = self._norm._buf
            captured = [] if rec.capturing else None
            if flat:
                for i in range(len(self.params)):
                    self.state[i]["step"] += 1
                first = rec.captured
                a = self._arena.buffers
                _core.adamw(rec, a["param"], a["grad"], a["exp_avg"], a["exp_avg_sq"], self._arena.size,
                            lr, b1, b2, eps, wd, self.state[0]["step"], clip)
                if captured is not None:
                    captured.append((list(range(len(self.params))), range(first, rec.captured)))
            else:
                for i, p in live:
                    st = self._state_for(i)
                    st["step"] += 1
                    first = rec.captured
                    _core.adamw(rec, p._buf, p.grad._buf, st["exp_avg"]._buf, st["exp_avg_sq"]._buf, p.size,
                                lr, b1, b2, eps, wd, st["step"], clip)
                    if captured is not None:
                        captured.append(([i], range(first, rec.captured)))
            if captured is not None:
                self._captured = captured

    def _advance_captured(self):
        """Replay counterpart of step(): bump the step counts and return this
        step's AdamW scalars for the captured update dispatches, in the form
        ``_Recorder.replay(adamw=...)`` takes."""
        lr, (b1, b2), eps, wd = check_adamw_hyperparameters(self.lr, self.betas, self.eps, self.weight_decay)
        updates = []
        for indices, dispatches in self._captured:
            for i in indices:
                self.state[i]["step"] += 1
            updates += [(d, self.state[indices[0]]["step"]) for d in dispatches]
        return (lr, b1, b2, eps, wd, updates)

    def last_grad_norm(self):
        """Global gradient norm computed by the last clipped ``step()`` (reads 4 bytes back)."""
        return None if self._norm is None else float(self._norm.numpy()[0])

    def state_dict(self):
        state = {}
        for i, st in enumerate(self.state):
            if st:
                state[i] = {"step": st["step"], "exp_avg": st["exp_avg"].numpy(), "exp_avg_sq": st["exp_avg_sq"].numpy()}
        group = {"lr": self.lr, "betas": self.betas, "eps": self.eps, "weight_decay": self.weight_decay,
                 "max_grad_norm": self.max_grad_norm, "params": list(range(len(self.params)))}
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, sd):
        group = sd["param_groups"][0]
        if len(group["params"]) != len(self.params):
            raise ValueError(f"optimizer state has {len(group['params'])} parameters, this optimizer {len(self.params)}")
        self.lr, self.betas, self.eps, self.weight_decay = check_adamw_hyperparameters(
            group["lr"], group["betas"], group["eps"], group["weight_decay"])
        self.max_grad_norm = group.get("max_grad_norm")
        self.state = [{} for _ in self.params]
        for key, st in sd["state"].items():
            i = int(key)
            p = self.params[i]
            for name in ("exp_avg", "exp_avg_sq"):
                if np.shape(st[name]) != p.shape:
                    raise ValueError(f"optimizer state {i}.{name} has shape {np.shape(st[name])}, parameter has {p.shape}")
            s = self._state_for(i)
            s["step"] = int(st["step"])
            s["exp_avg"].copy_(np.ascontiguousarray(st["exp_avg"], dtype=np.float32))
            s["exp_avg_sq"].copy_(np.ascontiguousarray(st["exp_avg_sq"], dtype=np.float32))
