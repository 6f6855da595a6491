"""The package's import graph: no circle among its modules, and the
application code (pywgtrain.cli, pywgtrain.benchmarks) above the library.
Every import counts, at module level, inside functions and under
TYPE_CHECKING alike: each is a dependency of one module on another. And what
can be read off the source of the layers above the tensor core: they write no
other object's private fields, leave a tensor's internals to the core, and the
Trainer names no loss class."""

import ast
import re
from pathlib import Path

import pywgtrain

ROOT = Path(pywgtrain.__file__).parent
APP = ("pywgtrain.cli", "pywgtrain.benchmarks")


def _modules():
    mods = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


def _imports(name, path, mods):
    """The package's modules that module ``name`` imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in mods)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            submodules = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in mods]
            out.update(submodules)
            # Names other than submodules (and the compiled _core) come from the module itself.
            if target in mods and any(f"{target}.{a.name}" not in mods and a.name != "_core" for a in node.names):
                out.add(target)
    out.discard(name)
    return out


def _graph():
    mods = _modules()
    return {name: _imports(name, path, mods) for name, path in mods.items()}


def _circles(graph):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def _is_app(name):
    return any(name == a or name.startswith(a + ".") for a in APP)


def test_the_graph_is_read():
    graph = _graph()
    # A few known edges, so an empty graph cannot pass the tests below.
    assert "pywgtrain.tensor" in graph["pywgtrain.functions"]
    assert "pywgtrain.autograd" in graph["pywgtrain.tensor"]
    assert "pywgtrain.benchmarks.common" in graph["pywgtrain.benchmarks.gpt"]


def test_no_import_circle():
    assert _circles(_graph()) == []


def test_circles_are_found():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_library_never_imports_the_application():
    graph = _graph()
    upward = {
        name: sorted(t for t in targets if _is_app(t))
        for name, targets in graph.items()
        if not _is_app(name) and name != "pywgtrain.__main__"
    }
    assert {n: t for n, t in upward.items() if t} == {}


# -- layers keep to themselves: what can be checked on the source ---------------------------
# Modules above the tensor core (tensor.py, autograd.py, functions.py, graphs.py and the
# compiled _core): they use tensors, devices and each other through public interfaces.
UPPER = ("nn", "optim", "models", "cli", "benchmarks", "train.py", "data.py", "serialization.py")


def _upper_files():
    return sorted(p for p in ROOT.rglob("*.py") if p.relative_to(ROOT).parts[0] in UPPER)


def test_the_upper_layers_are_read():
    names = {p.relative_to(ROOT).as_posix() for p in _upper_files()}
    assert {"train.py", "optim/adamw.py", "nn/modules/loss.py", "models/gpt.py"} <= names


def _foreign_private(node):
    """The ``obj._name`` attributes under ``node`` whose obj is not self or cls, as ``line: source``."""
    for e in ast.walk(node):
        if (
            isinstance(e, ast.Attribute)
            and e.attr.startswith("_")
            and not e.attr.startswith("__")
            and not (isinstance(e.value, ast.Name) and e.value.id in ("self", "cls"))
        ):
            yield f"{e.lineno}: {ast.unparse(e)}"


def _private_writes(tree):
    """``obj._name = ...`` (also augmented and annotated) where obj is not self or cls."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                yield from _foreign_private(target)


def test_private_writes_are_found():
    tree = ast.parse("p._buf = v\nself._x = 1\nq.grad, r._home = a, b\ns._n += 1\nt.__dict__ = {}\n")
    assert list(_private_writes(tree)) == ["1: p._buf", "3: r._home", "4: s._n"]


def test_upper_layers_write_no_private_field_of_another_object():
    """An optimizer moves parameters with Tensor.set_ and routes gradients with
    Tensor.grad_home; nothing above the core assigns another object's private field."""
    found = {p.relative_to(ROOT).as_posix(): list(_private_writes(ast.parse(p.read_text()))) for p in _upper_files()}
    assert {k: v for k, v in found.items() if v} == {}


def test_tensor_internals_stay_in_the_tensor_core():
    """A tensor's storage and gradient home are reached through untyped_storage(), set_() and
    grad_home outside tensor.py and autograd.py (nn/parameter.py: Parameter is a Tensor)."""
    allowed = {"tensor.py", "autograd.py", "nn/parameter.py"}
    users = sorted(
        p.relative_to(ROOT).as_posix()
        for p in ROOT.rglob("*.py")
        if re.search(r"\._store\b|\b_grad_home\b", p.read_text())
    )
    assert set(users) <= allowed, users


def test_trainer_treats_every_loss_alike():
    """train.py names no loss class: each loss checks its own target (check_target)."""
    losses = {n for n in dir(pywgtrain.nn) if n.endswith("Loss")} | {"_Loss", "label_array"}
    assert {"CrossEntropyLoss", "MSELoss"} <= losses
    tree = ast.parse((ROOT / "train.py").read_text())
    named = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    named |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    named |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert named & losses == set()


def _in(name, package):
    return name == package or name.startswith(package + ".")


def test_modules_sit_below_optimizers_and_the_trainer():
    """nn never imports the optimizers, models or the Trainer (a fused optimizer's gradient
    arena registers itself with DistributedDataParallel instead); optim never imports models
    or the Trainer."""
    above = {"pywgtrain.nn": ("pywgtrain.optim", "pywgtrain.models", "pywgtrain.train")}
    above["pywgtrain.optim"] = ("pywgtrain.models", "pywgtrain.train")
    graph = _graph()
    upward = {
        name: sorted(t for t in targets if any(_in(t, a) for a in higher))
        for layer, higher in above.items()
        for name, targets in graph.items()
        if _in(name, layer)
    }
    assert {n: t for n, t in upward.items() if t} == {}


def test_private_reads_are_found():
    tree = ast.parse("a = m._named_slots()\nself._x()\nrandom._state_arg(s)\n")
    assert list(_foreign_private(tree)) == ["1: m._named_slots", "3: random._state_arg"]


def test_trainer_uses_only_public_interfaces():
    """The Trainer reaches the model, the optimizer, the scaler, the device and the RNG through
    their public methods (a checkpoint load: check_state_dict on each, then load_state_dict)."""
    assert list(_foreign_private(ast.parse((ROOT / "train.py").read_text()))) == []
