"""Burst: a burstable job that waits too long in its own Slurm partition is moved to a
second one (JobManager.burst_partition: another cluster's nodes, in production a cloud
partition), and comes back to its own when it is preempted or requeued there.

Slurm still schedules everything: a move is ``scontrol update Partition=`` of a pending
job, which Slurm refuses once the job has started (then nothing moved). When to move is
gpuslice's: once a job has waited ``burst_after_wait`` of its expected run time (its
max_runtime), or at once while the cluster has been more than ``burst_when_allocated_above``
allocated for ``HIGH_FOR`` with jobs waiting. A run there resumes from the job's checkpoint
like any run; it holds nothing in this cluster's ledger, and its GPU-hours are counted as
bought (``JobRow.burst_gpu_seconds``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..db.jobs_models import JobRow
from ..ledger.base import quota_usage
from .backends.base import RunStatus

if TYPE_CHECKING:
    from .manager import JobManager

HIGH_FOR = timedelta(minutes=10)


class Burst:
    def __init__(self, jobs: JobManager, log: logging.Logger) -> None:
        self.jobs = jobs
        self.log = log
        self.partition = jobs.burst_partition
        # since when each job has waited in the engine's queue (this service's life: after
        # a restart a job's wait is counted from its submission, or from the restart when
        # it ran before)
        self._since: dict[int, datetime] = {}
        self._high_since: datetime | None = None

    def _allocated_share(self) -> float:
        """Allocated milli-GPU over the GPUs in service, now."""
        _, gpus, active = self.jobs.ledger.snapshot()
        capacity = 1000 * sum(1 for g in gpus if g.present and not g.drained)
        return sum(a.gpu_milli for a in active) / capacity if capacity else 0.0

    def _high(self, now: datetime) -> bool:
        """Whether allocation has stayed above the threshold for ``HIGH_FOR``."""
        above = self.jobs.burst_when_allocated_above
        if not above or self._allocated_share() <= above:
            self._high_since = None
            return False
        if self._high_since is None:
            self._high_since = now
        return now - self._high_since >= HIGH_FOR

    def pass_(self, queued: Sequence[Any], statuses: dict[int, RunStatus], now: datetime) -> None:
        """Move the waiting burstable jobs that are due (``queued``: the pass's rows)."""
        waiting = [
            job
            for job in queued
            if (st := statuses.get(job.id)) is not None and st.alive and not st.node
        ]
        seen = {job.id for job in waiting}
        for job_id in list(self._since):
            if job_id not in seen:
                del self._since[job_id]
        high: bool | None = None  # asked only when a burstable job waits
        for job in waiting:
            ref = job.backend_ref or {}
            since = self._since.setdefault(job.id, job.submitted_at if "run" not in ref else now)
            if not job.burstable or ref.get("burst"):
                continue
            waited = (now - since).total_seconds()
            why = ""
            if waited >= self.jobs.burst_after_wait * job.max_runtime:
                why = (
                    f"it waited {_duration(waited)}, {self.jobs.burst_after_wait:g} of its "
                    f"expected run time ({_duration(job.max_runtime)})"
                )
            else:
                high = self._high(now) if high is None else high
                if high:
                    above = self.jobs.burst_when_allocated_above
                    why = f"this cluster has been more than {above:.0%} allocated for 10 minutes"
            if why:
                self._send(job, ref, why)

    def _send(self, job: Any, ref: dict[str, Any], why: str) -> None:
        backend: Any = self.jobs.backend
        try:
            backend.move(ref, self.partition)
        except (RuntimeError, OSError) as e:
            # started meanwhile (Slurm refuses to move a running job), or scontrol failed:
            # the next pass looks again
            self.log.info("job %s: not moved to %s: %s", job.id, self.partition, e)
            return
        with self.jobs.db.writing() as s:
            row = s.get(JobRow, job.id)
            if row is None or row.state != "queued":
                return
            row.backend_ref = {**(row.backend_ref or {}), "burst": True}
            row.bursts = (row.bursts or 0) + 1
            row.waiting_reason = f"sent to the burst partition {self.partition}: {why}"
        self.log.info("job %s: sent to the burst partition %s: %s", job.id, self.partition, why)

    def come_back(self, job_id: int, priority: str) -> None:
        """A job preempted or requeued in the burst partition waits in its own again."""
        backend: Any = self.jobs.backend
        home = backend.home_partition(priority)
        row = self.jobs.row(job_id)
        if row is None or row.state != "queued":
            return
        ref = row.backend_ref or {}
        try:
            backend.move(ref, home)
        except (RuntimeError, OSError) as e:
            # already running again there: it stays a burst run, accounted as one
            self.log.info("job %s: not moved back to %s: %s", job_id, home, e)
            return
        with self.jobs.db.writing() as s:
            fresh = s.get(JobRow, job_id)
            if fresh is not None and fresh.state == "queued":
                fresh.backend_ref = {**(fresh.backend_ref or {}), "burst": False}
                fresh.waiting_reason = (
                    f"preempted in the burst partition {self.partition}; back in {home}'s queue"
                )
        self._since.pop(job_id, None)

    def account(self, job: Any, now: datetime) -> None:
        """Count the GPU-seconds of a run in the burst partition that just ended."""
        ref = job.backend_ref or {}
        started = job.attempt_started_at
        if not ref.get("burst") or started is None:
            return
        profile = self.jobs.ledger.profiles.get(job.profile)
        if profile is None:
            return
        with self.jobs.ledger.db.reading() as s:
            milli = quota_usage(profile, self.jobs.ledger.inventory_cache.get(s)).milli
        seconds = max(0.0, (now - started).total_seconds()) * milli / 1000 * job.slices
        with self.jobs.db.writing() as s:
            row = s.get(JobRow, job.id)
            if row is not None:
                row.burst_gpu_seconds = (row.burst_gpu_seconds or 0.0) + seconds


def _duration(seconds: float) -> str:
    """``seconds`` as people say it: "45 s", "12 min", "2 h 5 min"."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"
