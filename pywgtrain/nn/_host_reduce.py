"""Gradient averaging among the processes of one host through shared memory, for
``DistributedDataParallel``: gloo moves every byte through TCP loopback (473 MB took 220 ms
between two processes of one host, and its ring slows further with more of them), while the
processes of one host can read each other's gradients at memory speed.

Each rank writes its bucket into a file of its own under ``/dev/shm`` (mapped by every local
rank), then the local ranks sum one slice each, in place in their own file, so every value is
summed once and every rank reads the same result. Sync points are small collectives on a
process group of the host's ranks, so a rank that dies or hangs fails the others as any
collective does (the process group's timeout bounds the wait). Across hosts, one rank per host
all-reduces its host's sum with the other hosts' through gloo. A bucket's file holds two
buffers used in alternate reductions: a rank writes the next reduction's gradient while a slower
one may still read the last result.
"""

from __future__ import annotations

import mmap
import os
import socket
import tempfile
import uuid
import weakref
from typing import Any, Callable, Optional

import numpy as np

# Where the files go: /dev/shm when it has room for them, else the temporary directory
# (still page cache; writes to a full tmpfs would kill the process with SIGBUS, not raise).
_SHM_DIR = "/dev/shm"


def _room(path: str) -> int:
    try:
        st = os.statvfs(path)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


class HostReducer:
    """The shared-memory side of one ``DistributedDataParallel``: built collectively at wrap
    time (every rank of the group calls it, in the same order)."""

    def __init__(self, torch: Any, dist: Any, group: Any, rank: int, world: int, numel: int) -> None:
        self.torch, self.dist, self.world = torch, dist, world
        host = f"{socket.gethostname()}/{os.environ.get('GROUP_RANK', '')}"  # torchrun's node rank
        need = 2 * 4 * numel * world + (64 << 20)  # every local rank's two buffers, at most
        me = (host, os.getpid(), _room(_SHM_DIR) >= need, uuid.uuid4().hex[:16])
        everyone: list[Any] = [None] * world
        dist.all_gather_object(everyone, me, group=group)
        hosts: dict[str, list[int]] = {}
        for r, (h, *_rest) in enumerate(everyone):
            hosts.setdefault(h, []).append(r)
        # new_group is collective over the whole group: every rank creates every host's group,
        # with the group's timeout (a dead or hung rank must fail the others as soon as before).
        timeout = _timeout(torch, dist, group)
        groups = {h: dist.new_group(ranks, timeout=timeout, backend="gloo") for h, ranks in sorted(hosts.items())}
        leaders = [ranks[0] for _, ranks in sorted(hosts.items())]
        leader_group = dist.new_group(leaders, timeout=timeout, backend="gloo") if len(leaders) > 1 else None
        local = hosts[host]
        self.local_ranks = local
        self.local_index = local.index(rank)
        self.group = groups[host]
        self.leader_group = leader_group if rank in leaders else None
        self.hosts = len(hosts)
        first = everyone[local[0]]
        self.directory = _SHM_DIR if first[2] else tempfile.gettempdir()
        self.prefix = f"pywgtrain-ddp-{first[3]}"  # one name per host, from its first rank
        self._maps: dict[tuple[int, int, int], np.ndarray] = {}  # (bucket, local index, size) -> view
        self._owned: list[str] = []
        self._parity: dict[tuple[int, int], int] = {}
        self._executor: Any = None
        weakref.finalize(self, _unlink, self._owned)

    def _threads(self, n: int) -> int:
        """Threads for a slice of n values: the host's cores shared by its ranks, pieces of at
        least 1M values (NumPy's adds release the GIL; one thread sums ~5-8 GB/s)."""
        cores = max((os.cpu_count() or 1) // len(self.local_ranks), 1)
        return max(min(cores, 8, n >> 20), 1)

    def _pool(self) -> Any:
        if self._executor is None:
            from concurrent.futures import ThreadPoolExecutor

            self._executor = ThreadPoolExecutor(8, "pywgtrain-ddp-sum")
            weakref.finalize(self, self._executor.shutdown, wait=False)
        return self._executor

    @property
    def active(self) -> bool:
        """Whether any two ranks share a host (else every byte goes through gloo as before)."""
        return len(self.local_ranks) > 1

    def _path(self, k: int, j: int, n: int) -> str:
        return os.path.join(self.directory, f"{self.prefix}-b{k}-r{j}-n{n}")

    def _buffer(self, k: int, j: int, n: int) -> np.ndarray:
        """Local rank j's two buffers of bucket k (n values each), mapped (created if mine)."""
        key = (k, j, n)
        view = self._maps.get(key)
        if view is None:
            path = self._path(k, j, n)
            mine = j == self.local_index
            fd = os.open(path, (os.O_CREAT | os.O_RDWR) if mine else os.O_RDWR, 0o600)
            try:
                if mine:
                    os.ftruncate(fd, 2 * 4 * n)
                    self._owned.append(path)
                region = mmap.mmap(fd, 2 * 4 * n)
            finally:
                os.close(fd)
            view = np.frombuffer(region, np.float32).reshape(2, n)
            self._maps[key] = view
        return view

    def slot(self, k: int, n: int) -> np.ndarray:
        """Where this rank writes bucket k's gradient for the next reduction."""
        parity = self._parity.get((k, n), 0)
        return self._buffer(k, self.local_index, n)[parity]

    def reduce(
        self, k: int, n: int, collective: Callable[[str, Callable[[], Any]], Any], what: str, compress: Optional[str]
    ) -> list[tuple[slice, np.ndarray]]:
        """After every local rank wrote its slot: the average over all ranks, as non-empty
        (slice, values) pieces that together cover the bucket (each lives in one rank's file)."""
        parity = self._parity.get((k, n), 0)
        self._parity[(k, n)] = 1 - parity
        local = len(self.local_ranks)
        barrier = self.torch.zeros(1)
        dist = self.dist
        collective(what, lambda: dist.all_reduce(barrier, group=self.group))  # every slot written
        bufs = [self._buffer(k, j, n)[parity] for j in range(local)]
        cuts = _cuts(n, local)
        mine = slice(cuts[self.local_index], cuts[self.local_index + 1])
        scale = self.world if self.hosts == 1 else None
        pieces = _cuts(mine.stop - mine.start, self._threads(mine.stop - mine.start))
        tasks = [slice(mine.start + a, mine.start + b) for a, b in zip(pieces, pieces[1:]) if a < b]
        if len(tasks) > 1:
            list(self._pool().map(lambda part: _sum_into(bufs, self.local_index, part, scale), tasks))
        elif tasks:
            _sum_into(bufs, self.local_index, tasks[0], scale)
        collective(what, lambda: dist.all_reduce(barrier, group=self.group))  # every slice summed
        # Every local rank has mapped my file by now: unlinked, it lives as long as the maps, and
        # a process that dies leaves nothing in /dev/shm.
        own = self._path(k, self.local_index, n)
        if own in self._owned:
            self._owned.remove(own)
            _unlink([own])
        if self.hosts > 1:
            if self.leader_group is not None:
                whole = np.concatenate([b[cuts[j] : cuts[j + 1]] for j, b in enumerate(bufs)])
                t = self.torch.from_numpy(whole)
                if compress == "fp16":
                    t = t.to(self.torch.float16).div_(self.world)
                collective(what, lambda: dist.all_reduce(t, group=self.leader_group))
                if compress != "fp16":
                    t.div_(self.world)
                whole[:] = t.numpy()
                for j, b in enumerate(bufs):
                    b[cuts[j] : cuts[j + 1]] = whole[cuts[j] : cuts[j + 1]]
            collective(what, lambda: dist.all_reduce(barrier, group=self.group))  # hosts' sums in
        return [
            (slice(cuts[j], cuts[j + 1]), b[cuts[j] : cuts[j + 1]]) for j, b in enumerate(bufs) if cuts[j] < cuts[j + 1]
        ]


def _timeout(torch: Any, dist: Any, group: Any) -> Any:
    """The process group's timeout (None, new_group's default, where torch hides it)."""
    try:
        pg = group if group is not None else dist.group.WORLD
        return pg._get_backend(torch.device("cpu")).options._timeout
    except (AttributeError, RuntimeError):
        return None


def _sum_into(bufs: list[np.ndarray], mine: int, part: slice, scale: Optional[int]) -> None:
    """bufs[mine][part] += every other buffer's part (then / scale)."""
    out = bufs[mine][part]
    for j, b in enumerate(bufs):
        if j != mine:
            out += b[part]
    if scale is not None:
        out /= scale


def _cuts(n: int, parts: int) -> list[int]:
    """Slice boundaries splitting n values into ``parts`` runs, multiples of 16 values (64 bytes)."""
    step = -(-n // parts)
    step = -(-step // 16) * 16
    return [min(i * step, n) for i in range(parts)] + [n]


def _unlink(paths: list[str]) -> None:
    for p in paths:
        try:
            os.unlink(p)
        except OSError:
            pass
