"""Op numbers of the tensor kernels, for pywgtrain._core.unary / binary /
reduce_axis and friends, by torch-style name. They are written once, in
csrc/shader_contract.hpp's op tables, which the pipeline cache also emits as
the shaders' constants: U_EXP there is UNARY["exp"] here."""

from . import _core


def _table(stem: str, prefix: str) -> dict[str, int]:
    consts = _core.shader_constants()[stem]
    return {name[len(prefix) :].lower(): value for name, value in consts.items() if name.startswith(prefix)}


UNARY: dict[str, int] = _table("elementwise", "U_")
BINARY: dict[str, int] = _table("elementwise", "B_")
REDUCE: dict[str, int] = _table("axis", "R_")
