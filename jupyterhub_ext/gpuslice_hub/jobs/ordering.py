"""Queue order: priority class first, then age; waiting long enough lifts a job a class
(aging), so a stream of higher-priority submissions cannot starve it forever."""

from __future__ import annotations

from datetime import datetime

from ..db.jobs_models import JobRow
from .states import PRIORITY_CLASSES


def effective_priority(job: JobRow, now: datetime, aging_seconds: float) -> float:
    base = PRIORITY_CLASSES[job.priority_class]
    if aging_seconds <= 0:
        return float(base)
    waited = (now - job.submitted_at).total_seconds()
    # at most one class above its own: aging helps a job get in line, it does not make a
    # preemptible job able to preempt others
    return base + min(1.0, waited / aging_seconds)


def queue_order(jobs: list[JobRow], now: datetime, aging_seconds: float) -> list[JobRow]:
    return sorted(
        jobs,
        key=lambda j: (-effective_priority(j, now, aging_seconds), j.submitted_at, j.id),
    )
