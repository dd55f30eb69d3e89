"""The queue as the scheduler's pass reads it, kept between passes.

With thousands of jobs queued, reading every queued job's decision columns (its groups as
JSON, its timestamps) cost most of a pass, and a pass comes after every change. But every
change to those columns writes a job transition in the same transaction (a submission, a
start, a cancel, a requeue with its backoff), except the waiting reason, which only the
pass itself writes. So a pass reads again only the jobs that have transitions it has not
seen.

Transition ids are taken when a row is inserted and become visible when its transaction
commits, so on PostgreSQL a lower id can appear after a higher one was read: each pass
looks back at least ``LOOKBACK`` ids for transitions it has not applied (it counts them, and
reads them only when the count differs from those it applied; every transition is written under
the ledger lock, so ids commit in order today: this is a safety net). Counting is enough
because ids only grow: history pruning keeps the newest transition's job (SQLite would hand
deleted highest ids out again). The whole queue is read again when ids went back anyway
(someone deleted rows by hand) and every ``FULL_READ_PASSES`` passes whatever happened
(counted in passes, not seconds: the service passes at least every second, a simulation
minutes of its time apart).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import Session

from ..db.jobs_models import JobRow, JobTransitionRow
from ..db.lean import Lean
from .ordering import micros

QUEUED_COLUMNS = (
    JobRow.id,
    JobRow.user,
    JobRow.groups,
    JobRow.profile,
    JobRow.slices,
    JobRow.priority_class,
    JobRow.submitted_at,
    JobRow.not_before,
    JobRow.waiting_reason,
    JobRow.time_window,
    # how long it may run: a job may backfill behind a blocked one if it ends before that
    # one's reservation (reservation.py)
    JobRow.max_runtime,
    JobRow.run_seconds,
)
LOOKBACK = 200
FULL_READ_PASSES = 100
CHUNK = 500  # job ids per statement (old SQLite takes at most 999 parameters)
NEWEST_TRANSITION = Lean(select(func.max(JobTransitionRow.id)))
# Built once: building a statement costs about what running it does on SQLite.
ALL_QUEUED = Lean(select(*QUEUED_COLUMNS).where(JobRow.state == "queued"), named=True)
SOME = Lean(
    select(*QUEUED_COLUMNS, JobRow.state).where(JobRow.id.in_(bindparam("ids", expanding=True))),
    named=True,
)
TRANSITIONS_AFTER = Lean(
    select(JobTransitionRow.id, JobTransitionRow.job_id).where(
        JobTransitionRow.id > bindparam("after")
    )
)
COUNT_BETWEEN = Lean(
    select(func.count())
    .select_from(JobTransitionRow)
    .where(JobTransitionRow.id > bindparam("after"), JobTransitionRow.id <= bindparam("upto"))
)


@dataclass
class QueuedJob:
    """What a pass decides a queued job with (``queue_order``'s ``Queued`` too)."""

    id: int
    user: str
    groups: tuple[str, ...]
    profile: str
    slices: int
    priority_class: str
    submitted_at: datetime
    not_before: datetime | None
    waiting_reason: str | None
    time_window: str | None
    # submitted_at in microseconds since the epoch, worked out once (queue_order)
    submitted_us: int
    max_runtime: float = 86400.0
    run_seconds: float = 0.0

    @classmethod
    def of(cls, row: Any) -> QueuedJob:
        groups = tuple(row.groups or ())
        return cls(
            row.id,
            row.user,
            groups,
            row.profile,
            row.slices,
            row.priority_class,
            row.submitted_at,
            row.not_before,
            row.waiting_reason,
            row.time_window,
            micros(row.submitted_at),
            float(row.max_runtime),
            float(row.run_seconds or 0.0),
        )


class QueueCache:
    def __init__(self) -> None:
        self.jobs: dict[int, QueuedJob] = {}
        self._newest: int | None = None  # the newest transition id read
        # (transition id, job id) within the look-back (after ``_low``, up to ``_newest``:
        # between one and two LOOKBACKs), applied: as many as the database has there means
        # none came late
        self._applied: set[tuple[int, int]] = set()
        self._low = 0
        self._passes = 0  # since the last full read

    def read(self, s: Session, newest: int | None = None) -> list[QueuedJob]:
        """The queued jobs, as of this transaction. ``newest``: the newest transition id,
        when the caller read it in this transaction."""
        conn = s.connection()
        self._passes += 1
        newest_now = newest if newest is not None else NEWEST_TRANSITION.execute(conn).scalar()
        newest_now = newest_now or 0
        # Ids that went back (SQLite reuses the highest ids once someone deleted
        # them): what is new can no longer be told by id, read everything.
        went_back = self._newest is not None and newest_now < self._newest
        if self._newest is None or self._passes > FULL_READ_PASSES or went_back:
            # what was applied is read before the rows: a transition committed in between
            # is not in it, and the next pass reads its job again
            newest = NEWEST_TRANSITION.execute(conn).scalar() or 0
            self._remember(s, newest)
            rows = ALL_QUEUED.execute(conn).rows
            self.jobs = {r.id: QueuedJob.of(r) for r in rows}
            self._passes = 1
            return list(self.jobs.values())
        window = self._low
        new = [
            (tid, job_id)
            for tid, job_id in TRANSITIONS_AFTER.execute(conn, {"after": self._newest}).rows
        ]
        # The look-back: as many transitions within it as were applied means none came late
        # (a count, not the rows: those are what was applied). Otherwise it is read again.
        within = COUNT_BETWEEN.execute(conn, {"after": window, "upto": self._newest}).scalar()
        everything: list[tuple[int, int]] | None = None
        if within == len(self._applied):
            fresh = new  # (all after the newest applied)
        else:
            after = TRANSITIONS_AFTER.execute(conn, {"after": window}).rows
            everything = [(tid, job_id) for tid, job_id in after]
            fresh = [t for t in everything if t not in self._applied]
        changed = {job_id for _, job_id in fresh}
        if changed:
            ids = sorted(changed)
            # in chunks: a database takes a bounded number of parameters per statement
            changed_rows: list[Any] = []
            for at in range(0, len(ids), CHUNK):
                changed_rows += SOME.execute(conn, {"ids": ids[at : at + CHUNK]}).rows
            found = set()
            for r in changed_rows:
                found.add(r.id)
                if r.state == "queued":
                    self.jobs[r.id] = QueuedJob.of(r)
                else:
                    self.jobs.pop(r.id, None)
            for gone in changed - found:  # deleted (history pruning)
                self.jobs.pop(gone, None)
        if everything is not None:
            self._applied = set(everything)
            self._newest = max((tid for tid, _ in everything), default=self._newest)
        elif new:  # (else what was applied stands as it is)
            self._applied.update(new)
            self._newest = max(tid for tid, _ in new)
        if self._newest - self._low > 2 * LOOKBACK:  # (not at each new transition: a look at each)
            self._low = self._newest - LOOKBACK
            self._applied = {t for t in self._applied if t[0] > self._low}
        return list(self.jobs.values())

    def _remember(self, s: Session, newest: int) -> None:
        self._newest, self._low = newest, newest - LOOKBACK
        rows = TRANSITIONS_AFTER.execute(s.connection(), {"after": self._low}).rows
        self._applied = {(tid, job_id) for tid, job_id in rows}

    def reasons_written(self, reasons: dict[int, str]) -> None:
        """The pass wrote these waiting reasons (the one write without a transition)."""
        for job_id, reason in reasons.items():
            job = self.jobs.get(job_id)
            if job is not None:
                job.waiting_reason = reason
