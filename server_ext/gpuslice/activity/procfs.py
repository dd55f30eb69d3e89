"""Minimal /proc reader: parent, owner and namespace PIDs of a process, cached.

The root is injectable so tests build a fake /proc, and so a sampler that sees the host's
/proc (mounted at e.g. ``/host/proc``) can translate the host PIDs NVML reports.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ProcInfo:
    pid: int  # in the proc root's PID namespace
    ppid: int
    uid: int | None
    # PIDs in each nested namespace, outermost (the proc root's) first; ``NSpid`` has been
    # in /proc/<pid>/status since Linux 4.1, older kernels give just the PID.
    nspid: tuple[int, ...]

    @property
    def local_pid(self) -> int:
        """The PID in the innermost namespace, where the kernel's own server runs."""
        return self.nspid[-1] if self.nspid else self.pid


def _field(data: bytes, key: bytes) -> bytes | None:
    start = data.find(key)
    if start < 0:
        return None
    start += len(key)
    end = data.find(b"\n", start)
    return data[start : end if end >= 0 else len(data)]


def parse_status(pid: int, data: bytes) -> ProcInfo | None:
    ppid = _field(data, b"\nPPid:")
    if ppid is None:
        return None
    uid = _field(data, b"\nUid:")
    nspid = _field(data, b"\nNSpid:")
    try:
        ns = tuple(int(x) for x in nspid.split()) if nspid else (pid,)
        return ProcInfo(
            pid=pid,
            ppid=int(ppid),
            uid=int(uid.split()[0]) if uid else None,
            nspid=ns or (pid,),
        )
    except ValueError:
        return None


class ProcReader:
    """Reads ``<root>/<pid>/status``; entries are reused for ``ttl`` seconds.

    Reading status costs 10 to 20 µs a file, so re-reading every GPU process's ancestry every
    tick would dominate the tick. A process's uid and namespace PIDs never change and its
    parent only changes when the parent dies, so a cached entry is at worst ``ttl`` seconds
    stale about a re-parenting; a PID that vanishes is noticed at the next read.
    """

    def __init__(
        self,
        root: str = "/proc",
        ttl: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root
        self.ttl = ttl
        self.clock = clock
        self._cache: dict[int, tuple[float, ProcInfo]] = {}
        self.reads = 0

    def info(self, pid: int) -> ProcInfo | None:
        now = self.clock()
        hit = self._cache.get(pid)
        # Spread expiry over [ttl, 2*ttl) by PID so re-reads don't all land in one tick.
        if hit is not None and now - hit[0] < self.ttl * (1 + (pid % 16) / 16):
            return hit[1]
        self.reads += 1
        try:
            with open(os.path.join(self.root, str(pid), "status"), "rb") as f:
                data = f.read()
        except OSError:
            self._cache.pop(pid, None)
            return None
        info = parse_status(pid, data)
        if info is None:
            self._cache.pop(pid, None)
        else:
            self._cache[pid] = (now, info)
        return info

    def forget_except(self, keep: set[int]) -> None:
        """Drop entries for PIDs not used this tick, so dead PIDs don't pile up."""
        for pid in [p for p in self._cache if p not in keep]:
            del self._cache[pid]
