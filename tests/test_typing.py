"""The public API is annotated (parameters and return values of every
exported function, class constructor and public method) and the package
ships the PEP 561 marker, so type checkers read the hints."""

import importlib
import inspect
from pathlib import Path

import pywgtrain

MODULES = [
    "pywgtrain",
    "pywgtrain.nn",
    "pywgtrain.nn.functional",
    "pywgtrain.nn.parallel",
    "pywgtrain.optim",
    "pywgtrain.optim.lr_scheduler",
    "pywgtrain.train",
    "pywgtrain.models",
]


def _public(module):
    names = getattr(module, "__all__", None)
    if names is None:
        names = [
            n
            for n, v in vars(module).items()
            if not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
        ]
    return [(n, getattr(module, n)) for n in names]


def _callables():
    seen = set()
    for modname in MODULES:
        module = importlib.import_module(modname)
        for name, obj in _public(module):
            if inspect.ismodule(obj) or id(obj) in seen:
                continue
            seen.add(id(obj))
            if inspect.isclass(obj):
                if not obj.__module__.startswith("pywgtrain"):
                    continue  # the exception classes come from the compiled core
                for attr, member in vars(obj).items():
                    if attr.startswith("_") and attr != "__init__":
                        continue
                    if isinstance(member, property):
                        member = member.fget
                    elif isinstance(member, (staticmethod, classmethod)):
                        member = member.__func__
                    if inspect.isfunction(member):
                        yield f"{modname}.{name}.{attr}", member
            elif inspect.isfunction(obj):
                yield f"{modname}.{name}", obj


def test_public_api_is_annotated():
    missing = []
    count = 0
    for qual, fn in _callables():
        count += 1
        sig = inspect.signature(fn)
        for p in sig.parameters.values():
            if p.name in ("self", "cls") or p.kind is p.VAR_KEYWORD:
                continue
            if p.annotation is p.empty:
                missing.append(f"{qual}({p.name})")
        if sig.return_annotation is sig.empty and not qual.endswith("__init__"):
            missing.append(f"{qual} -> ?")
    assert count > 150
    assert not missing, f"{len(missing)} unannotated: " + ", ".join(missing)


def test_py_typed_is_installed():
    assert (Path(pywgtrain.__file__).parent / "py.typed").is_file()
