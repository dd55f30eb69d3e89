"""Turning the holders' usage reports into milli-GPU actually used."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

# A report still describes the present if it is at most two reporting intervals old, plus
# this much slack for a server that is slow to send (or a service that was busy).
FRESH_SLACK = timedelta(seconds=120)


def is_fresh(report: Any, now: datetime) -> bool:
    """A report with a utilization figure, sent recently enough to stand for now."""
    if report is None or report.utilization is None:
        return False
    age = now - report.reported_at
    return age <= timedelta(seconds=2 * (report.interval_seconds or 0)) + FRESH_SLACK


def used_milli(alloc: Any, utilization: float) -> int:
    """The milli-GPU an allocation's holder keeps busy, given its reported utilization (%).

    NVML's figure is a percentage of the whole device for a share or a whole GPU, but of
    the instance alone for a MIG instance. So a MIG figure scales the instance's milli
    (30 % of a 1g instance of 142 milli is 43 milli); a share's or a whole GPU's figure
    scales one device's 1000, capped at what the allocation holds (a time-sliced share may
    briefly get more than it was allotted; it still only holds its share of the pool).
    Holders report their busiest device, so for several whole GPUs this is a lower bound:
    one device that busy, the others counted idle, rather than all assumed as busy.
    """
    base = alloc.gpu_milli if alloc.kind == "mig" else 1000
    return min(alloc.gpu_milli, round(max(utilization, 0.0) / 100 * base))


def pool_used(active: list[Any], reports: dict[int, Any], now: datetime) -> tuple[int | None, int]:
    """(used milli of the allocations with a fresh report, the milli those allocations hold).

    Used is None when no allocation has a fresh report: nothing is known, which is not 0.
    """
    used, covered, known = 0, 0, False
    for alloc in active:
        report = reports.get(alloc.id)
        if report is None or not is_fresh(report, now):
            continue
        known = True
        used += used_milli(alloc, report.utilization)
        covered += alloc.gpu_milli
    return (used if known else None), covered
