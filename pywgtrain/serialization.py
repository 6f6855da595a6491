"""The safetensors file format, written and read here (no dependency):
an 8-byte little-endian header length, a JSON header naming each tensor's
dtype, shape and byte range, then the raw little-endian data. PyTorch and
Hugging Face tools (``safetensors.numpy.load_file``, ``safetensors.torch``)
open these files.

The reader validates the header as Hugging Face's does (a JSON object of
entries with a known dtype, integer shape and offsets, byte ranges that match
the shape and tile the data exactly, no duplicate names), so a damaged or
hand-made file is refused with its path and the offending entry instead of
yielding arrays of the wrong bytes."""

import json
import math
import struct

import numpy as np

_DTYPES = {
    np.dtype(np.float32): "F32",
    np.dtype(np.int32): "I32",
    np.dtype(np.int64): "I64",
    np.dtype(np.uint8): "U8",
    np.dtype(np.float64): "F64",
    np.dtype(np.uint32): "U32",
}
_BY_NAME = {v: k for k, v in _DTYPES.items()}
_MAX_HEADER = 100_000_000  # bytes; Hugging Face's reader has the same limit


def write_safetensors(f, tensors, metadata=None):
    """Write ``tensors`` ({name: array}) and string ``metadata`` to the binary file object ``f``."""
    header, offset, arrays = {}, 0, []
    for name, value in tensors.items():
        a = np.ascontiguousarray(value)
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)  # before the lookup: '>f4' is float32 too
        if a.dtype.newbyteorder("=") not in _DTYPES:
            raise TypeError(
                f"safetensors: {name} has dtype {a.dtype.name}, not one of {sorted(d.name for d in _DTYPES)}"
            )
        header[name] = {
            "dtype": _DTYPES[a.dtype.newbyteorder("=")],
            "shape": list(a.shape),
            "data_offsets": [offset, offset + a.nbytes],
        }
        offset += a.nbytes
        arrays.append(a)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned
    f.write(struct.pack("<Q", len(blob)))
    f.write(blob)
    for a in arrays:
        f.write(a.tobytes())


def _no_duplicates(path):
    def hook(pairs):
        seen = set()
        for k, _ in pairs:
            if k in seen:
                raise ValueError(f"{path}: the header names {k!r} twice")
            seen.add(k)
        return dict(pairs)

    return hook


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _entry(path, name, info):
    """(dtype, shape, start, end) of one header entry, checked."""
    where = f"{path}: entry {name!r}"
    if not isinstance(info, dict):
        raise ValueError(f"{where} is a {type(info).__name__}, not an object with dtype, shape and data_offsets")
    missing = [k for k in ("dtype", "shape", "data_offsets") if k not in info]
    if missing:
        raise ValueError(f"{where} has no {', '.join(missing)}")
    if not isinstance(info["dtype"], str):
        raise ValueError(f"{where}: dtype must be a string, got {info['dtype']!r}")
    dtype = _BY_NAME.get(info["dtype"])
    if dtype is None:
        raise ValueError(f"{where} has dtype {info['dtype']}, which pywgtrain does not read ({sorted(_BY_NAME)})")
    shape, offsets = info["shape"], info["data_offsets"]
    if not isinstance(shape, list) or not all(_is_int(s) and s >= 0 for s in shape):
        raise ValueError(f"{where}: shape must be a list of non-negative integers, got {shape!r}")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) and o >= 0 for o in offsets):
        raise ValueError(f"{where}: data_offsets must be two non-negative integers, got {offsets!r}")
    start, end = offsets
    if end - start != math.prod(shape) * dtype.itemsize:
        raise ValueError(
            f"{where}: data_offsets {offsets} hold {end - start} bytes, its dtype {info['dtype']} and shape "
            f"{shape} need {math.prod(shape) * dtype.itemsize}"
        )
    return dtype, shape, start, end


def read_safetensors(path):
    """({name: array}, metadata dict) from a safetensors file (arrays copied out of a memory map).
    ValueError naming the file and the entry for anything malformed (see the module docstring)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than its header)")
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER:
            raise ValueError(f"{path}: not a safetensors file (header of {n} bytes)")
        raw = f.read(n)
        if len(raw) != n:
            raise ValueError(f"{path}: truncated inside its header ({len(raw)} of {n} bytes)")
        try:
            header = json.loads(raw, object_pairs_hook=_no_duplicates(path))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: not a safetensors file ({e})") from None
        f.seek(0, 2)
        data_bytes = f.tell() - 8 - n
    if not isinstance(header, dict):
        raise ValueError(
            f"{path}: not a safetensors file (the header is a JSON {type(header).__name__}, not an object)"
        )
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError(f"{path}: __metadata__ must be an object of strings, got {metadata!r}")
    entries = {name: _entry(path, name, info) for name, info in header.items()}
    # The byte ranges must tile the data without gaps or overlaps (as Hugging Face's reader requires).
    end_of = 0
    previous = None
    for name, (_, _, start, end) in sorted(entries.items(), key=lambda e: (e[1][2], e[1][3])):
        if start != end_of:
            what = f"overlaps {previous!r}" if start < end_of else f"leaves a gap after {previous!r}"
            raise ValueError(f"{path}: entry {name!r} (data_offsets [{start}, {end}]) {what}")
        end_of, previous = end, name
    if end_of != data_bytes:
        raise ValueError(
            f"{path}: the header describes {end_of} bytes of data, the file holds {data_bytes}"
            + (" (truncated?)" if data_bytes < end_of else "")
        )
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n) if end_of else np.zeros(0, np.uint8)
    out = {
        name: np.frombuffer(data[start:end], dtype.newbyteorder("<")).astype(dtype).reshape(shape)
        for name, (dtype, shape, start, end) in entries.items()
    }
    return out, metadata
