"""Training loop pieces: one-submission training steps and checkpoints. The
digits demo behind ``pywgtrain train`` is in ``pywgtrain.cli.demo``."""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from typing import Any, Callable, Optional, Union

import numpy as np

from . import nn, random
from .autocast import autocast as mixed_precision
from .device import Device
from .amp import GradScaler
from .graphs import CaptureError, Graph, graph
from .nn.modules.module import PLAIN_TYPES, modules_version
from .serialization import read_safetensors, write_safetensors
from .ops import host_batch
from .optim import AdamW
from .tensor import Tensor, empty, tensor


def _param_state(p):
    """Per parameter and step: whether it requires grad, and its storage (compared by identity)."""
    return p.requires_grad, p.untyped_storage()


class Trainer:
    """Runs forward, loss, backward and ``optimizer.step()`` per call. The loss
    stays on the GPU until ``Loss.item()`` is called, so the GPU never waits
    for Python between steps.

    With ``capture=True`` (default) the forward and backward of the second
    step are captured (:class:`pywgtrain.Graph`) and later steps with the same
    batch shapes replay them: the recorded dispatches are re-encoded in one
    call, without Python-side model code, kernel lookups or bind-group
    creation; the batch (a device tensor as it is, a NumPy batch uploaded for
    that step only) and the loss output are bound per step. The optimizer
    steps as in any loop, so learning-rate changes reach every step. Results
    are identical to uncaptured steps, and the caller's tensors are never
    written.

    A captured step depends on more than the batch shapes: every module's
    ``training`` flag (dropout) and other plain attributes (bool, int, float,
    str, None: ``Dropout.p``, ``Linear.activation``), which parameters require
    grad, the module tree and parameter buffers, the optimizer's group sizes.
    Each step compares a signature of these with the captured one; after a
    change it runs eagerly once, then captures again, so replays compute what
    an eager loop would. A step whose forward, loss or backward reads GPU
    data on the host (``.item()``, ``.numpy()``) or otherwise submits mid-step
    cannot be captured: that step finishes eagerly, the Trainer stops
    capturing and warns once, naming the read. Python state a forward
    consults without such a read (a host counter, a global) is not seen:
    keep forwards free of it, or pass ``capture=False``.

    Steps stream to the GPU like any operation (submitted in chunks of up to
    ``Device.BATCH_SUBMIT_COMMANDS`` dispatches and on every host read);
    ``steps_per_submit``: at least every this many steps, the Trainer submits
    what is recorded (``flush()`` does it explicitly).

    ``autocast=True``: the forward and the loss run inside
    :class:`pywgtrain.autocast` (float16 products, float32 reductions and
    losses); backward and the optimizer step stay outside, as in torch's recipe.

    ``scaler``: a :class:`pywgtrain.amp.GradScaler`; each step then runs
    ``scaler.scale(loss).backward()`` (captured with forward and backward),
    ``scaler.step(optimizer)`` and ``scaler.update()``, with no readback: the
    optimizer must be ``AdamW(capturable=True)``, which skips on the GPU.
    Checkpoints hold the scaler's state. The returned loss is unscaled.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: AdamW,
        loss_fn: Callable[[Tensor, Any], Tensor],
        capture: bool = True,
        steps_per_submit: int = 1,
        autocast: bool = False,
        scaler: Optional[GradScaler] = None,
    ) -> None:
        if isinstance(steps_per_submit, bool) or not isinstance(steps_per_submit, int) or steps_per_submit < 1:
            raise ValueError(f"steps_per_submit must be an int >= 1, got {steps_per_submit!r}")
        if not isinstance(autocast, bool):
            raise TypeError(f"autocast must be a bool, got {type(autocast).__name__}")
        if scaler is not None and not isinstance(scaler, GradScaler):
            raise TypeError(f"Trainer: scaler must be a pywgtrain.amp.GradScaler, got {type(scaler).__name__}")
        if scaler is not None and scaler.is_enabled() and not getattr(optimizer, "capturable", False):
            raise ValueError(
                "Trainer(scaler=...): the optimizer must be AdamW(capturable=True), which skips steps "
                "with inf/NaN gradients on the GPU (otherwise each step would read the flag back)"
            )
        self.scaler = scaler
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        device = model.device
        if device is None:
            raise ValueError("Trainer: the model has no parameters and no device")
        self.device: Device = device
        self.step_count = 0
        self.capture = capture
        self.steps_per_submit = steps_per_submit
        self.autocast = autocast
        if autocast:
            with mixed_precision(device):  # refuses an adapter without shader-f16 now, not at the first step
                pass
        self._graph: Optional[dict[str, Any]] = None
        # batch shapes and signature of the last eager step (capture follows one)
        self._eager_key: Optional[tuple[Any, ...]] = None
        self._walked: Any = None  # (modules_version, model and loss ids), module signature, parameters
        self._unsubmitted = 0  # steps since the last flush()
        # (x's shape and dtype, _signature()) of the last forward and its output's shape: the input
        # a host target is checked against before the next step with that key records anything
        self._last_output: tuple[Any, Any] = (None, None)

    @property
    def graph(self) -> Optional[Graph]:
        """The captured step (forward and backward) that replays use; None before capture."""
        return None if self._graph is None else self._graph["graph"]

    def _batch_arrays(self, x, y):
        """Host batches as contiguous arrays of the kernels' dtypes; device tensors as they are.

        Host inputs are checked as ``model(x)`` / the loss function check them: x must be a
        float32 array (no silent cast from float64) or hold integer ids, y what the loss's
        ``check_target`` accepts (every loss module in ``pywgtrain.nn`` has it; for another loss
        function, as x). Checks that need the model's output (the range of class labels:
        out-of-range labels would reach the kernels unchecked and turn the loss into NaN while
        the weights kept updating) follow in ``step`` (a device-side target is not checked:
        that would take a GPU round trip)."""
        if isinstance(x, Tensor):
            if x.device is not self.device:
                raise ValueError(f"x lives on {x.device!r}, the model on {self.device!r}")
        else:
            x = host_batch(x, "x")
        if isinstance(y, Tensor):
            if y.device is not self.device:
                raise ValueError(f"y lives on {y.device!r}, the model on {self.device!r}")
        else:
            y = self._check_target(y, None)
        return x, y

    def _check_target(self, y, output_shape):
        """The loss function's check of a host target against the model's output shape (None:
        unknown), the same call whatever the loss."""
        check = getattr(self.loss_fn, "check_target", None)
        return host_batch(y, "y") if check is None else check(y, output_shape, "y")

    def _signature(self):
        """What a captured step bakes in besides the batch shapes (see the class docstring), as a
        tuple. It runs every step, so the module tree is walked again only after some module
        changed (``modules_version``); parameters' ``requires_grad`` and buffers, which change
        outside modules, are read each time."""
        cache = (modules_version(), id(self.model), id(self.loss_fn))
        if self._walked is None or self._walked[0] != cache:
            self._walked = (cache, *self._walk())
        _, modules, params = self._walked
        opt = self.optimizer
        groups = tuple([len(g["params"]) for g in opt.param_groups])
        return modules, groups, tuple(map(_param_state, params))

    def _walk(self):
        """(the module tree's ids and plain attributes as a tuple, its parameters), model and loss."""
        sig, params = [id(self.loss_fn)], []
        stack = [root for root in (self.model, self.loss_fn) if isinstance(root, nn.Module)]
        seen = set()
        while stack:
            m = stack.pop()
            if id(m) in seen:
                continue
            seen.add(id(m))
            d = m.__dict__
            sig.append(id(m))
            sig += [v for v in d.values() if type(v) in PLAIN_TYPES]  # training, Dropout.p, Linear.activation, ...
            for p in d["_parameters"].values():
                if p is not None:
                    sig.append(id(p))
                    params.append(p)
            sig += [id(b) for b in d["_buffers"].values()]  # a captured step binds each buffer's memory
            stack += [c for c in d["_modules"].values() if c is not None]
        return tuple(sig), params

    def step(self, x: Union[np.ndarray, Tensor], y: Union[np.ndarray, Tensor]) -> Tensor:
        """One training step on a batch; returns the (lazy) loss."""
        x, y = self._batch_arrays(x, y)
        host_y = None if isinstance(y, Tensor) else y
        io_key = (x.shape, np.dtype(x.dtype), self._signature())
        key = (io_key, y.shape, np.dtype(y.dtype)) if self.capture else None
        if self._graph is not None and self._graph["key"] == key:
            if host_y is not None:
                self._check_target(host_y, self._graph["output_shape"])
            return self._replay(x, y)
        # Against the output shape this input gave last time; after a change, once the forward ran.
        checked = self._last_output[1] if self._last_output[0] == io_key else None
        if host_y is not None and checked is not None:
            self._check_target(host_y, checked)
        # Capture only after an eager step with the same key: that step creates what a step creates
        # once (optimizer moments, scratch buffers), which a captured graph would otherwise repeat.
        capture = key is not None and key == self._eager_key
        if self._graph is not None and (key is None or self._graph["key"][0][-1] != io_key[-1]):
            self._graph = None  # captured under other state; a batch of another shape alone keeps it
        user_x, user_y = isinstance(x, Tensor), isinstance(y, Tensor)
        x = x if isinstance(x, Tensor) else tensor(x, self.device)
        y = y if isinstance(y, Tensor) else tensor(y, self.device)
        if capture:
            # The graph keeps inputs of its own (the shapes replays check and
            # the tensors they rebind); the caller's tensors stay as they are.
            x = x.clone() if user_x else x
            y = y.clone() if user_y else y
            g = Graph()
            try:
                with graph(g, self.device):
                    loss = self._forward_backward(x, y, host_y, io_key, checked)
                output_shape = self._last_output[1]
                self._graph = {"graph": g, "x": x, "y": y, "loss": loss, "key": key, "output_shape": output_shape}
            except CaptureError as e:
                # The step ran in order, as an eager one would; only the graph is lost.
                self.capture = False
                warnings.warn(
                    f"Trainer: {e.where} read GPU data (or submitted work) in the middle of the "
                    "captured training step, so the step cannot be replayed; it ran eagerly and this "
                    "Trainer no longer captures (remove the read from forward/loss, or pass capture=False "
                    "to silence this)",
                    RuntimeWarning,
                    stacklevel=2,
                )
        else:
            with self.device.batch():  # an error in the forward discards the whole step
                loss = self._forward_backward(x, y, host_y, io_key, checked)
        self._optimizer_step()
        self._eager_key = None if capture else key
        return self._stepped(loss.detach())

    def _optimizer_step(self):
        if self.scaler is None:
            self.optimizer.step()
        else:
            self.scaler.step(self.optimizer)
            self.scaler.update()

    def _forward_backward(self, x, y, host_y, io_key, checked):
        with mixed_precision(self.device) if self.autocast else contextlib.nullcontext():
            out = self.model(x)
            shape = getattr(out, "shape", None)
            if host_y is not None and shape != checked:
                self._check_target(host_y, shape)  # raising here discards the step's recording
            self._last_output = (io_key, shape)
            self.optimizer.zero_grad()  # after the checks: a refused step leaves the gradients as they were
            loss = self.loss_fn(out, y)
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()
        return loss

    def _replay(self, x, y):
        g = self._graph
        loss = empty((), device=self.device)  # each step's loss a tensor of its own
        g["graph"].replay({g["x"]: x, g["y"]: y, g["loss"]: loss})
        self._optimizer_step()
        return self._stepped(loss)

    def _stepped(self, loss):
        self.step_count += 1
        self._unsubmitted += 1
        if self._unsubmitted >= self.steps_per_submit:
            self.flush()
        return loss

    def flush(self) -> None:
        """Submit the steps recorded so far (``Device.flush()``)."""
        self._unsubmitted = 0
        self.device.flush()

    def _saved_model(self) -> nn.Module:
        """The model whose weights checkpoints hold: a ``DistributedDataParallel``'s wrapped module
        (keys as without it, as torch users save ``ddp.module``), so a run saved with any number of
        processes resumes with any other."""
        from .nn.parallel import DistributedDataParallel

        return self.model.module if isinstance(self.model, DistributedDataParallel) else self.model

    def save(self, path: Union[str, os.PathLike], extra: Any = None) -> None:
        """Model, optimizer state (and the GradScaler's), step count and the device's RNG state
        (``pywgtrain.random``: dropout masks continue as if uninterrupted) to one file, atomically: the
        data goes to a temporary file in the same directory, is flushed and
        fsynced, then renamed over ``path`` (``os.replace``) and the directory
        fsynced. An interrupted save (Ctrl-C, SIGKILL, power loss) leaves the
        previous checkpoint at ``path`` as it was; a KeyboardInterrupt or error
        also removes the temporary file (SIGKILL leaves it behind, named
        ``.<name>.<pid>.<random>.tmp``).

        ``.safetensors`` paths (any case) get the safetensors format (tensors
        ``model.<name>``, ``optim.<i>.exp_avg``/``exp_avg_sq``; the rest as
        JSON metadata ``pywgtrain``), which PyTorch and Hugging Face tools
        open; other paths get ``.npz``. ``extra``: JSON-able state of the
        caller (a data position, a scheduler) stored alongside; ``load``
        returns it. A symbolic link at ``path`` stays: its target is replaced."""
        path = os.fspath(path)
        osd = self.optimizer.state_dict()
        meta = {
            "step_count": self.step_count,
            "param_groups": osd["param_groups"],
            "steps": {str(i): st["step"] for i, st in osd["state"].items() if "step" in st},
        }
        if self.scaler is not None and self.scaler.is_enabled():
            meta["scaler"] = self.scaler.state_dict()
        if extra is not None:
            meta["extra"] = extra
        if _is_safetensors_path(path):
            tensors = {f"model.{k}": v for k, v in self._saved_model().state_dict().items()}
            for i, st in osd["state"].items():
                tensors.update({f"optim.{i}.{k}": v for k, v in st.items() if k != "step"})
            tensors["rng_state"] = random.get_rng_state(self.device)
            _atomic_write(path, lambda f: write_safetensors(f, tensors, {"pywgtrain": json.dumps(meta)}))
            return
        arrays = {f"model/{k}": v for k, v in self._saved_model().state_dict().items()}
        for i, st in osd["state"].items():
            arrays.update({f"optim/{i}/{k}": v for k, v in st.items() if k != "step"})
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
        arrays["rng_state"] = random.get_rng_state(self.device)
        _atomic_write(path, lambda f: np.savez(f, **arrays))  # type: ignore[arg-type]  # numpy's stub: allow_pickle

    def load(self, path: Union[str, os.PathLike]) -> Any:
        """Restore what ``save`` wrote (model, optimizer state, step count,
        RNG state, and the GradScaler's state where both the checkpoint and
        this Trainer have one), from a ``.safetensors`` or ``.npz`` checkpoint; returns the
        caller's ``extra`` state (None if there was none). The whole checkpoint
        is checked before anything changes: entry names, shapes and dtypes of
        the weights and moments (``Module.check_state_dict``), the
        optimizer's groups and hyperparameters (``AdamW.check_state_dict``),
        the step counts and the RNG state; a bad one raises ValueError or
        TypeError naming the file and the entry, with model, optimizer and
        step count as they were."""
        path = os.fspath(path)
        meta, model_sd, state, rng_state = _read_checkpoint(path)
        model = self._saved_model()
        try:
            weights = model.check_state_dict(model_sd, strict=False)
            if weights.missing or weights.unexpected:
                raise ValueError(
                    f"the checkpoint is of another model: missing keys {weights.missing[:5]}, unexpected "
                    f"keys {weights.unexpected[:5]}"
                )
            optim_state = self.optimizer.check_state_dict({"state": state, "param_groups": meta["param_groups"]})
            rng_state = None if rng_state is None else random.check_rng_state(rng_state)
            scaler = self.scaler if self.scaler is not None and self.scaler.is_enabled() else None
            scaler_state = None
            if scaler is not None and meta.get("scaler") is not None:
                scaler_state = scaler.check_state_dict(meta["scaler"])
        except (TypeError, ValueError) as e:
            raise type(e)(f"{path}: {e}") from None
        # Everything is checked: apply.
        self._graph, self._eager_key = None, None  # optimizer state buffers are replaced below
        model.load_state_dict(weights)
        self.optimizer.load_state_dict(optim_state)
        if scaler is not None and scaler_state is not None:
            scaler.load_state_dict(scaler_state)
        self.step_count = meta["step_count"]
        if rng_state is not None:  # dropout masks continue as if uninterrupted
            random.set_rng_state(rng_state, self.device)
        return meta.get("extra")


def _is_safetensors_path(path):
    return path.lower().endswith(".safetensors")


def _read_checkpoint(path):
    """(meta, model state, optimizer state, RNG state or None) of a checkpoint file, the
    metadata's types and the entries' names checked (values are checked by the caller)."""
    with open(path, "rb") as f:
        is_npz = f.read(4) == b"PK\x03\x04"
    if is_npz:
        try:
            with np.load(path) as z:
                entries = {k: z[k] for k in z.files}
        except (OSError, ValueError, EOFError) as e:  # a damaged archive, or pickled objects
            raise ValueError(f"{path}: not a readable .npz checkpoint ({e})") from None
        if "meta" not in entries:
            raise ValueError(f"{path}: not a pywgtrain checkpoint (no 'meta' entry)")
        raw = entries.pop("meta")
        if raw.dtype != np.uint8 or raw.ndim != 1:
            raise ValueError(f"{path}: 'meta' must be a 1-D uint8 array of JSON, got {raw.dtype.name} {raw.shape}")
        raw, sep = bytes(raw), "/"
    else:
        entries, md = read_safetensors(path)
        if "pywgtrain" not in md:
            raise ValueError(
                f"{path}: a safetensors file without pywgtrain's training state (metadata "
                "'pywgtrain'); load weights with model.load_state_dict instead"
            )
        raw, sep = md["pywgtrain"], "."
    try:
        meta = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: its metadata is not JSON ({e})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: its metadata must be a JSON object, got {type(meta).__name__}")
    for key, kind in (("step_count", int), ("param_groups", list), ("steps", dict)):
        if key not in meta:
            raise ValueError(f"{path}: its metadata has no {key!r}")
        if not isinstance(meta[key], kind) or isinstance(meta[key], bool):
            raise ValueError(f"{path}: metadata {key!r} must be a {kind.__name__}, got {meta[key]!r:.100}")
    if meta["step_count"] < 0:
        raise ValueError(f"{path}: metadata 'step_count' must be >= 0, got {meta['step_count']}")
    model_sd = {k[len("model" + sep) :]: entries.pop(k) for k in list(entries) if k.startswith("model" + sep)}
    rng_state = entries.pop("rng_state", None)
    # The optimizer's per-parameter arrays (optim<sep><i><sep><name>) and step counts (metadata
    # 'steps'): what they must hold is the optimizer's check_state_dict's to say.
    state: dict[int, dict[str, Any]] = {}
    for name in [k for k in entries if k.startswith("optim" + sep)]:
        i, _, key = name[len("optim" + sep) :].partition(sep)
        if not (i.isascii() and i.isdigit()) or not key:
            raise ValueError(f"{path}: entry {name!r} names no parameter index and state")
        state.setdefault(int(i), {})[key] = entries.pop(name)
    for i, step in meta["steps"].items():
        if not (i.isascii() and i.isdigit()):
            raise ValueError(f"{path}: metadata 'steps' names parameter {i!r}, not an index")
        if int(i) not in state:
            raise ValueError(f"{path}: metadata 'steps' names parameter {i}, but the file has no state for it")
        state[int(i)]["step"] = step
    if entries:
        raise ValueError(f"{path}: unexpected entries {sorted(entries)[:5]}")
    return meta, model_sd, state, rng_state


def _atomic_write(path, write):
    """Call ``write(file)`` on a new temporary file beside ``path``, make it
    durable, then rename it over ``path`` (see ``Trainer.save``)."""
    # Through a symbolic link, the target is replaced (atomically, beside it) and the link stays.
    path = os.path.realpath(path)
    directory = os.path.dirname(path)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    # O_EXCL: never follow or reuse another file; 0o666 lets the umask decide the mode, as open() would.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_directory(directory)


def _fsync_directory(directory):
    """Make a rename in ``directory`` durable (POSIX; Windows cannot open directories)."""
    if os.name == "nt":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on directories
        pass
    finally:
        os.close(fd)
