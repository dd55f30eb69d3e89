"""The job state machine; every transition is checked and recorded with its reason.

queued → starting → running → (preempting → preempted → queued)* → completed | failed |
cancelled | timed-out. A runner that dies without a word goes back to queued (with
backoff) from starting, running or preempting.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import inspect
from sqlalchemy.orm import Session

from gpuslice.vocab import ACTIVE_JOB_STATES as ACTIVE
from gpuslice.vocab import PRIORITY_CLASSES
from gpuslice.vocab import TERMINAL_JOB_STATES as TERMINAL

from ..db.jobs_models import JobRow, JobTransitionRow
from ..db.models import utcnow

__all__ = ["ACTIVE", "ALLOWED", "PRIORITY_CLASSES", "TERMINAL", "transition"]
ALLOWED: dict[str, frozenset[str]] = {
    "queued": frozenset({"starting", "cancelled", "failed"}),
    "starting": frozenset({"running", "queued", "completed", "failed", "cancelled", "preempting"}),
    "running": frozenset({"preempting", "queued", "completed", "failed", "cancelled", "timed-out"}),
    "preempting": frozenset({"preempted", "completed", "failed", "cancelled", "timed-out"}),
    "preempted": frozenset({"queued", "cancelled"}),
}


class InvalidTransition(RuntimeError):
    pass


def _burst_run_ended(job: JobRow, now: datetime) -> None:
    """A run in the burst partition is over (whatever ended it: completion, a requeue, a
    cancel, its time limit): add its GPU-seconds there to what the job bought, once (the
    start it was counted from is dropped with it)."""
    ref = dict(job.backend_ref or {})
    started = ref.pop("burst_started_at", None)
    if started is None:
        return
    seconds = max(0.0, (now - datetime.fromisoformat(started)).total_seconds())
    gpus = ref.get("burst_milli", 0) / 1000
    job.burst_gpu_seconds = (job.burst_gpu_seconds or 0.0) + seconds * gpus
    job.backend_ref = ref


def transition(s: Session, job: JobRow, state: str, reason: str) -> None:
    old = job.state
    if state not in ALLOWED.get(old, frozenset()):
        raise InvalidTransition(f"job {job.id}: {old} → {state} is not allowed")
    job.state = state
    now = utcnow()
    if state in TERMINAL:
        job.finished_at = now
    if state not in ACTIVE:
        _burst_run_ended(job, now)
    row = JobTransitionRow(from_state=old, state=state, at=now, reason=reason[:1024])
    if "transitions" in inspect(job).unloaded:
        # not read in this session: add the row without loading the job's whole history
        row.job_id = job.id
        s.add(row)
    else:
        job.transitions.append(row)
    s.flush()
