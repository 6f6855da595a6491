"""Functional GPU operations on arrays: GEMM, AdamW, gradient clipping.

Every function accepts NumPy arrays or device tensors. Device tensors stay on
the GPU and calls return without waiting; NumPy inputs are uploaded and
results come back as NumPy arrays.
"""

from __future__ import annotations

import math
from typing import Iterable, Optional, Sequence, Union

import numpy as np

from . import _core
from .device import Device, resolve_device
from .tensor import Tensor, _check_array, _check_flag, _result, empty, tensor


def _device_of(*xs, device=None):
    for x in xs:
        if isinstance(x, Tensor):
            return x.device
    return resolve_device(device)


_FLOAT32 = np.dtype(np.float32)
_HALF = np.dtype(np.float16)


def _as_tensor(x, name, device, ndim=None, dtype=_FLOAT32, written=False):
    """x as a Tensor the kernels can bind: NumPy arrays are uploaded, strided
    views read through a copy; a view that the op writes (``written``) must be
    bindable as it is."""
    if isinstance(x, Tensor):
        if x.device is not device:
            raise ValueError(f"{name} lives on {x.device!r}, but the operation runs on {device!r}")
        # Tensor dtypes are numpy's canonical dtype objects: identity first, it is the common case.
        if x.dtype is not dtype and x.dtype != dtype:
            raise TypeError(f"{name} must have dtype {np.dtype(dtype).name}, got {x.dtype.name}")
        if not x._bindable:
            if written:
                raise ValueError(
                    f"{name} is written in place, so it must be contiguous at an aligned offset; got a view with "
                    f"strides {x.stride()} at offset {x.storage_offset()} (use a contiguous tensor and copy_ it back)"
                )
            x = x.contiguous() if not x.is_contiguous() else x.clone()
        t = x
    else:
        t = tensor(_check_array(x, name, dtype), device)
    if ndim is not None and len(t.shape) != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {t.shape}")
    return t


def _check_real(fn, name, scalar):
    if isinstance(scalar, (bool, np.bool_)) or not isinstance(scalar, (int, float, np.integer, np.floating)):
        raise TypeError(f"{fn}: {name} must be a real number, got {type(scalar).__name__} {scalar!r}")
    return float(scalar)


def gemm(
    a: Union[Tensor, np.ndarray],
    b: Union[Tensor, np.ndarray],
    trans_a: bool = False,
    trans_b: bool = False,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Union[Tensor, np.ndarray, None] = None,
    device: Optional[Device] = None,
) -> Union[Tensor, np.ndarray]:
    """``out = alpha * op(a) @ op(b) + beta * out`` with ``op`` = transpose when
    ``trans_a`` / ``trans_b``. ``a``, ``b``: 2-D float32, or both float16 (then
    ``out`` is float16 too; products accumulate in float32). ``beta != 0`` needs
    ``out``. Returns ``out`` if given, a NumPy array if ``a`` and ``b`` are NumPy
    arrays, else a Tensor."""
    plain = type(alpha) is float and type(beta) is float and alpha == 1.0 and beta == 0.0
    if plain and out is None and device is None and type(trans_a) is bool and type(trans_b) is bool:
        tc = _core.gemm_fast(_core.GEMM_PLAIN, a, b, None, trans_a, trans_b)  # device tensors: one call (None: others)
        if tc is not None:
            return tc
    # `type(x) is` first: this runs on every call, and a GEMV's whole call is ~50 us.
    if type(trans_a) is not bool:
        trans_a = _check_flag("gemm", "trans_a", trans_a)
    if type(trans_b) is not bool:
        trans_b = _check_flag("gemm", "trans_b", trans_b)
    if type(alpha) is not float:
        alpha = _check_real("gemm", "alpha", alpha)
    if type(beta) is not float:
        beta = _check_real("gemm", "beta", beta)
    dev = _device_of(a, b, out, device=device)
    dtype = _HALF if getattr(a, "dtype", None) == _HALF else _FLOAT32  # b and out must match a
    ta = _as_tensor(a, "a", dev, ndim=2, dtype=dtype)
    tb = _as_tensor(b, "b", dev, ndim=2, dtype=dtype)
    m, k = ta.shape[::-1] if trans_a else ta.shape
    k2, n = tb.shape[::-1] if trans_b else tb.shape
    if k != k2:
        raise ValueError(f"gemm: inner dimensions differ: op(a) is {m}x{k}, op(b) is {k2}x{n}")
    if not (math.isfinite(alpha) and math.isfinite(beta)):
        raise ValueError(f"gemm: alpha and beta must be finite, got alpha={alpha}, beta={beta}")
    if beta != 0.0 and out is None:
        raise ValueError("gemm: beta != 0 accumulates into out, so out= must be given")
    if out is None:
        tc = _result((m, n), dev, dtype)  # not empty(): m and n come from checked shapes, and this runs per call
    else:
        if isinstance(out, Tensor):
            out_t = _as_tensor(out, "out", dev, ndim=2, dtype=dtype, written=True)
            if out_t._buf.shares_memory(ta._buf) or out_t._buf.shares_memory(tb._buf):
                raise ValueError(
                    "gemm: out must not alias a or b: it shares a device buffer with them (the kernel reads them while writing out)"
                )
        elif isinstance(out, np.ndarray) and any(
            isinstance(x, np.ndarray) and np.shares_memory(out, x) for x in (a, b)
        ):
            raise ValueError("gemm: out must not alias a or b")
        if isinstance(out, Tensor):
            tc = out_t
        else:
            _check_array(out, "out", dtype)
            tc = tensor(out, dev) if beta != 0.0 else empty(out.shape, dtype, dev)
        if tc.shape != (m, n):
            raise ValueError(f"gemm: out has shape {tc.shape}, expected ({m}, {n})")
    with dev._recording() as rec:
        _core.gemm(rec, ta._buf, tb._buf, tc._buf, m, n, k, trans_a, trans_b, alpha, beta, dtype is _HALF)
    tc._bump_version()
    if out is not None:
        if isinstance(out, np.ndarray):
            out[...] = tc.numpy()
        return out
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return tc.numpy()
    return tc


def _scratch(dev, key, floats):
    """Per-device reusable scratch tensors (grow-only)."""
    cache = dev._cache.scratch
    t = cache.get(key)
    if t is None or t._numel < floats:
        t = empty((max(int(floats), 1),), np.float32, dev)
        cache[key] = t
    return t


def _grad_list(grads):
    """Gradients to clip: a tensor that requires grad (a parameter) stands for
    its ``.grad`` (skipped while None); other tensors and arrays are gradients."""
    if isinstance(grads, (Tensor, np.ndarray)):
        grads = [grads]
    out = []
    for g in grads:
        if isinstance(g, Tensor) and g.requires_grad or not isinstance(g, (Tensor, np.ndarray)):
            g = getattr(g, "grad", None)
        if g is not None:
            out.append(g)
    return out


def record_grad_norm(rec, dev, grads, max_norm):
    """Record the global-norm reduction; returns the [norm, coefficient] tensor."""
    counts = [g._numel for g in grads]
    scratch = _scratch(dev, "norm_partials", dev._dev.grad_norm_scratch_floats(counts))
    norm_out = empty((2,), np.float32, dev)
    _core.grad_norm(rec, [g._buf for g in grads], counts, scratch._buf, norm_out._buf, float(max_norm))
    return norm_out


def clip_grad_norm_(
    parameters: Union[Tensor, np.ndarray, Iterable[Union[Tensor, np.ndarray]]],
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
) -> float:
    """Scale gradients in place so their global L2 norm is at most ``max_norm``;
    returns the norm before clipping (a float), as ``torch.nn.utils.clip_grad_norm_``:
    gradients are multiplied by ``min(max_norm / (norm + 1e-6), 1)``, so a
    non-finite norm makes them NaN (inf norm: 0 and NaN), unless
    ``error_if_nonfinite=True``, which raises ``RuntimeError`` and leaves them
    untouched. ``parameters``: tensors/arrays, or objects with ``.grad``. The
    norm is reduced on the GPU; only the 4-byte result is read back (with
    ``error_if_nonfinite=True`` before the scaling is recorded, so that takes a
    second submission)."""
    max_norm = float(max_norm)
    if float(norm_type) != 2.0:
        raise ValueError(f"clip_grad_norm_: only norm_type=2.0 is supported, got {norm_type}")
    if not max_norm >= 0.0 or not math.isfinite(max_norm):
        raise ValueError(f"clip_grad_norm_: max_norm must be finite and >= 0, got {max_norm}")
    grads = _grad_list(parameters)
    if not grads:
        return 0.0
    dev = _device_of(*grads)
    tgrads = [_as_tensor(g, f"parameters[{i}]", dev) for i, g in enumerate(grads)]
    with dev._recording() as rec:
        norm_out = record_grad_norm(rec, dev, tgrads, max_norm)
        if not error_if_nonfinite:
            for g in tgrads:
                _core.scale_by_clip(rec, g._buf, g._numel, norm_out._buf)
    norm = float(norm_out.numpy()[0])
    if error_if_nonfinite:
        # Checked before anything is scaled: torch leaves the gradients as they are.
        if not math.isfinite(norm):
            raise RuntimeError(
                f"The total norm of order 2.0 for gradients from `parameters` is non-finite ({norm}), so it cannot "
                "be clipped. To disable this error and scale the gradients by the non-finite norm anyway, set "
                "`error_if_nonfinite=False`"
            )
        with dev._recording() as rec:
            for g in tgrads:
                _core.scale_by_clip(rec, g._buf, g._numel, norm_out._buf)
    for g, t in zip(grads, tgrads):
        if isinstance(g, np.ndarray):
            g[...] = t.numpy()
    return norm


def check_adamw_hyperparameters(lr, betas, eps, weight_decay):
    lr, eps, weight_decay = float(lr), float(eps), float(weight_decay)
    if not lr >= 0.0:
        raise ValueError(f"Invalid learning rate: {lr} (lr must be >= 0)")
    if len(betas) != 2:
        raise ValueError(f"betas must be a pair, got {betas!r}")
    for i, b in enumerate(betas):
        if not 0.0 <= float(b) < 1.0:
            raise ValueError(f"Invalid beta parameter at index {i}: {b} (must be in [0, 1))")
    if not eps > 0.0:
        raise ValueError(f"Invalid epsilon value: {eps} (eps must be > 0)")
    if not weight_decay >= 0.0:
        raise ValueError(f"Invalid weight_decay value: {weight_decay} (must be >= 0)")
    return lr, (float(betas[0]), float(betas[1])), eps, weight_decay


def adamw_step(
    param: Union[Tensor, np.ndarray],
    grad: Union[Tensor, np.ndarray],
    exp_avg: Union[Tensor, np.ndarray],
    exp_avg_sq: Union[Tensor, np.ndarray],
    step: int,
    lr: float = 1e-3,
    betas: Sequence[float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 1e-2,
) -> Union[Tensor, np.ndarray]:
    """One AdamW update (torch semantics) of ``param``, ``exp_avg``, ``exp_avg_sq``
    in place; ``step`` is this update's 1-based count. NumPy arrays are updated
    in place through the GPU."""
    lr, betas, eps, weight_decay = check_adamw_hyperparameters(lr, betas, eps, weight_decay)
    if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)):
        raise TypeError(
            f"adamw_step: step must be an int (the 1-based count of this update), got {type(step).__name__} {step!r}"
        )
    step = int(step)
    if step < 1:
        raise ValueError(f"step must be >= 1 (the 1-based count of this update), got {step}")
    dev = _device_of(param, grad, exp_avg, exp_avg_sq)
    names = ("param", "grad", "exp_avg", "exp_avg_sq")
    ts = [_as_tensor(x, n, dev, written=n != "grad") for x, n in zip((param, grad, exp_avg, exp_avg_sq), names)]
    for t, n in zip(ts[1:], names[1:]):
        if t.shape != ts[0].shape:
            raise ValueError(f"{n} has shape {t.shape}, param has {ts[0].shape}")
    if any(ts[i]._buf.shares_memory(ts[j]._buf) for i in range(4) for j in range(i + 1, 4)):
        raise ValueError(
            "adamw_step: param, grad, exp_avg and exp_avg_sq must be four distinct buffers (views of one device buffer count as one)"
        )
    with dev._recording() as rec:
        _core.adamw(
            rec,
            ts[0]._buf,
            ts[1]._buf,
            ts[2]._buf,
            ts[3]._buf,
            ts[0]._numel,
            lr,
            betas[0],
            betas[1],
            eps,
            weight_decay,
            step,
        )
    for x, t in zip((param, exp_avg, exp_avg_sq), (ts[0], ts[2], ts[3])):
        t._bump_version()
        if isinstance(x, np.ndarray):
            x[...] = t.numpy()
    return param


def label_array(labels, classes=None, ignore_index=None):
    """Host class labels as a contiguous int32 array, checked for an integer
    dtype and int32 range and, when ``classes`` is given, for lying in
    ``[0, classes)`` or equalling ``ignore_index``."""
    labels = np.asarray(labels)
    if labels.dtype.kind not in "iu":
        raise TypeError(f"labels must be integers, got dtype {labels.dtype.name}")
    counted = labels if ignore_index is None else labels[labels != ignore_index]
    if counted.size:
        low, high = counted.min(), counted.max()
        if classes is not None and (low < 0 or high >= classes):
            also = "" if ignore_index is None else f" or equal ignore_index={ignore_index}"
            raise ValueError(f"labels must lie in [0, {classes}){also}, got range [{low}, {high}]")
        _check_int32(low, high, "labels")
    return np.ascontiguousarray(labels, dtype=np.int32)


def host_batch(a, name):
    """A host batch as the ndarray ``model(x)`` / a loss would accept: float32
    values, or integer ids/labels (as int32); the same TypeError otherwise (no
    silent cast from float64 or lists). ``name`` names it in the errors."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray or pywgtrain.Tensor, got {type(a).__name__}")
    if a.dtype.kind in "iu":
        if a.size:
            _check_int32(a.min(), a.max(), name)
        return np.ascontiguousarray(a, dtype=np.int32)
    if a.dtype.newbyteorder("=") != np.float32:  # '>f4' is float32 too: converted below, values kept
        raise TypeError(f"{name} must have dtype float32 (or hold integer ids), got {a.dtype.name}")
    return np.ascontiguousarray(a, dtype=np.float32)


def _check_int32(low, high, name):
    if low < np.iinfo(np.int32).min or high > np.iinfo(np.int32).max:
        raise ValueError(f"{name} holds integers outside the int32 range")
