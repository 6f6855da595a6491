"""Containers: Sequential, ModuleList and ModuleDict."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, ItemsView, Iterable, Iterator, KeysView, Mapping, Optional, Sequence, Union, ValuesView

from ... import functions as F
from ...tensor import Tensor
from .activation import _Activation
from .linear import Linear
from .module import Module


class Sequential(Module):
    """Modules called in order (``torch.nn.Sequential``), named "0", "1", ...
    (or by an OrderedDict's keys). A run of Linear layers, each with its own
    activation or followed by ReLU/GELU/SiLU, runs as one ``F.mlp`` op: a fused
    GEMM per layer, each activation's derivative fused into the backward's GEMMs."""

    def __init__(self, *modules: Union[Module, OrderedDict[str, Module]]) -> None:
        super().__init__()
        items: list[tuple[str, Any]]
        if len(modules) == 1 and isinstance(modules[0], OrderedDict):
            items = list(modules[0].items())
        else:
            items = [(str(i), m) for i, m in enumerate(modules)]
        for name, m in items:
            if not isinstance(m, Module):
                raise TypeError(f"Sequential: entry {name} is a {type(m).__name__}, not a Module")
            self.add_module(name, m)

    def __getitem__(self, i: Union[int, slice]) -> Module:
        mods = list(self._modules.values())
        if isinstance(i, slice):
            return Sequential(*mods[i])
        return mods[i]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def append(self, module: Module) -> Sequential:
        self.add_module(str(len(self)), module)
        return self

    def forward(self, x: Any) -> Any:
        mods = list(self._modules.values())
        i = 0
        while i < len(mods):
            chain, i = _linear_chain(mods, i)
            if chain:
                weights, biases, acts = zip(*((m.weight, m.bias, act) for m, act in chain))
                x = F.mlp(x, weights, biases, acts)
            else:
                x = mods[i](x)
                i += 1
        return x


def _linear_chain(mods, i):
    """The run of Linear layers from mods[i], each with its activation (its own,
    or a fusable activation module right after it), and the index after the run."""
    chain = []
    while i < len(mods) and type(mods[i]) is Linear:
        m, act = mods[i], mods[i].activation
        i += 1
        if act is None and i < len(mods) and isinstance(mods[i], _Activation) and mods[i].fused is not None:
            act = mods[i].fused
            i += 1
        chain.append((m, act))
    return chain, i


class ModuleList(Module):
    """A list of modules registered as submodules "0", "1", ... (``torch.nn.ModuleList``)."""

    def __init__(self, modules: Iterable[Module] = ()) -> None:
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, module: Module) -> ModuleList:
        if not isinstance(module, Module):
            raise TypeError(f"ModuleList: got a {type(module).__name__}, not a Module")
        self.add_module(str(len(self._modules)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        for m in modules:
            self.append(m)
        return self

    def __getitem__(self, i: Union[int, slice]) -> Module:
        mods = list(self._modules.values())
        return ModuleList(mods[i]) if isinstance(i, slice) else mods[i]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())


class ModuleDict(Module):
    """Modules registered under string keys (``torch.nn.ModuleDict``)."""

    def __init__(self, modules: Optional[Mapping[str, Module]] = None) -> None:
        super().__init__()
        for name, m in (modules or {}).items():
            self[name] = m

    def __setitem__(self, name: str, module: Module) -> None:
        if not isinstance(module, Module):
            raise TypeError(f"ModuleDict: {name!r} is a {type(module).__name__}, not a Module")
        self.add_module(str(name), module)

    def __getitem__(self, name: str) -> Module:
        return self._modules[name]

    def __contains__(self, name: object) -> bool:
        return name in self._modules

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def keys(self) -> KeysView[str]:
        return self._modules.keys()

    def items(self) -> ItemsView[str, Module]:
        return self._modules.items()

    def values(self) -> ValuesView[Module]:
        return self._modules.values()


class Flatten(Module):
    """``torch.nn.Flatten``: dimensions ``start_dim`` .. ``end_dim`` merged into one."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Tensor) -> Tensor:
        return x.flatten(self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Unflatten(Module):
    """``torch.nn.Unflatten``: dimension ``dim`` split into ``unflattened_size``."""

    def __init__(self, dim: int, unflattened_size: Sequence[int]) -> None:
        super().__init__()
        self.dim, self.unflattened_size = dim, tuple(unflattened_size)

    def forward(self, x: Tensor) -> Tensor:
        d = self.dim % x.ndim
        return x.reshape(*x.shape[:d], *self.unflattened_size, *x.shape[d + 1 :])

    def extra_repr(self) -> str:
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"
