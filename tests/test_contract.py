"""The host <-> shader contract: csrc/shader_contract.hpp against shaders/*.wgsl.

The C++ side describes itself (pywgtrain._core.uniform_layouts, shader_bindings,
shader_constants); this file parses the WGSL and checks that both sides agree:
uniform blocks field for field (name, type, byte offset, size), every binding
(number, variable, access, type), and the constants the pipeline cache emits.
"""

import re
from pathlib import Path

from pywgtrain import _core

ROOT = Path(__file__).resolve().parent.parent
SHADERS = ROOT / "shaders"


def _source(path):
    return re.sub(r"//[^\n]*", "", path.read_text())


def _norm(t):
    return re.sub(r"\s+", "", t)


def _split_top(text):
    """Splits on commas outside <...>."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def _structs(src):
    out = {}
    for name, body in re.findall(r"struct\s+(\w+)\s*\{(.*?)\}", src, re.S):
        fields = []
        for f in _split_top(body):
            fname, ftype = (x.strip() for x in f.split(":", 1))
            fields.append((fname, _norm(ftype)))
        out[name] = fields
    return out


def _bindings(src):
    pat = r"@group\(0\)\s*@binding\((\d+)\)\s*var<([^>]*)>\s*(\w+)\s*:\s*([^;]+);"
    out = []
    for num, space, var, vtype in re.findall(pat, src):
        space = [s.strip() for s in space.split(",")]
        access = "uniform" if space[0] == "uniform" else (space[1] if len(space) > 1 else "read")
        out.append((int(num), var, access, _norm(vtype)))
    return out


def _layout(t):
    """(align, size) of a host-shareable WGSL type in the uniform address space."""
    scalars = {"u32", "i32", "f32"}
    if t in scalars:
        return 4, 4
    m = re.fullmatch(r"vec([234])<(u32|i32|f32)>", t)
    if m:
        n = int(m.group(1))
        return {2: 8, 3: 16, 4: 16}[n], 4 * n
    m = re.fullmatch(r"array<(.+),(\d+)>", t)
    if m:
        align, size = _layout(m.group(1))
        stride = -(-size // align) * align
        assert stride % 16 == 0, f"uniform array {t} needs a 16-byte stride"
        return max(align, 16), stride * int(m.group(2))
    raise AssertionError(f"unexpected type in a uniform block: {t}")


def _wgsl_layout(fields):
    """[(field, type, offset, size)], struct size under WGSL's layout rules."""
    offset, struct_align, out = 0, 1, []
    for name, t in fields:
        align, size = _layout(t)
        offset = -(-offset // align) * align
        out.append((name, t, offset, size))
        offset += size
        struct_align = max(struct_align, align)
    return out, -(-offset // struct_align) * struct_align


def _shader_files():
    return {p.stem: _source(p) for p in sorted(SHADERS.glob("*.wgsl"))}


def test_every_uniform_block_matches_its_wgsl_struct():
    host = _core.uniform_layouts()
    wgsl_structs = {}
    uniform_types = set()
    for src in _shader_files().values():
        for name, fields in _structs(src).items():
            assert name not in wgsl_structs or wgsl_structs[name] == fields, f"struct {name} differs between shaders"
            wgsl_structs[name] = fields
        uniform_types |= {b[3] for b in _bindings(src) if b[2] == "uniform"}
    # Every uniform block a shader reads is described (and filled by name) on the host, and the host has no others.
    assert uniform_types == set(host), uniform_types ^ set(host)
    for name, (size, fields) in host.items():
        expected, expected_size = _wgsl_layout(wgsl_structs[name])
        got = [(f, _norm(t), off, sz) for f, t, off, sz in fields]
        assert got == expected, f"{name}: C++ {got} != WGSL {expected}"
        assert size == expected_size, f"{name}: C++ size {size} != WGSL size {expected_size}"


def test_every_binding_matches_the_shader():
    host = _core.shader_bindings()
    files = _shader_files()
    with_bindings = {stem for stem, src in files.items() if _bindings(src)}
    assert set(host) == with_bindings, set(host) ^ with_bindings
    for stem, slots in host.items():
        declared = sorted(_bindings(files[stem]))
        described = sorted((n, v, a, _norm(t)) for n, v, a, t in slots)
        assert described == declared, f"{stem}.wgsl: C++ {described} != WGSL {declared}"
        numbers = [n for n, *_ in declared]
        assert len(numbers) == len(set(numbers)), f"{stem}.wgsl declares a binding number twice"


def test_shared_constants_are_defined_once_on_the_host():
    files = _shader_files()
    for stem, consts in _core.shader_constants().items():
        src = files[stem]
        for name, value in consts.items():
            assert isinstance(value, int) and value >= 0
            # Written once: the pipeline cache emits it, the shader only uses it.
            assert not re.search(rf"\b(const|override)\s+{name}\b", src), f"{stem}.wgsl defines {name} itself"
            assert re.search(rf"\b{name}\b", src), f"{stem}.wgsl never uses {name}"


def test_launchers_bind_by_name_and_fill_uniforms_by_field():
    """No positional binding lists, anonymous uniform structs or positional uniform fills in csrc/."""
    offenders = []
    for path in sorted((ROOT / "csrc").glob("*.cpp")):
        text = _source(path)
        for pattern, what in [
            (r"\{\s*\d+u?\s*,\s*Bind::", "a binding given by number"),
            (r"\bstruct\s*\{", "an anonymous struct"),
            (r"\b\w+Params\s+\w+\s*\{[^}]", "a uniform block filled by position"),
        ]:
            if re.search(pattern, text):
                offenders.append(f"{path.name}: {what}")
    assert not offenders, offenders
