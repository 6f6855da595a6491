"""The safetensors file format, written and read here (no dependency):
an 8-byte little-endian header length, a JSON header naming each tensor's
dtype, shape and byte range, then the raw little-endian data. PyTorch and
Hugging Face tools (``safetensors.numpy.load_file``, ``safetensors.torch``)
open these files."""

import json
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


def write_safetensors(f, tensors, metadata=None):
    """Write ``tensors`` ({name: array}) and string ``metadata`` to the binary file object ``f``."""
    header, offset, arrays = {}, 0, []
    for name, value in tensors.items():
        a = np.ascontiguousarray(value)
        if a.dtype not in _DTYPES:
            raise TypeError(
                f"safetensors: {name} has dtype {a.dtype.name}, not one of {sorted(d.name for d in _DTYPES)}"
            )
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        header[name] = {"dtype": _DTYPES[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
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


def read_safetensors(path):
    """({name: array}, metadata dict) from a safetensors file (arrays copied out of a memory map)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than its header)")
        (n,) = struct.unpack("<Q", head)
        if n > 100_000_000:
            raise ValueError(f"{path}: not a safetensors file (header of {n} bytes)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: not a safetensors file ({e})") from None
    data = (
        np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
        if any(k != "__metadata__" for k in header)
        else np.zeros(0, np.uint8)
    )
    metadata = header.pop("__metadata__", {}) or {}
    out = {}
    for name, info in header.items():
        dtype = _BY_NAME.get(info["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: {name} has dtype {info['dtype']}, which pywgtrain does not read")
        start, end = info["data_offsets"]
        if not 0 <= start <= end <= len(data):
            raise ValueError(f"{path}: {name}'s data lies outside the file (truncated?)")
        out[name] = np.frombuffer(data[start:end], dtype.newbyteorder("<")).astype(dtype).reshape(info["shape"])
    return out, metadata
