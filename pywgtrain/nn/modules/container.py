"""Containers: Sequential, ModuleList and ModuleDict."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, ItemsView, Iterable, Iterator, KeysView, Mapping, Optional, Union, ValuesView

from .activation import _Activation
from .linear import Linear
from .module import Module


class Sequential(Module):
    """Modules called in order (``torch.nn.Sequential``), named "0", "1", ...
    (or by an OrderedDict's keys). A Linear without its own activation
    followed by ReLU/GELU/SiLU runs as one fused GEMM."""

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
            m = mods[i]
            nxt = mods[i + 1] if i + 1 < len(mods) else None
            if type(m) is Linear and m.activation is None and isinstance(nxt, _Activation) and nxt.fused is not None:
                x = m(x, activation=nxt.fused)
                i += 2
                continue
            x = m(x)
            i += 1
        return x


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
