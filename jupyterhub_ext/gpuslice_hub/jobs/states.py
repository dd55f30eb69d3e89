"""The job state machine; every transition is checked and recorded with its reason.

queued → starting → running → (preempting → preempted → queued)* → completed | failed |
cancelled | timed-out. A runner that dies without a word goes back to queued (with
backoff) from starting, running or preempting.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from ..db.jobs_models import JobRow, JobTransitionRow
from ..db.models import utcnow

PRIORITY_CLASSES = {"preemptible": 0, "normal": 1, "high": 2}
TERMINAL = frozenset({"completed", "failed", "cancelled", "timed-out"})
ACTIVE = frozenset({"starting", "running", "preempting"})
ALLOWED: dict[str, frozenset[str]] = {
    "queued": frozenset({"starting", "cancelled", "failed"}),
    "starting": frozenset({"running", "queued", "completed", "failed", "cancelled", "preempting"}),
    "running": frozenset({"preempting", "queued", "completed", "failed", "cancelled", "timed-out"}),
    "preempting": frozenset({"preempted", "completed", "failed", "cancelled", "timed-out"}),
    "preempted": frozenset({"queued", "cancelled"}),
}


class InvalidTransition(RuntimeError):
    pass


def transition(s: Session, job: JobRow, state: str, reason: str) -> None:
    old = job.state
    if state not in ALLOWED.get(old, frozenset()):
        raise InvalidTransition(f"job {job.id}: {old} → {state} is not allowed")
    job.state = state
    now = utcnow()
    if state in TERMINAL:
        job.finished_at = now
    job.transitions.append(
        JobTransitionRow(from_state=old, state=state, at=now, reason=reason[:1024])
    )
    s.flush()
