"""Optimizers with PyTorch's semantics, updating parameters on the GPU."""
import numpy as np

from . import _core
from .ops import check_adamw_hyperparameters, record_grad_norm
from .tensor import zeros


class AdamW:
    """``torch.optim.AdamW`` (amsgrad=False): per-parameter step counts and
    moment estimates on the GPU.

    ``max_grad_norm``: when set, ``step()`` first computes the global gradient
    norm on the GPU and applies the clip coefficient inside the AdamW kernel
    (gradients are read once and left unscaled in memory); the norm is
    available, without a GPU wait until read, as ``last_grad_norm()``.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, max_grad_norm=None):
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
        self._captured = None  # [(param index, AdamW dispatch indices)] of a captured step

    def zero_grad(self, set_to_none=True):
        """The next backward overwrites gradients instead of accumulating (no GPU work)."""
        for p in self.params:
            p._grad_fresh = True

    def _state_for(self, i):
        st = self.state[i]
        if not st:
            p = self.params[i]
            st.update(step=0, exp_avg=zeros(p.shape, device=self.device), exp_avg_sq=zeros(p.shape, device=self.device))
        return st

    def step(self):
        """Apply one update to every parameter that has a gradient, in one submission."""
        live = [(i, p) for i, p in enumerate(self.params) if p.grad is not None]
        if not live:
            return
        lr, (b1, b2), eps, wd = check_adamw_hyperparameters(self.lr, self.betas, self.eps, self.weight_decay)
        with self.device._recording() as rec:
            clip = None
            if self.max_grad_norm is not None:
                self._norm = record_grad_norm(rec, self.device, [p.grad for _, p in live], self.max_grad_norm)
                clip = self._norm._buf
            captured = [] if rec.capturing else None
            for i, p in live:
                st = self._state_for(i)
                st["step"] += 1
                first = rec.captured
                _core.adamw(rec, p._buf, p.grad._buf, st["exp_avg"]._buf, st["exp_avg_sq"]._buf, p.size,
                            lr, b1, b2, eps, wd, st["step"], clip)
                if captured is not None:
                    captured.append((i, range(first, rec.captured)))
            if captured is not None:
                self._captured = captured

    def _advance_captured(self, graph):
        """Replay counterpart of step(): bump step counts and rewrite the
        captured AdamW uniforms (bias corrections, lr) for this step."""
        lr, (b1, b2), eps, wd = check_adamw_hyperparameters(self.lr, self.betas, self.eps, self.weight_decay)
        for i, dispatches in self._captured:
            st = self.state[i]
            st["step"] += 1
            for d in dispatches:
                graph.patch_adamw(d, lr, b1, b2, eps, wd, st["step"])

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
