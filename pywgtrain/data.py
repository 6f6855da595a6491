"""Text data for language models: a corpus every machine has (the Python
standard library's own source files), a byte-level tokenizer, a
train/validation split and random batches read from a memory-mapped file."""

import hashlib
import os
import sys
import sysconfig
import tempfile

import numpy as np

from ._cache import cache_dir


class ByteTokenizer:
    """Bytes are tokens (vocabulary 256): any text encodes, nothing to train."""

    vocab_size = 256

    def encode(self, text):
        return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)

    def decode(self, ids):
        return bytes(np.asarray(ids, np.int64).astype(np.uint8).tolist()).decode("utf-8", errors="replace")


def stdlib_sources(root=None):
    """The standard library's .py files (tests and site-packages left out), sorted: the same list every run."""
    root = root or sysconfig.get_paths()["stdlib"]
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d
            for d in dirnames
            if d not in ("site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__")
        )
        files += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
    return files


def _corpus_dir():
    base = cache_dir()
    try:
        os.makedirs(base, exist_ok=True)
        return base
    except OSError:
        return tempfile.gettempdir()


def stdlib_corpus_file(max_bytes=None):
    """Path of a file holding the standard library's sources as bytes
    (written once per Python version and size, then reused)."""
    files = stdlib_sources()
    if not files:
        raise RuntimeError(f"no Python source files found under {sysconfig.get_paths()['stdlib']}")
    key = hashlib.sha1(f"{sys.version}|{len(files)}|{max_bytes}".encode()).hexdigest()[:12]
    path = os.path.join(_corpus_dir(), f"stdlib-{key}.bin")
    if os.path.exists(path):
        return path
    tmp = f"{path}.{os.getpid()}.tmp"
    written = 0
    with open(tmp, "wb") as out:
        for f in files:
            try:
                with open(f, "rb") as src:
                    data = src.read()
            except OSError:
                continue
            if max_bytes is not None:
                data = data[: max_bytes - written]
            out.write(data)
            written += len(data)
            if max_bytes is not None and written >= max_bytes:
                break
    os.replace(tmp, path)
    return path


class TokenDataset:
    """Byte tokens of a file, memory-mapped; the last ``val_fraction`` is the
    validation split. ``batch(split, batch_size, block_size, rng)`` gives
    (x, y) int32 arrays [batch, block] with y = x shifted by one token."""

    def __init__(self, path, val_fraction=0.1):
        self.path = path
        self.data = np.memmap(path, dtype=np.uint8, mode="r")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
        cut = int(len(self.data) * (1.0 - val_fraction))
        self.splits = {"train": self.data[:cut], "val": self.data[cut:]}

    def __len__(self):
        return len(self.data)

    def batch(self, split, batch_size, block_size, rng):
        data = self.splits[split]
        if len(data) <= block_size + 1:
            raise ValueError(f"the {split} split has {len(data)} tokens, too few for block_size {block_size}")
        starts = rng.integers(0, len(data) - block_size - 1, batch_size)
        rows = np.stack([data[s : s + block_size + 1] for s in starts]).astype(np.int32)
        return rows[:, :-1].copy(), rows[:, 1:].copy()
