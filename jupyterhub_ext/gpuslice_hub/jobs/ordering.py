"""Queue order: priority class first, then age; waiting long enough lifts a job a class
(aging), so a stream of higher-priority submissions cannot starve it forever."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol, TypeVar

from .states import PRIORITY_CLASSES


class Queued(Protocol):
    """What ordering reads of a job (a job row, or the few columns the scheduler loads)."""

    @property
    def id(self) -> int: ...
    @property
    def priority_class(self) -> str: ...
    @property
    def submitted_at(self) -> datetime: ...


Q = TypeVar("Q", bound=Queued)


def effective_priority(job: Queued, now: datetime, aging_seconds: float) -> float:
    base = PRIORITY_CLASSES[job.priority_class]
    if aging_seconds <= 0:
        return float(base)
    waited = (now - job.submitted_at).total_seconds()
    # at most one class above its own: aging helps a job get in line, it does not make a
    # preemptible job able to preempt others
    return base + min(1.0, waited / aging_seconds)


def queue_order(jobs: list[Q], now: datetime, aging_seconds: float) -> list[Q]:
    return sorted(
        jobs,
        key=lambda j: (-effective_priority(j, now, aging_seconds), j.submitted_at, j.id),
    )
