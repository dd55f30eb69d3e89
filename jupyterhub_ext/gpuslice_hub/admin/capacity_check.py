"""The capacity check: is our queue a capacity problem or a scheduling problem?

Over the last 7 and 30 days it sets the pool's allocation rate against its effective
utilization (from the usage samples the admin panel plots), and the batch queue's wait
against the jobs' run time, then applies the decision lines GPU admins use:

- allocation steadily above 60 % (both windows, with samples over most of each): owning
  the hardware pays; steadily below 40 %: renting would (a rented GPU is paid for every
  allocated hour, busy or not);
- a queue while the holders that report keep less than half of what they hold busy is a
  scheduling problem (slices held but unused: reclaim and packing gain more than
  hardware); a queue with the pool allocated and busy is a capacity problem; with too few
  reports, the check says it cannot tell;
- a median queue time above half the median run time over the last 7 days: burst now
  (once any scheduling problem is fixed).

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

from gpuslice.isotime import iso

from ..db.jobs_models import JobRow
from ..ledger import Ledger
from .usage import SAMPLES

WINDOWS_DAYS = (7, 30)
OWN_ABOVE = 0.60
RENT_BELOW = 0.40
# A queue with the pool this allocated, and at least this share of the allocation busy,
# is short of hardware; with less of it busy, it is short of scheduling.
FULL_ALLOCATION = 0.80
BUSY_SHARE = 0.50
BURST_QUEUE_TO_RUN = 0.5
# There is a queue when the median wait was more than a tenth of the median run (or, with
# too few jobs for medians, when on average at least one job waited).
QUEUED_JOBS = 1.0
QUEUE_TO_RUN = 0.1
# Below this share of the allocation covered by usage reports (or of samples whose use is
# known), use is unknown: no capacity-or-scheduling verdict.
MIN_COVERED = 0.5
# The own/rent lines need samples over this share of both windows.
HISTORY_SHARE = 0.8
# Fewer finished jobs than this say nothing about a queue.
MIN_JOBS = 5
JOBS = cast(Table, JobRow.__table__)


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or not den:
        return None
    return round(num / den, 4)


def _pool_figures(ledger: Ledger, since: datetime, until: datetime) -> dict[str, Any]:
    """Allocation and use over the samples in [since, until], against the hardware's
    capacity (drained GPUs included: they are paid for, and their holders count as
    allocated).

    A sample's use is known when a usage report covered it, or when nothing was allocated
    (nothing allocated is nothing used); samples whose use is unknown are left out of the
    effective utilization, and ``use_known_share`` says how many that was. ``busy_share`` is
    how busy the reporting holders kept what they held: the figure that tells slices held
    idle from a busy pool, whatever share of the pool reports.
    """
    c = SAMPLES.c
    known = or_(c.used_milli.is_not(None), c.allocated_milli == 0)
    reported = c.used_milli.is_not(None)
    with ledger.db.reading() as s:
        row = (
            s.connection()
            .execute(
                select(
                    func.count(),
                    func.min(c.ts),
                    func.sum(c.allocated_milli),
                    func.sum(c.capacity_milli),
                    func.sum(case((known, 1), else_=0)),
                    func.sum(case((known, func.coalesce(c.used_milli, 0)), else_=0)),
                    func.sum(case((known, c.capacity_milli), else_=0)),
                    func.sum(case((reported, c.reported_milli), else_=0)),
                    func.sum(case((reported, c.allocated_milli), else_=0)),
                    func.sum(case((reported, c.used_milli), else_=0)),
                    func.avg(c.queued_jobs),
                ).where(c.ts >= since, c.ts <= until)
            )
            .one()
        )
    (n, first, allocated, capacity, n_known, used, known_capacity) = row[:7]
    (covered, covered_of, covered_used, queued) = row[7:]
    return {
        "samples": int(n or 0),
        "first_sample": iso(first) if first is not None else None,
        # how much of the window the samples span (from the first one to the window's end)
        "history_days": round((until - first).total_seconds() / 86400, 2) if first else 0.0,
        "allocation_rate": _ratio(allocated, capacity),
        "effective_utilization": _ratio(used, known_capacity),
        "use_known_share": _ratio(n_known, n),
        # the share of the allocation the usage reports covered, where use was known:
        # below 1, the effective utilization is a lower bound
        "reported_share": _ratio(covered, covered_of),
        "busy_share": _ratio(covered_used, covered),
        "mean_queued_jobs": round(float(queued), 2) if queued is not None else None,
    }


def _job_figures(ledger: Ledger, since: datetime, now: datetime) -> dict[str, Any]:
    """Queue time (submission to first start) of the batch jobs submitted in the window
    (a job still queued counts the wait so far), and run time of those that completed. Jobs
    limited to a time window wait for it by design: they are counted apart."""
    c = JOBS.c
    with ledger.db.reading() as s:
        conn = s.connection()
        submitted = conn.execute(
            select(c.submitted_at, c.started_at, c.finished_at, c.time_window).where(
                c.submitted_at >= since
            )
        ).all()
        runs = conn.execute(
            select(c.run_seconds).where(
                and_(c.state == "completed", c.finished_at >= since, c.finished_at <= now)
            )
        ).all()
    waits = [
        max(((started or finished or now) - sub).total_seconds(), 0.0)
        for sub, started, finished, window in submitted
        if window is None
    ]
    run_times = [float(r[0]) for r in runs]
    wait = statistics.median(waits) if waits else None
    run = statistics.median(run_times) if run_times else None
    return {
        "jobs_submitted": len(waits),
        "jobs_in_time_windows": len(submitted) - len(waits),
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


def _ownership(windows: dict[int, dict[str, Any]]) -> dict[str, str]:
    rates = [windows[d]["allocation_rate"] for d in WINDOWS_DAYS]
    short = [d for d in WINDOWS_DAYS if windows[d]["history_days"] < HISTORY_SHARE * d]
    if short:
        have = windows[WINDOWS_DAYS[-1]]["history_days"]
        return {
            "code": "history",
            "text": f"The usage samples cover {have:g} days: too little history to say "
            f"whether owning or renting pays (that needs {HISTORY_SHARE:.0%} of both the "
            f"7 and the 30 days).",
        }
    pairs = zip(WINDOWS_DAYS, rates, strict=True)
    said = "allocated " + ", ".join(f"{_pct(r)} over {d} days" for d, r in pairs if r is not None)
    if all(r is not None and r > OWN_ABOVE for r in rates):
        return {
            "code": "own",
            "text": f"The pool is steadily above {_pct(OWN_ABOVE)} allocated ({said}): "
            "owning the hardware pays.",
        }
    if all(r is not None and r < RENT_BELOW for r in rates):
        return {
            "code": "rent",
            "text": f"The pool is steadily below {_pct(RENT_BELOW)} allocated ({said}): "
            "renting the GPUs by the hour would cost less than owning them.",
        }
    return {
        "code": "between",
        "text": f"The pool is not steadily above {_pct(OWN_ABOVE)} or below "
        f"{_pct(RENT_BELOW)} allocated ({said}): neither decision line is crossed.",
    }


def _queue(week: dict[str, Any]) -> dict[str, str] | None:
    """What kind of problem a queue is (None: there is no queue)."""
    ratio = week["queue_to_run"]
    if ratio is not None:
        queued = ratio > QUEUE_TO_RUN
    else:  # too few jobs for medians: the samples' queue length
        queued = (week["mean_queued_jobs"] or 0) >= QUEUED_JOBS
    if not queued:
        return None
    alloc, busy = week["allocation_rate"] or 0.0, week["busy_share"]
    reported, known = week["reported_share"], week["use_known_share"]
    if busy is None or (reported or 0) < MIN_COVERED or (known or 0) < MIN_COVERED:
        return {
            "code": "use-unknown",
            "text": f"Jobs queue while the pool is {_pct(alloc)} allocated (7 days), but usage "
            "reports covered too little of the allocation to tell a capacity problem from "
            "slices held idle (holders that do not report: servers without the extension, "
            "jobs outside gpuslice).",
        }
    if busy < BUSY_SHARE:
        return {
            "code": "scheduling",
            "text": f"A scheduling problem: jobs queue while the pool is {_pct(alloc)} "
            f"allocated, and what the usage reports cover was only {_pct(busy)} busy (7 "
            "days). Slices are held idle: idle reclaim, smaller slices and preemptible "
            "backfill gain more than hardware.",
        }
    if alloc >= FULL_ALLOCATION:
        return {
            "code": "capacity",
            "text": f"A capacity problem: jobs queue while the pool is {_pct(alloc)} "
            f"allocated and what the usage reports cover was {_pct(busy)} busy (7 days).",
        }
    return {
        "code": "fit",
        "text": f"Jobs queue while only {_pct(alloc)} of the pool is allocated (7 days): "
        "what is free does not fit what waits (quotas, fragmentation or profiles), a "
        "scheduling problem.",
    }


def _no_queue(week: dict[str, Any]) -> str:
    """Why the week's queue is no problem, by the rule ``_queue`` applied: a job may have
    waited (the panel lists it), just not long enough to count."""
    ratio = week["queue_to_run"]
    if ratio is not None:
        return (
            f"No lasting batch queue in the last 7 days: the median queue time was "
            f"{_pct(ratio)} of the median run time (a queue counts above "
            f"{_pct(QUEUE_TO_RUN)})."
        )
    return (
        f"No lasting batch queue in the last 7 days: on average "
        f"{week['mean_queued_jobs'] or 0:.1f} jobs waited (a queue counts from "
        f"{QUEUED_JOBS:g}; too few jobs finished for median times)."
    )


def _verdicts(windows: dict[int, dict[str, Any]]) -> list[dict[str, str]]:
    week = windows[7]
    if all(windows[d]["samples"] == 0 for d in WINDOWS_DAYS):
        return [
            {
                "code": "no-data",
                "text": "No usage samples yet: the check needs the usage sampler "
                "(usage_sample_interval) to have run.",
            }
        ]
    out = [_ownership(windows)]
    problem = _queue(week)
    if problem is None:
        out.append({"code": "no-queue", "text": _no_queue(week)})
        return out
    out.append(problem)
    ratio = week["queue_to_run"]
    if ratio is not None and ratio > BURST_QUEUE_TO_RUN:
        said = (
            f"The median queue time is {_pct(ratio)} of the median run time over 7 days "
            f"(above {_pct(BURST_QUEUE_TO_RUN)})"
        )
        out.append(
            {
                "code": "burst",
                "text": said + ": burst now."
                if problem["code"] == "capacity"
                else said + ": bursting would shorten it, but the problem above is cheaper "
                "to fix first.",
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
            t, cached = self._clock(), self._cached
        if cached is not None and t - cached.at < self.ttl:
            return cached.value
        # computed outside the lock: a database that hangs ties up one caller, not every
        # scrape and panel behind it (two computing at once is harmless)
        value = capacity_check(self.ledger, now)
        with self._lock:
            self._cached = _Cached(t, value)
        return value
