"""The package's import graph: no circle among its modules, and the
application code (pywgtrain.cli, pywgtrain.benchmarks) above the library.
Every import counts, at module level, inside functions and under
TYPE_CHECKING alike: each is a dependency of one module on another."""

import ast
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
