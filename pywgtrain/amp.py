"""Mixed-precision training helpers: :class:`GradScaler` (``torch.amp.GradScaler``)."""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Union

import numpy as np

from . import _core
from ._checked import CheckedState
from .device import Device, resolve_device
from .tensor import Tensor, tensor

_READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"


class GradScaler:
    """``torch.amp.GradScaler``: multiplies the loss by a scale so that small
    float16 gradients do not flush to zero, unscales the gradients before the
    optimizer step, skips steps whose gradients hold inf/NaN and adapts the
    scale (times ``backoff_factor`` after a skipped step, times
    ``growth_factor`` after ``growth_interval`` clean ones in a row)::

        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)            # optional: to clip unscaled gradients
        scaler.step(optimizer)
        scaler.update()

    The scale, the growth tracker and the inf/NaN flags live on the GPU: with
    an ``AdamW(capturable=True)`` optimizer nothing is read back per step (the
    optimizer skips on the GPU), so the whole sequence can run in a captured
    graph or a ``Trainer``; with another optimizer ``step`` reads the flag
    back and calls ``optimizer.step()`` only when it is clear, as torch does.
    ``get_scale()`` and ``state_dict()`` read back. ``enabled=False`` passes
    everything through."""

    def __init__(
        self,
        device: Optional[Device] = None,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ) -> None:
        self._device = device
        self._enabled = bool(enabled)
        self._check_factors(init_scale, growth_factor, backoff_factor, growth_interval, 0)
        self._init_scale = float(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._init_growth_tracker = 0
        self._state: Optional[Tensor] = None  # [scale, growth tracker, found inf since update, 0]
        self._found: dict[int, Tensor] = {}  # per optimizer, kept: captured graphs bind it
        self._stage: dict[int, str] = {}

    @staticmethod
    def _check_factors(scale, growth_factor, backoff_factor, growth_interval, tracker):
        def number(name, v):
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v):
                raise ValueError(f"GradScaler: {name} must be a finite number, got {v!r}")

        for name, v in (("scale", scale), ("growth_factor", growth_factor), ("backoff_factor", backoff_factor)):
            number(name, v)
        if not scale > 0:
            raise ValueError(f"GradScaler: scale must be > 0, got {scale!r}")
        if not growth_factor > 1.0:
            raise ValueError(f"GradScaler: growth_factor must be > 1.0, got {growth_factor!r}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"GradScaler: backoff_factor must be in (0, 1), got {backoff_factor!r}")
        for name, v, low in (("growth_interval", growth_interval, 1), ("growth tracker", tracker, 0)):
            # The GPU counts in float32: exact up to 2**24.
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not low <= v <= 2**24:
                raise ValueError(f"GradScaler: {name} must be an int in [{low}, 2**24], got {v!r}")

    def is_enabled(self) -> bool:
        return self._enabled

    def _lazy_init(self, device: Device) -> Tensor:
        if self._state is None:
            if self._device is not None and resolve_device(self._device) is not device:
                raise ValueError(f"GradScaler: made for {resolve_device(self._device)!r}, used on {device!r}")
            values = [self._init_scale, self._init_growth_tracker, 0.0, 0.0]
            self._state = tensor(np.array(values, dtype=np.float32), device=device)
        return self._state

    def _scale_tensor(self, ndim: int) -> Tensor:
        """The scale as a tensor over the state's first element (0-d for a 0-d operand)."""
        st = self._state
        assert st is not None
        return Tensor(st._buf.view(0, 4), () if ndim == 0 else (1,), np.float32, st.device)

    def scale(self, outputs: Any) -> Any:
        """``outputs`` (a tensor, or lists/tuples of them) times the scale, recorded
        (differentiable: the gradients come out scaled)."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, Tensor):
            if outputs.dtype not in (np.float32, np.float16):
                raise TypeError(f"GradScaler.scale: outputs must be floating point, got {outputs.dtype}")
            self._lazy_init(outputs.device)
            return outputs * self._scale_tensor(outputs.ndim)
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        raise TypeError(f"GradScaler.scale: outputs must be a Tensor or a list/tuple of them, got {type(outputs)}")

    def _check_scale(self, funcname: str) -> Tensor:
        if self._state is None:
            raise RuntimeError(
                f"Attempted {funcname} but the scale is not initialized. This may indicate your script "
                "did not use scaler.scale(loss or outputs) earlier in the iteration."
            )
        return self._state

    def unscale_(self, optimizer: Any) -> None:
        """Divide ``optimizer``'s gradients by the scale in place (one kernel over
        its flat gradient arena) and note on the GPU whether any is inf/NaN."""
        if not self._enabled:
            return
        state = self._check_scale("unscale_")
        key = id(optimizer)
        stage = self._stage.get(key, _READY)
        if stage == _UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if stage == _STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        grads = [p.grad for p in optimizer.params if p.grad is not None]
        arena = getattr(optimizer, "_arena", None)
        if arena is not None and len(grads) == len(optimizer.params) and arena.holds(optimizer.params):
            grads = [arena.span("grad", 0, len(optimizer.params))]
        for g in grads:
            if g.dtype != np.float32 or g.device is not state.device:
                raise ValueError(
                    f"GradScaler.unscale_: gradients must be float32 on {state.device!r}, got {g.dtype} on {g.device!r}"
                )
        found = self._found.get(key)
        if found is None:
            found = self._found[key] = tensor(np.zeros(1, np.float32), device=state.device)
        with state.device._recording() as rec:
            if not grads:  # nothing to check: the flag is still reset
                _core.scaler_unscale(rec, state._buf, 0, state._buf, found._buf, True)
            for i, g in enumerate(grads):
                _core.scaler_unscale(rec, g._buf, g._numel, state._buf, found._buf, i == 0)
        for g in grads:
            g._bump_version()
        self._stage[key] = _UNSCALED

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """Unscale (unless ``unscale_`` already did) and step ``optimizer`` unless
        its gradients held inf/NaN: on the GPU for a capturable AdamW, else by
        reading the flag back."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._check_scale("step")
        key = id(optimizer)
        if self._stage.get(key, _READY) == _STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if self._stage.get(key, _READY) == _READY:
            self.unscale_(optimizer)
        found = self._found[key]
        if getattr(optimizer, "capturable", False):
            ret = optimizer.step(*args, found_inf=found, **kwargs)
        else:
            ret = None if float(found.numpy()[0]) else optimizer.step(*args, **kwargs)
        self._stage[key] = _STEPPED
        return ret

    def update(self, new_scale: Union[float, None] = None) -> None:
        """Back off after a step that found inf/NaN, grow after ``growth_interval``
        clean ones (on the GPU), or set ``new_scale``; a new iteration starts."""
        if not self._enabled:
            return
        state = self._check_scale("update")
        if new_scale is not None:
            if isinstance(new_scale, bool) or not isinstance(new_scale, (int, float, np.integer, np.floating)):
                raise TypeError(f"GradScaler.update: new_scale must be a number, got {type(new_scale).__name__}")
            if not (math.isfinite(new_scale) and new_scale > 0):
                raise ValueError(f"GradScaler.update: new_scale must be finite and > 0, got {new_scale!r}")
        elif not any(s != _READY for s in self._stage.values()):
            raise RuntimeError("No inf checks were recorded prior to update.")
        with state.device._recording() as rec:
            _core.scaler_update(
                rec, state._buf, self._growth_factor, self._backoff_factor, self._growth_interval, new_scale
            )
        self._stage.clear()

    def get_scale(self) -> float:
        """The current scale (reads it back); 1.0 when disabled."""
        if not self._enabled:
            return 1.0
        return self._init_scale if self._state is None else float(self._state.numpy()[0])

    def _get_growth_tracker(self) -> int:
        return self._init_growth_tracker if self._state is None else int(self._state.numpy()[1])

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._check_factors(1.0, new_factor, self._backoff_factor, self._growth_interval, 0)
        self._growth_factor = float(new_factor)

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._check_factors(1.0, self._growth_factor, new_factor, self._growth_interval, 0)
        self._backoff_factor = float(new_factor)

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._check_factors(1.0, self._growth_factor, self._backoff_factor, new_interval, 0)
        self._growth_interval = int(new_interval)

    def state_dict(self) -> dict[str, Any]:
        """torch's keys: ``scale``, ``growth_factor``, ``backoff_factor``,
        ``growth_interval``, ``_growth_tracker`` (reads back); {} when disabled."""
        if not self._enabled:
            return {}
        return {
            "scale": self.get_scale(),
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": self._get_growth_tracker(),
        }

    def load_state_dict(self, state_dict: Union[Mapping[str, Any], CheckedState]) -> None:
        """Restore a ``state_dict()``, checked first (a bad one raises with the scaler unchanged);
        a ``CheckedState`` from this scaler's ``check_state_dict`` is applied as it is."""
        if not self._enabled:
            return
        if isinstance(state_dict, Mapping) and len(state_dict) == 0:
            raise RuntimeError(
                "The source state dict is empty, possibly because it was saved from a scaler that was not enabled."
            )
        checked = state_dict if isinstance(state_dict, CheckedState) else self.check_state_dict(state_dict)
        scale, self._growth_factor, self._backoff_factor, self._growth_interval, tracker = checked.value_for(self)
        self._init_scale, self._init_growth_tracker = scale, tracker
        if self._state is not None:  # written in place: captured graphs bind this buffer
            self._state.copy_(np.array([scale, tracker, 0.0, 0.0], dtype=np.float32))

    _KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")

    def check_state_dict(self, state_dict: Mapping[str, Any]) -> CheckedState:
        """Validate a ``state_dict()`` without changing anything: torch's five keys,
        a finite scale > 0, growth_factor > 1, backoff_factor in (0, 1), ints
        growth_interval >= 1 and 0 <= _growth_tracker < growth_interval. Returns a
        ``CheckedState`` that this scaler's ``load_state_dict`` applies."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"GradScaler state must be a mapping, got {type(state_dict).__name__}")
        if set(state_dict) != set(self._KEYS):
            raise ValueError(f"GradScaler state: expected the keys {list(self._KEYS)}, got {sorted(state_dict)}")
        scale, gf, bf, gi, tracker = (state_dict[k] for k in self._KEYS)
        self._check_factors(scale, gf, bf, gi, tracker)
        if tracker >= gi:
            raise ValueError(f"GradScaler state: _growth_tracker {tracker} must be < growth_interval {gi}")
        return CheckedState(self, (float(scale), float(gf), float(bf), int(gi), int(tracker)))
