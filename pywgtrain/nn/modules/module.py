"""The module base class: parameters and submodules registered by attribute
assignment, recursive naming, state dicts with PyTorch's keys."""

from __future__ import annotations

import itertools
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Optional, TypeVar, Union

import numpy as np

from ..._checked import CheckedState
from ...autograd import no_grad
from ...tensor import Tensor
from ..parameter import Parameter

if TYPE_CHECKING:
    from ...device import Device

_M = TypeVar("_M", bound="Module")

# Types of the plain attributes (training, Dropout.p, Linear.activation) a forward may branch on.
PLAIN_TYPES = frozenset((bool, int, float, str, type(None)))
_changes = itertools.count(1)  # next() is atomic in CPython: no lock for concurrent changes
_version = 0


def _changed() -> None:
    global _version
    _version = next(_changes)


def modules_version() -> int:
    """A number that changes whenever any module's mode (``train``/``eval``), plain attribute,
    submodule or parameter slot is set or deleted: Trainer compares it each step and walks its
    model again only after a change (see ``Trainer._signature``)."""
    return _version


def float32_values(value: Any, shape: tuple[int, ...], what: str) -> np.ndarray:
    """``value`` (NumPy, a torch tensor, a pywgtrain Tensor, anything ``np.asarray`` takes) as a
    C-contiguous float32 array of ``shape``, for parameters and optimizer moments. Floating
    dtypes of any byte order are converted when every value survives (a finite float64 beyond
    float32's range is refused rather than turned into inf); bool, integer, complex, string and
    object arrays are refused (an integer checkpoint of float weights is a mistake, not a cast).
    ``what`` names the entry in the errors."""
    if hasattr(value, "detach") and hasattr(value, "cpu") and not isinstance(value, Tensor):
        value = value.detach().cpu().numpy()  # a torch tensor
    arr = np.asarray(value)
    if arr.shape != tuple(shape):
        raise ValueError(f"{what} has shape {arr.shape}, expected {tuple(shape)}")
    if arr.dtype.kind != "f":
        raise TypeError(f"{what} has dtype {arr.dtype.name}, expected floating point (float32)")
    with np.errstate(over="ignore"):
        out = np.ascontiguousarray(arr, dtype=np.float32)
    if arr.dtype.itemsize > 4:
        overflow = np.isfinite(arr) & ~np.isfinite(out)
        if overflow.any():
            raise ValueError(
                f"{what} holds {int(overflow.sum())} {arr.dtype.name} value(s) beyond float32's range "
                f"(e.g. {arr[overflow].flat[0]!r})"
            )
    return out


def _state_values(value: Any, slot: Tensor, what: str) -> np.ndarray:
    """A state-dict entry for ``slot``: float32 for float32 tensors (``float32_values``); a
    buffer of another dtype takes values of the same kind (float16, or integers within int32)."""
    if slot.dtype == np.float32:
        return float32_values(value, slot.shape, what)
    if hasattr(value, "detach") and hasattr(value, "cpu") and not isinstance(value, Tensor):
        value = value.detach().cpu().numpy()
    arr = np.asarray(value)
    if arr.shape != tuple(slot.shape):
        raise ValueError(f"{what} has shape {arr.shape}, expected {tuple(slot.shape)}")
    if arr.dtype.kind != np.dtype(slot.dtype).kind:
        raise TypeError(f"{what} has dtype {arr.dtype.name}, expected {np.dtype(slot.dtype).name}")
    out = arr.astype(slot.dtype)
    if arr.dtype.kind in "iu" and (out != arr).any():
        raise ValueError(f"{what} holds values outside {np.dtype(slot.dtype).name}'s range")
    return np.ascontiguousarray(out)


class Module:
    """Base class of every layer and model (``torch.nn.Module``). Subclasses
    call ``super().__init__()`` first, then assign ``Parameter``s and
    submodules as attributes and define ``forward``."""

    # Set in __init__ with object.__setattr__ (registration must not see them).
    _parameters: OrderedDict[str, Parameter]
    _modules: OrderedDict[str, Module]
    _buffers: OrderedDict[str, Optional[Tensor]]
    _non_persistent: set[str]
    training: bool

    if TYPE_CHECKING:
        # Attributes a subclass assigns (parameters, submodules, settings), as torch's stubs declare them.
        def __getattr__(self, name: str) -> Any: ...

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "training", True)

    # -- registration -----------------------------------------------------------
    def __setattr__(self, name, value):
        if isinstance(value, (Parameter, Module)) and "_parameters" not in self.__dict__:
            raise AttributeError(
                f"cannot assign {type(value).__name__} '{name}' before Module.__init__() call "
                f"(call super().__init__() first in {type(self).__name__}.__init__)"
            )
        params, mods = self.__dict__.get("_parameters"), self.__dict__.get("_modules")
        # A change a captured training step may depend on (Trainer's signature): plain values, modules,
        # parameters, and whatever replaces a registered module or parameter.
        registered = name in (params or ()) or name in (mods or ())
        tracked = registered or type(value) in PLAIN_TYPES or isinstance(value, (Parameter, Module))
        buffers = self.__dict__.get("_buffers")
        if buffers is not None and name in buffers:
            if isinstance(value, (Parameter, Module)) or not (value is None or isinstance(value, Tensor)):
                raise TypeError(f"cannot assign {type(value).__name__} to buffer '{name}' (a Tensor or None)")
            buffers[name] = value  # a registered buffer stays one, as torch's
            tracked = True  # a captured step read the old tensor
        elif params is not None:
            params.pop(name, None)
            mods.pop(name, None)
            if isinstance(value, Parameter):
                params[name] = value
            elif isinstance(value, Module):
                mods[name] = value
        object.__setattr__(self, name, value)
        if tracked:
            _changed()  # after the change: a walk that sees the new version sees the new value

    def __delattr__(self, name):
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        self._buffers.pop(name, None)
        self._non_persistent.discard(name)
        object.__delattr__(self, name)
        _changed()

    def register_parameter(self, name: str, param: Optional[Parameter]) -> None:
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"register_parameter: {name} must be a Parameter or None, got {type(param).__name__}")
        if param is None:
            self._parameters.pop(name, None)
            object.__setattr__(self, name, None)
            _changed()
        else:
            setattr(self, name, param)

    def add_module(self, name: str, module: Optional[Module]) -> None:
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"add_module: {name} must be a Module, got {type(module).__name__}")
        setattr(self, name, module)

    register_module = add_module

    def register_buffer(self, name: str, tensor: Optional[Tensor], persistent: bool = True) -> None:
        """A tensor the module keeps that is not a parameter (``torch.nn.Module.register_buffer``):
        an attribute, listed by ``buffers()``, in ``state_dict()`` unless not ``persistent``."""
        if "_buffers" not in self.__dict__:
            raise AttributeError("cannot assign buffer before Module.__init__() call")
        if not isinstance(name, str) or not name or "." in name:
            raise KeyError(f"buffer name must be a non-empty string without '.', got {name!r}")
        if tensor is not None and (not isinstance(tensor, Tensor) or isinstance(tensor, Parameter)):
            raise TypeError(f"cannot assign {type(tensor).__name__} as buffer '{name}' (a Tensor or None)")
        if name in self._parameters or name in self._modules:
            raise KeyError(f"attribute '{name}' already exists as a parameter or submodule")
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent.discard(name)
        else:
            self._non_persistent.add(name)
        object.__setattr__(self, name, tensor)
        _changed()

    # -- traversal -----------------------------------------------------------------
    def named_modules(self, memo: Optional[set[int]] = None, prefix: str = "") -> Iterator[tuple[str, Module]]:
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, m in self._modules.items():
            if m is not None:
                yield from m.named_modules(memo, f"{prefix}.{name}" if prefix else name)

    def modules(self) -> list[Module]:
        return [m for _, m in self.named_modules()]

    def named_children(self) -> list[tuple[str, Module]]:
        return [(n, m) for n, m in self._modules.items() if m is not None]

    def children(self) -> list[Module]:
        return [m for _, m in self.named_children()]

    def named_parameters(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Parameter]]:
        """(dotted name, Parameter) pairs; a parameter shared by two modules (tied weights) appears once."""
        seen = set()
        modules = self.named_modules(prefix=prefix) if recurse else [(prefix, self)]
        for mod_prefix, m in modules:
            for name, p in m._parameters.items():
                if p is None or id(p) in seen:
                    continue
                seen.add(id(p))
                yield (f"{mod_prefix}.{name}" if mod_prefix else name), p

    def parameters(self, recurse: bool = True) -> list[Parameter]:
        return [p for _, p in self.named_parameters(recurse=recurse)]

    def named_buffers(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Tensor]]:
        seen = set()
        modules = self.named_modules(prefix=prefix) if recurse else [(prefix, self)]
        for mod_prefix, m in modules:
            for name, b in m._buffers.items():
                if b is None or id(b) in seen:
                    continue
                seen.add(id(b))
                yield (f"{mod_prefix}.{name}" if mod_prefix else name), b

    def buffers(self, recurse: bool = True) -> list[Tensor]:
        return [b for _, b in self.named_buffers(recurse=recurse)]

    def apply(self: _M, fn: Any) -> _M:
        """``fn(module)`` on every submodule, then on this one (torch's order); returns self."""
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    def get_submodule(self, target: str) -> Module:
        m = self
        for part in target.split(".") if target else []:
            if part not in m._modules or m._modules[part] is None:
                raise AttributeError(f"{type(m).__name__} has no submodule `{part}` (in '{target}')")
            m = m._modules[part]
        return m

    def get_parameter(self, target: str) -> Parameter:
        mod, _, name = target.rpartition(".")
        m = self.get_submodule(mod)
        if name not in m._parameters or m._parameters[name] is None:
            raise AttributeError(f"{type(m).__name__} has no parameter `{name}`")
        return m._parameters[name]

    def get_buffer(self, target: str) -> Tensor:
        mod, _, name = target.rpartition(".")
        m = self.get_submodule(mod)
        buf = m._buffers.get(name)
        if buf is None:
            raise AttributeError(f"{type(m).__name__} has no buffer `{name}`")
        return buf

    @property
    def device(self) -> Optional[Device]:
        """The device of the first parameter (or the one assigned to ``device``)."""
        dev = self.__dict__.get("_device")
        if dev is not None:
            return dev
        for _, p in self.named_parameters():  # the first one only: no list of them all
            return p.device
        return None

    @device.setter
    def device(self, dev: Optional[Device]) -> None:
        object.__setattr__(self, "_device", dev)

    # -- modes and gradients ---------------------------------------------------------
    def train(self: _M, mode: bool = True) -> _M:
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        _changed()
        return self

    def eval(self: _M) -> _M:
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad.zero_()

    def requires_grad_(self: _M, requires_grad: bool = True) -> _M:
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    # -- state -------------------------------------------------------------------------
    def state_dict(self) -> OrderedDict[str, np.ndarray]:
        """Parameters and persistent buffers as NumPy arrays under PyTorch's dotted names (each
        module's parameters, then its buffers; tied weights under every name, as torch)."""
        return OrderedDict((name, t.numpy()) for name, t in self._named_state_slots().items())

    def load_state_dict(
        self, state: Union[Mapping[str, Any], CheckedState], strict: bool = True
    ) -> tuple[list[str], list[str]]:
        """Copy arrays (NumPy, torch tensors, or anything ``np.asarray`` takes) into the parameters.
        Every entry is checked first (``check_state_dict``), so a bad one raises before any
        parameter changes; a ``CheckedState`` from this module's ``check_state_dict`` is applied
        as it is (``strict`` was given to that check). Returns (missing keys, unexpected keys)."""
        checked = state if isinstance(state, CheckedState) else self.check_state_dict(state, strict)
        arrays = checked.value_for(self)
        slots = self._named_state_slots()
        with no_grad():
            for name, arr in arrays.items():
                slots[name].copy_(arr)
        return checked.missing, checked.unexpected

    def _named_state_slots(self) -> OrderedDict[str, Tensor]:
        """Every parameter and persistent buffer under each of its state-dict names (tied weights
        under every name)."""
        slots: OrderedDict[str, Tensor] = OrderedDict()
        for mod_prefix, m in self.named_modules():
            named = [*m._parameters.items(), *((n, b) for n, b in m._buffers.items() if n not in m._non_persistent)]
            for name, t in named:
                if t is not None:
                    slots[f"{mod_prefix}.{name}" if mod_prefix else name] = t
        return slots

    def check_state_dict(self, state: Mapping[str, Any], strict: bool = True) -> CheckedState:
        """Validate a state dict for ``load_state_dict`` without changing anything: names (all of
        this module's and no others with ``strict``), shapes and dtypes (``float32_values``); raises
        on the first bad entry. Returns the float32 arrays ready to copy, with the missing and
        unexpected keys, as a ``CheckedState`` that this module's ``load_state_dict`` applies."""
        if not isinstance(state, Mapping):
            raise TypeError(f"load_state_dict: state must be a mapping of names to arrays, got {type(state).__name__}")
        slots = self._named_state_slots()
        missing = [k for k in slots if k not in state]
        unexpected = [k for k in state if k not in slots]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        arrays = OrderedDict()
        for name, t in slots.items():
            if name in state:
                arrays[name] = _state_values(state[name], t, f"load_state_dict: {name}")
        return CheckedState(self, arrays, missing, unexpected)

    # -- calling ---------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        return ""

    def __repr__(self):
        lines = [f"({name}): " + repr(m).replace("\n", "\n  ") for name, m in self.named_children()]
        head = f"{type(self).__name__}({self.extra_repr()}"
        if not lines:
            return head + ")"
        return head + "\n  " + "\n  ".join(lines) + "\n)"
