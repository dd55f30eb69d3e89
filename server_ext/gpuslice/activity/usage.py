"""GPU usage over a reporting interval: one figure for everything a server (or a batch
job's kernel) runs, averaged over the ticks between two reports.

Pure: every call takes ``now``; nothing here reads a clock.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from .samples import Activity, Attribution

MiB = 1024 * 1024


def total_utilization(owners: Iterable[Activity]) -> float | None:
    """The utilization of several owners together (a server's kernels and its own
    processes), computed the way :func:`~.sampler.aggregate` computes one owner's.

    Owners hold disjoint processes, so on one device their per-process figures add up
    (capped at 100); a per-instance figure already covers every process on the instance,
    so a device with one is taken once (the max), not summed. The total is the busiest
    device's. An owner spread over several devices only says how busy its busiest one
    is; that figure is counted on each of its devices, which can overstate a device
    (never the total beyond the true busiest). Unknown when any owner's figure is.
    """
    per_device: dict[str, list[Activity]] = defaultdict(list)
    for a in owners:
        if a.util is None:
            return None
        for device in a.devices:
            per_device[device].append(a)
    busiest = 0.0
    for on_device in per_device.values():
        utils = [a.util for a in on_device if a.util is not None]
        if any(a.attribution is Attribution.PER_INSTANCE for a in on_device):
            busiest = max(busiest, max(utils))
        else:
            busiest = max(busiest, min(100.0, sum(utils)))
    return busiest


def total_memory(owners: Iterable[Activity]) -> int | None:
    """GPU memory of several owners together (their processes are disjoint, so it adds
    up); None when no owner's memory is known."""
    known = [a.memory_bytes for a in owners if a.memory_bytes is not None]
    return sum(known) if known else None


@dataclass(frozen=True)
class Usage:
    utilization: float | None  # percent, mean over the ticks with a known figure
    memory_mib: float | None  # the most held at any tick of the interval
    interval_seconds: float
    ticks: int


class UsageWindow:
    """Accumulates ticks until :meth:`take` closes the interval and starts the next.

    Memory is the interval's maximum rather than the last reading: a plot of usage
    against allocation should show what the slice had to hold, and a peak between two
    reports is exactly what the latest reading would miss.
    """

    def __init__(self) -> None:
        self.start: float | None = None
        self._util_sum = 0.0
        self._util_n = 0
        self._memory: int | None = None
        self._ticks = 0

    def add(self, now: float, util: float | None, memory_bytes: int | None) -> None:
        if self.start is None:
            self.start = now
        self._ticks += 1
        if util is not None:
            self._util_sum += util
            self._util_n += 1
        if memory_bytes is not None:
            self._memory = max(self._memory or 0, memory_bytes)

    @property
    def ticks(self) -> int:
        return self._ticks

    def elapsed(self, now: float) -> float:
        return 0.0 if self.start is None else now - self.start

    def take(self, now: float) -> Usage:
        """The interval so far, up to *now*; the next one starts at *now*."""
        usage = Usage(
            utilization=round(self._util_sum / self._util_n, 2) if self._util_n else None,
            memory_mib=None if self._memory is None else round(self._memory / MiB, 1),
            interval_seconds=round(self.elapsed(now), 3),
            ticks=self._ticks,
        )
        self.start = now
        self._util_sum = 0.0
        self._util_n = 0
        self._memory = None
        self._ticks = 0
        return usage
