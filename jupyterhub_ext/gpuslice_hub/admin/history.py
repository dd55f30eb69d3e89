"""History retention: events, job transitions and released allocations older than
``history_retention_days`` are deleted, about once a day.

What the deleted idle-reclaim events counted (the metrics' counters, the all-time reclaimed
GPU-hours) is folded into ``event_totals`` in the same transaction, so no figure an admin
reads goes down when history goes. ``history_through`` (on the ledger lock row) is the
newest event id folded in: readers take the totals for everything up to it and read the
events after it.

The newest event is never deleted: ids only grow (SQLite would hand a deleted top id out
again, and caches follow the newest id to notice changes).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Table, delete, func, select, update
from sqlalchemy.orm import Session

from gpuslice.vocab import IDLE_EVENT_KINDS, TERMINAL_JOB_STATES

from ..db.admin_models import EventTotalRow, UsageReportRow
from ..db.jobs_models import JobRow, JobTransitionRow
from ..db.models import AllocationRow, ClaimRow, EventRow, LedgerLock, utcnow
from ..ledger import Ledger

IDLE_KINDS = tuple(IDLE_EVENT_KINDS.values())
TOTALS = cast(Table, EventTotalRow.__table__)
EVENTS = cast(Table, EventRow.__table__)
BATCH = 5000  # rows per transaction: the ledger lock is never held for long
PRUNE_EVERY = 24 * 3600.0
RETRY_AFTER = 300.0
MIN_RETENTION_DAYS = 30.0  # the admin panel's longest window
# One cull frees at most a node's GPUs for the life of an allocation: 8 GPUs x 10 years.
MAX_RECLAIMED_HOURS = 8 * 24 * 366 * 10


def reclaimed_hours(detail: Any) -> float:
    """The GPU-hours an ``idle-culled`` event records, as the service wrote it; anything
    else stored there (a record from before the service computed it) counts as 0."""
    if not isinstance(detail, dict):
        return 0.0
    value = detail.get("reclaimed_gpu_hours")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    return float(value) if math.isfinite(value) and 0 <= value <= MAX_RECLAIMED_HOURS else 0.0


def event_scope(detail: Any) -> str:
    """``kernel`` or ``server``: what an idle event was about (older records say neither)."""
    detail = detail if isinstance(detail, dict) else {}
    return str(detail.get("scope") or ("kernel" if detail.get("kernel_id") else ""))[:16]


Key = tuple[str, str, str]  # (kind, profile, scope)


@dataclass
class IdleTotals:
    """Idle-reclaim events counted by (kind, profile, scope), with the GPU-hours the culls
    among them gave back, up to event id ``through``."""

    through: int = 0
    counts: Counter[Key] = field(default_factory=Counter)
    hours: dict[Key, float] = field(default_factory=dict)

    def add(self, kind: str, profile: str, detail: Any) -> None:
        """Count one recorded event."""
        key = (kind, profile, event_scope(detail))
        self.add_key(key, 1, reclaimed_hours(detail) if kind == "idle-culled" else 0.0)

    def add_key(self, key: Key, n: int, hours: float) -> None:
        self.counts[key] += n
        if hours:
            self.hours[key] = self.hours.get(key, 0.0) + hours

    def hours_by_profile(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for (_kind, profile, _scope), h in self.hours.items():
            out[profile] = out.get(profile, 0.0) + h
        return out

    def copy(self) -> IdleTotals:
        return IdleTotals(self.through, Counter(self.counts), dict(self.hours))


def pruned_through(s: Session) -> int:
    """The newest event id pruning has folded into the totals (0: none)."""
    through = s.execute(select(LedgerLock.history_through).where(LedgerLock.id == 1)).scalar()
    return int(through or 0)


def pruned_totals(s: Session) -> IdleTotals:
    """What pruning has folded away so far (read under ``ledger.history_lock``, which
    pruning holds: the totals and the events left are one consistent state)."""
    totals = IdleTotals(pruned_through(s))
    for row in s.execute(select(TOTALS)).all():
        key = (row.kind, row.profile, row.scope)
        totals.add_key(key, int(row._mapping["count"]), float(row.reclaimed_gpu_hours))
    return totals


@dataclass
class Pruned:
    events: int = 0
    transitions: int = 0
    allocations: int = 0

    def __bool__(self) -> bool:
        return bool(self.events or self.transitions or self.allocations)


def prune_history(ledger: Ledger, before: datetime, batch: int = BATCH) -> Pruned:
    """Delete what is older than ``before``; returns how much went."""
    pruned = Pruned()
    while (n := _prune_events(ledger, before, batch)) > 0:
        pruned.events += n
    while (n := _prune_transitions(ledger, before, batch)) > 0:
        pruned.transitions += n
    while (n := _prune_allocations(ledger, before, batch)) > 0:
        pruned.allocations += n
    return pruned


def _prune_events(ledger: Ledger, before: datetime, batch: int) -> int:
    with ledger.history_lock, ledger.db.writing() as s:
        conn = s.connection()
        newest = conn.execute(select(func.max(EVENTS.c.id))).scalar() or 0
        ids = (
            conn.execute(
                select(EVENTS.c.id)
                .where(EVENTS.c.ts < before, EVENTS.c.id < newest)
                .order_by(EVENTS.c.id)
                .limit(batch)
            )
            .scalars()
            .all()
        )
        if not ids:
            return 0
        # Ids and times grow together, but a clock step could leave a younger event
        # below an older one: everything up to the last id is folded and deleted, so
        # "up to history_through" stays exact.
        top = ids[-1]
        folded = IdleTotals()
        for kind, profile, detail in conn.execute(
            select(EVENTS.c.kind, EVENTS.c.profile, EVENTS.c.detail).where(
                EVENTS.c.id <= top, EVENTS.c.kind.in_(IDLE_KINDS)
            )
        ):
            folded.add(kind, profile or "", detail)
        for key, n in folded.counts.items():
            _add_total(s, key, n, folded.hours.get(key, 0.0))
        removed = conn.execute(delete(EVENTS).where(EVENTS.c.id <= top)).rowcount or 0
        conn.execute(update(LedgerLock).where(LedgerLock.id == 1).values(history_through=top))
        return int(removed)


def _add_total(s: Session, key: Key, n: int, hours: float) -> None:
    kind, profile, scope = key
    match = (TOTALS.c.kind == kind, TOTALS.c.profile == profile, TOTALS.c.scope == scope)
    conn = s.connection()
    changed = conn.execute(
        update(TOTALS)
        .where(*match)
        .values(
            count=TOTALS.c.count + n,
            reclaimed_gpu_hours=TOTALS.c.reclaimed_gpu_hours + hours,
        )
    ).rowcount
    if not changed:
        conn.execute(
            TOTALS.insert().values(
                kind=kind, profile=profile, scope=scope, count=n, reclaimed_gpu_hours=hours
            )
        )


def _prune_transitions(ledger: Ledger, before: datetime, batch: int) -> int:
    """The state history of jobs that ended before ``before``, each job's whole history at
    once (a live job, or one that ended since, keeps all of its own). The job with the
    newest transition keeps its history too: SQLite hands the highest ids out again once
    they are deleted, and the scheduler's kept queue (queue_cache.py) counts on transition
    ids that only grow."""
    with ledger.db.writing() as s:
        newest = s.execute(
            select(JobTransitionRow.job_id).order_by(JobTransitionRow.id.desc()).limit(1)
        ).scalar()
        ids = (
            s.execute(
                select(JobTransitionRow.id)
                .join(JobRow, JobRow.id == JobTransitionRow.job_id)
                .where(
                    JobRow.state.in_(TERMINAL_JOB_STATES),
                    JobRow.finished_at < before,
                    JobTransitionRow.job_id != newest,
                )
                .limit(batch)
            )
            .scalars()
            .all()
        )
        if ids:
            s.execute(delete(JobTransitionRow).where(JobTransitionRow.id.in_(ids)))
        return len(ids)


def _prune_allocations(ledger: Ledger, before: datetime, batch: int) -> int:
    """Allocations released before ``before``, with their claims and last usage report."""
    with ledger.db.writing() as s:
        ids = (
            s.execute(
                select(AllocationRow.id)
                .where(AllocationRow.active.is_(False), AllocationRow.released_at < before)
                .limit(batch)
            )
            .scalars()
            .all()
        )
        if ids:
            s.execute(delete(ClaimRow).where(ClaimRow.allocation_id.in_(ids)))
            s.execute(delete(UsageReportRow).where(UsageReportRow.allocation_id.in_(ids)))
            s.execute(delete(AllocationRow).where(AllocationRow.id.in_(ids)))
        return len(ids)


async def run_pruner(ledger: Ledger, retention_days: float, log: logging.Logger) -> None:
    """Prune at start, then about once a day; a failure is logged and retried."""
    while True:
        delay = PRUNE_EVERY
        try:
            before = utcnow() - timedelta(days=retention_days)
            pruned = await asyncio.to_thread(prune_history, ledger, before)
            if pruned:
                log.info(
                    "history older than %g days pruned: %d events, %d job transitions, "
                    "%d released allocations",
                    retention_days,
                    pruned.events,
                    pruned.transitions,
                    pruned.allocations,
                )
        except Exception:
            delay = RETRY_AFTER
            log.exception("pruning history failed; retrying in %gs", delay)
        await asyncio.sleep(delay)
