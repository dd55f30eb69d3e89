"""The job state machine; every transition is checked and recorded with its reason.

queued → starting → running → (preempting → preempted → queued)* → completed | failed |
cancelled | timed-out. A runner that dies without a word goes back to queued (with
backoff) from starting, running or preempting.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import inspect
from sqlalchemy.orm import Session

from gpuslice.errors import GPUSliceError
from gpuslice.vocab import ACTIVE_JOB_STATES as ACTIVE
from gpuslice.vocab import PRIORITY_CLASSES
from gpuslice.vocab import TERMINAL_JOB_STATES as TERMINAL

from ..db.jobs_models import JobRow, JobTransitionRow
from ..db.models import utcnow
from .job_writes import record_transition, write_job

__all__ = ["ACTIVE", "ALLOWED", "PRIORITY_CLASSES", "TERMINAL", "advance", "transition"]
ALLOWED: dict[str, frozenset[str]] = {
    "queued": frozenset({"starting", "cancelled", "failed"}),
    "starting": frozenset({"running", "queued", "completed", "failed", "cancelled", "preempting"}),
    "running": frozenset({"preempting", "queued", "completed", "failed", "cancelled", "timed-out"}),
    "preempting": frozenset({"preempted", "completed", "failed", "cancelled", "timed-out"}),
    "preempted": frozenset({"queued", "cancelled"}),
}


class InvalidTransition(GPUSliceError, RuntimeError):
    pass


def _burst_run_ended(job: Any, now: datetime) -> dict[str, Any]:
    """A run in the burst partition is over (whatever ended it: completion, a requeue, a
    cancel, its time limit): add its GPU-seconds there to what the job bought, once (the
    start it was counted from is dropped with it). The columns that change, if any."""
    ref = dict(job.backend_ref or {})
    started = ref.pop("burst_started_at", None)
    if started is None:
        return {}
    seconds = max(0.0, (now - datetime.fromisoformat(started)).total_seconds())
    gpus = ref.get("burst_milli", 0) / 1000
    return {
        "burst_gpu_seconds": (job.burst_gpu_seconds or 0.0) + seconds * gpus,
        "backend_ref": ref,
    }


def _moved(job: Any, state: str, now: datetime) -> dict[str, Any]:
    """The columns a move of ``job`` (as read) to ``state`` at ``now`` sets: the one
    definition of what a transition writes in the job's row, whichever way it is written."""
    if state not in ALLOWED.get(job.state, frozenset()):
        raise InvalidTransition(f"job {job.id}: {job.state} → {state} is not allowed")
    out: dict[str, Any] = {"state": state}
    if state in TERMINAL:
        out["finished_at"] = now
        # why it waited is over too (a job cancelled while pending kept "Resources")
        out["waiting_reason"] = None
    if state not in ACTIVE:
        out.update(_burst_run_ended(job, now))
    return out


def transition(s: Session, job: JobRow, state: str, reason: str) -> None:
    old = job.state
    now = utcnow()
    for key, value in _moved(job, state, now).items():
        setattr(job, key, value)
    row = JobTransitionRow(from_state=old, state=state, at=now, reason=reason[:1024])
    if "transitions" in inspect(job).unloaded:
        # not read in this session: add the row without loading the job's whole history
        row.job_id = job.id
        s.add(row)
    else:
        job.transitions.append(row)
    s.flush()


def advance(
    s: Session,
    seen: Any,
    state: str,
    reason: str,
    values: Callable[[Any], dict[str, Any] | None] = lambda row: {},
) -> bool:
    """Move the job a pass read as ``seen`` (a row with its revision) from the state it
    read to ``state``, setting ``values(row)`` with it: what :func:`transition` does, for
    the moves a scheduler pass makes thousands of times a day.

    While the row is as read (its revision unmoved), in two statements and no ORM object:
    loading the row again and flushing it cost about half of those passes' time. Otherwise
    (another write came between) the row is read again and the move made through
    :func:`transition` if it is still in the state the pass saw. ``values`` is given the
    row the move is made from, so what it works out from it holds; None from it: no move.
    False when nothing was written."""
    if getattr(seen, "revision", None) is not None:
        now = utcnow()
        fields = values(seen)
        if fields is None:
            return False
        moved = _moved(seen, state, now)
        if moved.keys() & fields.keys():
            raise ValueError(f"a transition sets {sorted(moved.keys() & fields.keys())} itself")
        conn = s.connection()
        if write_job(conn, seen.id, {**fields, **moved}, revision=seen.revision):
            record_transition(conn, seen.id, seen.state, state, now, reason)
            return True
    row = s.get(JobRow, seen.id)
    if row is None or row.state != seen.state:
        return False
    fields = values(row)
    if fields is None:
        return False
    for key, value in fields.items():
        setattr(row, key, value)
    transition(s, row, state, reason)
    return True
