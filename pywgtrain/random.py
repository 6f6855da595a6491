"""Random number state on the GPU (``torch.random``'s shape).

Each device has one :class:`Generator`: a 16-byte device buffer
``[seed_lo, seed_hi, counter_lo, counter_hi]`` (uint32). An op that draws
random numbers (``dropout``) records a tiny dispatch that copies the state
into a key buffer of its own and advances the counter, on the GPU; its
kernels then derive every random bit from that key and the element index
(Philox-4x32-10, shaders/dropout.wgsl). Nothing about the draw lives in a
uniform block or on the host, so a captured training step replayed later
draws new numbers every replay, and a run restored with ``set_rng_state``
repeats the numbers bit for bit.

``get_rng_state`` / ``set_rng_state`` submit the recorded work first (inside
a ``Device.batch()`` block, what it recorded so far), so they read and write
the state in call order.
"""

from __future__ import annotations

import numbers
import threading
import weakref
from typing import Any, Optional

import numpy as np

from . import _core
from .device import Device, resolve_device

# torch's default seed, so an unseeded run is reproducible too
DEFAULT_SEED = 67280421310721

_lock = threading.Lock()
_generators: weakref.WeakKeyDictionary[Device, Generator] = weakref.WeakKeyDictionary()
_seed_for_new = DEFAULT_SEED


def _seed_arg(seed):
    """An int in [-2^63, 2^64) as torch accepts it; negatives wrap to 64 bits."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    seed = int(seed)
    if not -(1 << 63) <= seed < (1 << 64):
        raise ValueError(f"seed must lie in [-2**63, 2**64), got {seed}")
    return seed & ((1 << 64) - 1)


def check_rng_state(state: Any) -> np.ndarray:
    """An RNG state (``get_rng_state``'s uint32[4], any integer array of those values) checked
    and converted for ``set_rng_state``; a bad one raises ValueError."""
    arr = np.asarray(state)
    if arr.shape != (4,) or arr.dtype.kind not in "iu":
        raise ValueError(
            f"an RNG state is 4 integers (uint32: seed_lo, seed_hi, counter_lo, counter_hi), got "
            f"shape {arr.shape} and dtype {arr.dtype.name}"
        )
    if (arr.dtype.kind == "i" and (arr < 0).any()) or (arr > 0xFFFFFFFF).any():
        raise ValueError(f"RNG state words must lie in [0, 2**32), got {arr.tolist()}")
    return np.ascontiguousarray(arr, dtype=np.uint32)


class Generator:
    """The random state of one device (``torch.Generator``'s shape). ``state``
    holds the device buffer that random ops advance; see the module docstring."""

    def __init__(self, device: Optional[Device] = None, seed: Optional[int] = None) -> None:
        self.device = resolve_device(device)
        self.state = _core._Buffer(self.device._dev, 16, "pywgtrain.rng_state")
        self._initial = DEFAULT_SEED if seed is None else _seed_arg(seed)
        self.state.upload(self._seed_words(self._initial).view(np.uint8))  # a new buffer: no work uses it yet

    @staticmethod
    def _seed_words(seed):
        return np.array([seed & 0xFFFFFFFF, seed >> 32, 0, 0], np.uint32)

    def _write(self, words):
        self.device.flush()  # keep order with work recorded earlier (a batch submits what it has)
        self.state.upload(words.view(np.uint8))

    def manual_seed(self, seed: int) -> Generator:
        """Seed (an int) and reset the counter; returns self."""
        self._initial = _seed_arg(seed)
        self._write(self._seed_words(self._initial))
        return self

    def initial_seed(self) -> int:
        return self._initial

    def get_state(self) -> np.ndarray:
        """The state now (after all recorded work), as uint32[4]: seed_lo, seed_hi, counter_lo, counter_hi."""
        out = np.empty(4, np.uint32)
        self.device.flush()
        self.state.download(out.view(np.uint8))
        return out

    def set_state(self, state: np.ndarray) -> Generator:
        """Restore a state from ``get_state()``: the following draws repeat bit for bit."""
        words = check_rng_state(state)
        self._initial = int(words[0]) | (int(words[1]) << 32)
        self._write(words.copy())
        return self

    def __repr__(self):
        return f"<pywgtrain.random.Generator on {self.device!r}>"


def default_generator(device: Optional[Device] = None) -> Generator:
    """The device's generator (created on first use, from the last ``manual_seed`` without device)."""
    dev = resolve_device(device)
    with _lock:
        g = _generators.get(dev)
        if g is None:
            g = _generators[dev] = Generator(dev, _seed_for_new)
        return g


def manual_seed(seed: int, device: Optional[Device] = None) -> Optional[Generator]:
    """Seed one device's generator, or (device None, like ``torch.manual_seed``)
    every device's, including devices whose generator is created later.
    Returns the device's generator (device None: None)."""
    global _seed_for_new
    seed = _seed_arg(seed)
    if device is not None:
        return default_generator(device).manual_seed(seed)
    with _lock:
        _seed_for_new = seed
        gens = list(_generators.values())
    for g in gens:
        if not g.device.lost:
            g.manual_seed(seed)
    return None


def host_generator(device: Optional[Device] = None) -> np.random.Generator:
    """A NumPy generator for host-side sampling (``GPT.generate``) seeded from
    the device's generator state, whose counter it advances by one like a
    dropout call: after ``manual_seed`` (or ``set_rng_state``) the same calls
    draw the same numbers, and consecutive calls draw different ones. Reads
    the state back, so it waits for the recorded work."""
    g = default_generator(device)
    words = g.get_state()
    nxt = words.copy()
    counter = ((int(words[3]) << 32) | int(words[2])) + 1
    nxt[2], nxt[3] = counter & 0xFFFFFFFF, (counter >> 32) & 0xFFFFFFFF
    g.set_state(nxt)
    # a tag word keeps these streams apart from any other use of the same words
    return np.random.default_rng(np.random.SeedSequence([int(w) for w in words] + [0x68737430]))


def initial_seed(device: Optional[Device] = None) -> int:
    return default_generator(device).initial_seed()


def get_rng_state(device: Optional[Device] = None) -> np.ndarray:
    """The device's RNG state as ``np.ndarray`` uint32[4] (after all recorded work)."""
    return default_generator(device).get_state()


def set_rng_state(state: np.ndarray, device: Optional[Device] = None) -> None:
    """Restore the device's RNG state (uint32[4] from ``get_rng_state``)."""
    default_generator(device).set_state(state)
