"""The capacity check: is our queue a capacity problem or a scheduling problem?

Over the last 7 and 30 days it sets the pool's allocation rate against its effective
utilization (from the usage samples the admin panel plots), and the batch queue's wait
against the jobs' run time, then applies the decision lines GPU admins use:

- allocation steadily above 60 % (both windows): owning the hardware pays; steadily below
  40 %: renting would (a rented GPU is paid for every allocated hour, busy or not);
- a queue with most of the allocation idle is a scheduling problem (slices held but
  unused: reclaim and packing gain more than hardware); a queue with the pool allocated
  and busy is a capacity problem;
- a median queue time above half the median run time over the last 7 days: burst now.

Each figure is computed as ``docs/admin-guide.md`` ("The capacity check") describes.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Table, and_, case, func, or_, select

from ..db.jobs_models import JobRow
from ..ledger import Ledger
from ..serialize import iso
from .usage import SAMPLES

WINDOWS_DAYS = (7, 30)
OWN_ABOVE = 0.60
RENT_BELOW = 0.40
# A queue with the pool this allocated, and at least this share of the allocation busy,
# is short of hardware; with less of it busy, it is short of scheduling.
FULL_ALLOCATION = 0.80
BUSY_SHARE = 0.50
BURST_QUEUE_TO_RUN = 0.5
# There is a queue when on average at least one job waited, or the median wait was more
# than a tenth of the median run.
QUEUED_JOBS = 1.0
QUEUE_TO_RUN = 0.1
# Fewer finished jobs than this say nothing about a queue.
MIN_JOBS = 5
JOBS = cast(Table, JobRow.__table__)


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or not den:
        return None
    return round(num / den, 4)


def _pool_figures(ledger: Ledger, since: datetime, until: datetime) -> dict[str, Any]:
    """Allocation and effective utilization over the samples in [since, until].

    A sample's use is known when a usage report covered it, or when nothing was allocated
    (nothing allocated is nothing used); samples whose use is unknown are left out of the
    effective utilization, and ``use_known_share`` says how many that was.
    """
    c = SAMPLES.c
    known = or_(c.used_milli.is_not(None), c.allocated_milli == 0)
    with ledger.db.reading() as s:
        row = (
            s.connection()
            .execute(
                select(
                    func.count(),
                    func.min(c.ts),
                    func.sum(c.allocated_milli),
                    func.sum(c.in_service_milli),
                    func.sum(case((known, 1), else_=0)),
                    func.sum(case((known, func.coalesce(c.used_milli, 0)), else_=0)),
                    func.sum(case((known, c.in_service_milli), else_=0)),
                    func.sum(case((c.used_milli.is_not(None), c.reported_milli), else_=0)),
                    func.sum(case((c.used_milli.is_not(None), c.allocated_milli), else_=0)),
                    func.avg(c.queued_jobs),
                ).where(c.ts >= since, c.ts <= until)
            )
            .one()
        )
    (
        n,
        first,
        allocated,
        in_service,
        n_known,
        used,
        known_service,
        reported,
        reported_of,
        queued,
    ) = row
    return {
        "samples": int(n or 0),
        "first_sample": iso(first) if first is not None else None,
        "allocation_rate": _ratio(allocated, in_service),
        "effective_utilization": _ratio(used, known_service),
        "use_known_share": _ratio(n_known, n),
        # the share of the allocation the usage reports covered, where use was known:
        # below 1, the effective utilization is a lower bound
        "reported_share": _ratio(reported, reported_of),
        "mean_queued_jobs": round(float(queued), 2) if queued is not None else None,
    }


def _job_figures(ledger: Ledger, since: datetime, now: datetime) -> dict[str, Any]:
    """Queue time (submission to first start) of the batch jobs submitted in the window
    (a job still queued counts the wait so far), and run time of those that completed."""
    c = JOBS.c
    with ledger.db.reading() as s:
        conn = s.connection()
        submitted = conn.execute(
            select(c.submitted_at, c.started_at, c.finished_at).where(c.submitted_at >= since)
        ).all()
        runs = conn.execute(
            select(c.run_seconds).where(
                and_(c.state == "completed", c.finished_at >= since, c.finished_at <= now)
            )
        ).all()
    waits = [
        max(((started or finished or now) - sub).total_seconds(), 0.0)
        for sub, started, finished in submitted
    ]
    run_times = [float(r[0]) for r in runs]
    wait = statistics.median(waits) if waits else None
    run = statistics.median(run_times) if run_times else None
    return {
        "jobs_submitted": len(waits),
        "jobs_completed": len(run_times),
        "median_queue_seconds": round(wait, 1) if wait is not None else None,
        "median_run_seconds": round(run, 1) if run is not None else None,
        "queue_to_run": (
            _ratio(wait, run)
            if len(waits) >= MIN_JOBS and len(run_times) >= MIN_JOBS and run
            else None
        ),
    }


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def _verdicts(windows: dict[int, dict[str, Any]]) -> list[dict[str, str]]:
    week, month = windows[7], windows[30]
    out: list[dict[str, str]] = []
    rates = [week["allocation_rate"], month["allocation_rate"]]
    if all(r is None for r in rates):
        return [
            {
                "code": "no-data",
                "text": "No usage samples yet: the check needs the usage sampler "
                "(usage_sample_interval) to have run.",
            }
        ]
    pairs = zip(WINDOWS_DAYS, rates, strict=True)
    said = "allocated " + ", ".join(f"{_pct(r)} over {d} days" for d, r in pairs if r is not None)
    if all(r is not None and r > OWN_ABOVE for r in rates):
        out.append(
            {
                "code": "own",
                "text": f"The pool is steadily above {_pct(OWN_ABOVE)} allocated ({said}): "
                "owning the hardware pays.",
            }
        )
    elif all(r is not None and r < RENT_BELOW for r in rates):
        out.append(
            {
                "code": "rent",
                "text": f"The pool is steadily below {_pct(RENT_BELOW)} allocated ({said}): "
                "renting the GPUs by the hour would cost less than owning them.",
            }
        )
    else:
        out.append(
            {
                "code": "between",
                "text": f"The pool is not steadily above {_pct(OWN_ABOVE)} or below "
                f"{_pct(RENT_BELOW)} allocated ({said}): neither decision line is crossed.",
            }
        )
    ratio = week["queue_to_run"]
    queued = (week["mean_queued_jobs"] or 0) >= QUEUED_JOBS or (
        ratio is not None and ratio > QUEUE_TO_RUN
    )
    alloc, eff = week["allocation_rate"], week["effective_utilization"]
    if not queued:
        out.append(
            {"code": "no-queue", "text": "No batch queue in the last 7 days: nothing waits."}
        )
    elif alloc is not None and eff is not None and alloc > 0 and eff / alloc < BUSY_SHARE:
        out.append(
            {
                "code": "scheduling",
                "text": f"A scheduling problem: jobs queue while the pool is {_pct(alloc)} "
                f"allocated but only {_pct(eff)} used (7 days). Slices are held idle: idle "
                "reclaim, smaller slices and preemptible backfill gain more than hardware.",
            }
        )
    elif alloc is not None and alloc >= FULL_ALLOCATION:
        used = f" and {_pct(eff)} used" if eff is not None else ""
        out.append(
            {
                "code": "capacity",
                "text": f"A capacity problem: jobs queue while the pool is {_pct(alloc)} "
                f"allocated{used} (7 days).",
            }
        )
    elif alloc is not None:
        out.append(
            {
                "code": "fit",
                "text": f"Jobs queue while only {_pct(alloc)} of the pool is allocated (7 "
                "days): what is free does not fit what waits (quotas, fragmentation or "
                "profiles), a scheduling problem.",
            }
        )
    if ratio is not None and ratio > BURST_QUEUE_TO_RUN:
        out.append(
            {
                "code": "burst",
                "text": f"The median queue time is {_pct(ratio)} of the median run time over "
                f"7 days (above {_pct(BURST_QUEUE_TO_RUN)}): burst now.",
            }
        )
    return out


def capacity_check(ledger: Ledger, now: datetime) -> dict[str, Any]:
    windows: dict[int, dict[str, Any]] = {}
    for days in WINDOWS_DAYS:
        since = now - timedelta(days=days)
        windows[days] = {
            "days": days,
            "from": iso(since),
            "to": iso(now),
            **_pool_figures(ledger, since, now),
            **_job_figures(ledger, since, now),
        }
    return {
        "generated_at": iso(now),
        "windows": [windows[d] for d in WINDOWS_DAYS],
        "verdicts": _verdicts(windows),
    }


@dataclass
class _Cached:
    at: float
    value: dict[str, Any]


class CapacityCheckCache:
    """The check, computed at most once per ``ttl`` seconds: the panel and every
    ``/metrics`` scrape read it, and it aggregates 30 days of samples and jobs."""

    def __init__(self, ledger: Ledger, ttl: float, clock: Any = time.monotonic) -> None:
        self.ledger, self.ttl, self._clock = ledger, ttl, clock
        self._lock = threading.Lock()
        self._cached: _Cached | None = None

    def get(self, now: datetime) -> dict[str, Any]:
        with self._lock:
            t = self._clock()
            if self._cached is None or t - self._cached.at >= self.ttl:
                self._cached = _Cached(t, capacity_check(self.ledger, now))
            return self._cached.value
