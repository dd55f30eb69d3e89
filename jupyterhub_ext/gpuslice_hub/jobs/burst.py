"""Burst: a burstable job that waits too long in its own Slurm partition is moved to a
second one (JobManager.burst_partition: another cluster's nodes, in production a cloud
partition), and comes back to its own when it is preempted or requeued there.

Slurm still schedules everything: a move is ``scontrol update Partition=`` of a pending
job (as its owner: Slurm checks the partition's access rules), which Slurm refuses once
the job has started. When to move is gpuslice's: once a job has waited
``burst_after_wait`` of its expected run time (its max_runtime), or, while this cluster
has been more than ``burst_when_allocated_above`` allocated for ``HIGH_FOR``, once it has
waited ``HIGH_MIN_WAIT``. Where a run is comes from Slurm (its partition in the pass's
query), never from gpuslice's own record of what it asked for: a run in the burst
partition holds nothing in this cluster's ledger, and its GPU-hours there are counted as
bought when it ends (``states.transition``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..db.jobs_models import JobRow
from ..durations import spoken
from .backends.base import RunStatus

if TYPE_CHECKING:
    from .manager import JobManager

HIGH_FOR = timedelta(minutes=10)
# a job sent because the cluster is full has waited at least this (not one pass, nor
# right after it came back)
HIGH_MIN_WAIT = timedelta(minutes=5)
# a move Slurm refused (the partition's access rules, a limit) is tried again after this
RETRY = timedelta(minutes=10)


def reason_to_send(
    waited: timedelta, expected_seconds: float, after_wait: float, high: bool, above: float
) -> str:
    """Why a job that has ``waited`` should be sent to the burst partition now ("": it
    should not): it waited ``after_wait`` of its expected run time, or ``high`` (the
    cluster has stayed above ``above`` allocated) and it waited ``HIGH_MIN_WAIT``. The
    simulator asks the same question of its queue (benchmarks/sim)."""
    if waited.total_seconds() >= after_wait * expected_seconds:
        return (
            f"it waited {spoken(waited.total_seconds())}, {after_wait:g} of its expected run time "
            f"({spoken(expected_seconds)})"
        )
    if high and waited >= HIGH_MIN_WAIT:
        return f"this cluster has been more than {above:.0%} allocated for 10 minutes"
    return ""


def waiting_since(job: Any) -> datetime:
    """Since when a queued job waits for this run: its last (re)submission or requeue."""
    raw = (job.backend_ref or {}).get("waiting_since")
    return datetime.fromisoformat(raw) if raw else job.submitted_at


class Burst:
    def __init__(self, jobs: JobManager, log: logging.Logger) -> None:
        self.jobs = jobs
        self.log = log
        self.partition = jobs.burst_partition
        self._high_since: datetime | None = None

    def allocated_share(self) -> float:
        """What is held of the GPUs in service (present, not drained), over them."""
        _, gpus, active = self.jobs.ledger.snapshot()
        serving = {g.uuid for g in gpus if g.present and not g.drained}
        held = sum(c.milli for a in active for c in a.claims if c.active and c.gpu_uuid in serving)
        return held / (1000 * len(serving)) if serving else 0.0

    def high(self, now: datetime) -> bool:
        """Whether allocation has stayed above the threshold for ``HIGH_FOR`` (sampled at
        every pass)."""
        above = self.jobs.burst_when_allocated_above
        if not above or self.allocated_share() <= above:
            self._high_since = None
            return False
        if self._high_since is None:
            self._high_since = now
        return now - self._high_since >= HIGH_FOR

    def pass_(self, queued: Sequence[Any], statuses: dict[int, RunStatus], now: datetime) -> None:
        """Move the waiting burstable jobs that are due, and bring back those whose move
        home failed (``queued``: the pass's rows)."""
        high = self.high(now)
        for job in queued:
            st = statuses.get(job.id)
            if st is None or not st.alive or st.node or not job.burstable:
                continue
            ref = job.backend_ref or {}
            if ref.get("return_to"):
                self._return(job.id, ref, now)
                continue
            if ref.get("burst") or now < _at(ref.get("burst_retry_at"), now):
                continue
            why = reason_to_send(
                now - waiting_since(job),
                job.max_runtime,
                self.jobs.burst_after_wait,
                high,
                self.jobs.burst_when_allocated_above,
            )
            if why:
                self._send(job.id, ref, why, now)

    def _send(self, job_id: int, ref: dict[str, Any], why: str, now: datetime) -> None:
        backend: Any = self.jobs.backend
        try:
            backend.move(ref, self.partition)
            moved, said = True, f"sent to the burst partition {self.partition}: {why}"
        except (RuntimeError, OSError) as e:
            # started meanwhile (then it is no longer waiting), or Slurm refused (the
            # partition's access rules, a limit): said, and tried again later
            moved = False
            said = f"could not be sent to the burst partition {self.partition} ({e})"
        with self.jobs.db.writing() as s:
            row = s.get(JobRow, job_id)
            if row is None or row.state != "queued":
                return
            if moved:
                row.backend_ref = {**(row.backend_ref or {}), "burst": True}
                row.bursts = (row.bursts or 0) + 1
            else:
                retry = (now + RETRY).isoformat()
                row.backend_ref = {**(row.backend_ref or {}), "burst_retry_at": retry}
            row.waiting_reason = said[:1024]
        self.jobs.log_line(row, said)
        self.log.info("job %s: %s", job_id, said)

    def come_back(self, job_id: int, priority: str, now: datetime) -> None:
        """A job preempted or requeued in the burst partition waits in its own again."""
        home = self.jobs.backend.home_partition(priority)  # type: ignore[attr-defined]
        with self.jobs.db.writing() as s:
            row = s.get(JobRow, job_id)
            if row is None or row.state != "queued":
                return
            # remembered first: a move that fails is tried again at the next pass
            ref = {**(row.backend_ref or {}), "return_to": home}
            row.backend_ref = ref
        self._return(job_id, ref, now)

    def _return(self, job_id: int, ref: dict[str, Any], now: datetime) -> None:
        home = ref["return_to"]
        try:
            self.jobs.backend.move(ref, home)  # type: ignore[attr-defined]
        except (RuntimeError, OSError) as e:
            self.log.warning("job %s: not moved back to %s yet: %s", job_id, home, e)
            return
        said = f"preempted in the burst partition {self.partition}; back in {home}'s queue"
        with self.jobs.db.writing() as s:
            row = s.get(JobRow, job_id)
            if row is None or row.state != "queued":
                return
            back = {**(row.backend_ref or {}), "burst": False, "waiting_since": now.isoformat()}
            back.pop("return_to", None)
            row.backend_ref = back
            row.waiting_reason = said
        self.jobs.log_line(row, said)


def _at(raw: Any, default: datetime) -> datetime:
    return datetime.fromisoformat(raw) if isinstance(raw, str) else default
