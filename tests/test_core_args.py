"""Every wrapper in pywgtrain._core refuses None where it would dereference
it: each parameter typed as an extension type (_Device, _Buffer, _Recorder,
_StepGraph, _PassTimer), str, list, tuple or typed memoryview raises
TypeError when given None,
except the nullable ones the C++ takes as optional pointers, which must run.

The parameters come from _core.pyx itself (Cython's runtime signatures carry
names, not types), checked against the compiled module's signatures so the
parse cannot drift. The calls run in a subprocess: a wrapper that did
dereference None would crash the interpreter, and the report then names the
call that did."""

import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

from pywgtrain import _core

ROOT = Path(__file__).resolve().parents[1]
EXT_TYPES = ("_Device", "_Buffer", "_Recorder", "_StepGraph", "_PassTimer")
CONTAINERS = ("str", "list", "tuple")

# Parameters that may be None on purpose (the C++ takes a nullable pointer, or
# the Python side treats None as "not given"). A new nullable parameter must
# be added here, which makes it a decision rather than an accident.
OPTIONAL = {
    ("_Buffer.__cinit__", "parent"),
    ("_Recorder.replay", "timer"),
    ("gemm_bias_act", "preact"),
    ("adamw", "clip"),
    ("adamw", "param_half"),
    ("adamw_device", "clip"),
    ("adamw_device", "param_half"),
    ("reduce_axis", "argmax"),
    ("layer_norm_forward", "weight"),
    ("layer_norm_forward", "bias"),
    ("layer_norm_backward", "weight"),
    ("layer_norm_backward", "dx"),
    ("layer_norm_backward", "dweight"),
    ("layer_norm_backward", "dbias"),
    ("attention_forward", "kbias"),
    ("attention_backward", "kbias"),
}


def _pyx_source():
    # The copy installed beside the extension matches it; the checkout's is the fallback.
    installed = Path(_core.__file__).with_name("_core.pyx")
    return (installed if installed.exists() else ROOT / "pywgtrain" / "_core.pyx").read_text()


def _split_params(text):
    params, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            params.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        params.append(cur)
    out = []
    for p in params:
        decl, _, default = p.partition("=")
        decl = " ".join(decl.split())
        not_none = decl.endswith(" not None")
        words = decl.removesuffix(" not None").split()
        out.append(
            {"name": words[-1], "type": " ".join(words[:-1]), "not_none": not_none, "default": default.strip() or None}
        )
    return out


def parse_wrappers(source):
    """[(qualified name, class or None, params)] of every def in _core.pyx."""
    found, cls = [], None
    for m in re.finditer(r"^(cdef class (\w+)|( *)def (\w+)\()", source, re.M):
        if m.group(2):
            cls = m.group(2)
            continue
        indent, name = m.group(3), m.group(4)
        owner = cls if indent else None
        if not indent:
            cls = None
        if name in ("__dealloc__", "__getbuffer__", "__releasebuffer__"):
            continue  # slots Python never calls with arguments of ours
        # The parameter list: from the opening parenthesis to its match.
        i, depth = m.end(), 1
        while depth:
            depth += {"(": 1, ")": -1}.get(source[i], 0)
            i += 1
        params = _split_params(source[m.end() : i - 1])
        if owner:
            params = params[1:]  # self
        found.append((f"{owner}.{name}" if owner else name, owner, params))
    return found


WRAPPERS = parse_wrappers(_pyx_source())


def _object_typed(p):
    """A parameter Cython would let None through: extension types, builtin containers, typed memoryviews."""
    return p["type"] in EXT_TYPES + CONTAINERS or "[::1]" in p["type"]


def test_parse_matches_the_compiled_module():
    """Every parsed def exists in the module with the same parameter names,
    and every public function of the module was parsed."""
    assert len(WRAPPERS) > 40
    for qual, owner, params in WRAPPERS:
        if qual.endswith(".__cinit__"):
            assert isinstance(getattr(_core, owner), type)
            continue  # not introspectable; the classes are called with None below
        obj = getattr(getattr(_core, owner), qual.split(".")[1]) if owner else getattr(_core, qual)
        if inspect.isgetsetdescriptor(obj) or isinstance(obj, property):
            assert params == [], qual  # a @property getter
            continue
        names = [p for p in inspect.signature(obj).parameters if p != "self"]
        assert names == [p["name"] for p in params], qual
    parsed = {q for q, _, _ in WRAPPERS}
    public = {
        n
        for n, v in vars(_core).items()
        if callable(v)
        and not isinstance(v, type)
        and not n.startswith("__")
        and getattr(v, "__module__", None) == _core.__name__
    }
    for cls in EXT_TYPES:
        public |= {f"{cls}.{n}" for n, v in vars(getattr(_core, cls)).items() if not n.startswith("__") and callable(v)}
    assert public <= parsed, public - parsed


def test_nullable_parameters_are_the_listed_ones():
    """Object-typed parameters declared without `not None` are exactly OPTIONAL
    (all of them extension types: containers and memoryviews are never None)."""
    nullable = {(q, p["name"]) for q, _, params in WRAPPERS for p in params if _object_typed(p) and not p["not_none"]}
    assert nullable == OPTIONAL


CHILD = r"""
import json, sys
import numpy as np
import pywgtrain as pw
from pywgtrain import _core

cases = json.loads(sys.stdin.read())
dev = pw.Device()
d = dev._dev
rec = _core._Recorder(d)
rec.begin_capture()
graph = rec.end_capture()
timer = _core._PassTimer(d, 4)
inst = {"_Device": d, "_Recorder": rec, "_StepGraph": graph, "_PassTimer": timer}
owners = {"_Stream": _core._Stream(d)}  # classes whose methods take typed parameters, though none takes one of them


def value(p):
    t, n = p["type"], p["name"]
    if t == "_Buffer":
        return _core._Buffer(d, 4096)  # one per parameter: distinct buffers pass the alias checks
    if t in inst:
        return inst[t]
    if t == "type":  # _new_tensor's class
        return _core._TensorFields
    if t == "list":
        return [_core._Buffer(d, 4096)] if n == "grads" else [1] if "strides" in n else [2]
    if t == "tuple":
        return (0, 0, 0, 0)
    if t == "str":
        return "pywgtrain.test"
    if t == "bint":
        return False
    if t in ("float", "double"):
        return 0.0 if n.startswith("beta") or n == "p" else 1.0
    if "[::1]" in t:
        return bytearray(16)
    if t == "" and n in ("counts",):
        return [2]
    if t == "":
        return p["default"] and eval(p["default"])
    return 0 if n in ("offset", "src_off", "dst_off", "src_offset", "dst_offset", "op", "act", "which") else 2


def target(case):
    owner, name = case["owner"], case["qual"].split(".")[-1]
    if name == "__cinit__":
        return getattr(_core, owner)
    if owner:
        return getattr({"_Buffer": _core._Buffer(d, 4096), **inst, **owners}[owner], name)
    return getattr(_core, name)


report = []
for case in cases:
    print("CALL", case["qual"], case["param"], "None", file=sys.stderr, flush=True)
    args = [None if p["name"] == case["param"] else value(p) for p in case["params"]]
    try:
        target(case)(*args)
        outcome = "ran"
    except TypeError as e:
        outcome = "TypeError: " + str(e)
    except Exception as e:
        outcome = f"{type(e).__name__}: {e}"
    report.append([case["qual"], case["param"], outcome])
for extra in ("grad_norm", "replay"):
    # None inside a container of buffers.
    print("CALL", extra, "element None", file=sys.stderr, flush=True)
    b = _core._Buffer(d, 4096)
    try:
        if extra == "grad_norm":
            _core.grad_norm(rec, [b, None], [1, 1], _core._Buffer(d, 4096), _core._Buffer(d, 4096), 1.0)
        else:
            rec.replay(graph, inputs=[(None, b)])
        outcome = "ran"
    except TypeError as e:
        outcome = "TypeError: " + str(e)
    except Exception as e:
        outcome = f"{type(e).__name__}: {e}"
    report.append([extra, "element", outcome])
rec.submit()
dev.synchronize()
print(json.dumps(report))
"""


def test_none_is_refused_or_handled_by_every_wrapper(tmp_path):
    cases = [
        {"qual": q, "owner": owner, "params": params, "param": p["name"]}
        for q, owner, params in WRAPPERS
        for p in params
        if _object_typed(p)
    ]
    assert len(cases) > 150
    out = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=json.dumps(cases),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    calls = [line for line in out.stderr.splitlines() if line.startswith("CALL")]
    last = calls[-1] if calls else "?"
    assert out.returncode == 0, f"crashed (status {out.returncode}) at {last}:\n{out.stderr[-3000:]}"
    report = json.loads(out.stdout.strip().splitlines()[-1])
    wrong = []
    for qual, param, outcome in report:
        if (qual, param) in OPTIONAL:
            # Nullable: the call runs, or refuses something else (sizes, aliasing), never None itself.
            if outcome.startswith("TypeError"):
                wrong.append((qual, param, outcome))
        elif not (outcome.startswith("TypeError") and (f"'{param}'" in outcome or param == "element")):
            wrong.append((qual, param, outcome))  # refused, with a message naming the argument
    assert not wrong, "\n".join(map(str, wrong))
    assert len(report) == len(cases) + 2
