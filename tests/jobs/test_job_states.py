"""A job's move from one state to another, written in statements by a scheduler pass
(``states.advance``) or through the ORM (``states.transition``): both write the same row and
the same recorded transition, and a pass that read a row another write has changed since
never moves it from a state it is no longer in."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from sqlalchemy import Table, select, update

from gpuslice_hub.db.jobs_models import JobRow, JobTransitionRow
from gpuslice_hub.db.models import utcnow
from gpuslice_hub.jobs.states import InvalidTransition, advance, transition
from tests.jobs.full_cluster import full_cluster, insert_queued

JOBS = cast(Table, JobRow.__table__)


def seen(db: Any, job_id: int) -> Any:
    """The job's row as a pass reads it (a Core row, with its revision)."""
    with db.reading() as s:
        return s.connection().execute(select(*JOBS.c).where(JOBS.c.id == job_id)).one()


def history(db: Any, job_id: int) -> list[tuple[str | None, str, str]]:
    with db.reading() as s:
        rows = s.scalars(
            select(JobTransitionRow)
            .where(JobTransitionRow.job_id == job_id)
            .order_by(JobTransitionRow.id)
        )
        return [(r.from_state, r.state, r.reason) for r in rows]


def test_a_move_in_statements_writes_what_the_orm_writes(tmp_path: Path):
    ledger, _ = full_cluster(tmp_path, 1)
    db = ledger.db
    a, b = insert_queued(db, tmp_path, [("ann", "gpu-1", "preemptible")] * 2)
    started = utcnow() - timedelta(hours=1)
    burst = {"burst_started_at": started.isoformat(), "burst_milli": 2000, "run": "7"}
    with db.writing() as s:  # both running in a burst partition for an hour
        s.execute(
            update(JOBS)
            .where(JOBS.c.id.in_([a, b]))
            .values(state="running", backend_ref=burst, run_seconds=10.0, burst_gpu_seconds=5.0)
        )
    row = seen(db, a)
    with db.writing() as s:
        assert advance(
            s, row, "completed", "all cells ran", lambda r: {"run_seconds": r.run_seconds + 60}
        )
    with db.writing() as s:
        orm = s.get(JobRow, b)
        orm.run_seconds += 60
        transition(s, orm, "completed", "all cells ran")
    one, other = seen(db, a), seen(db, b)
    assert one.state == "completed" and one.revision > row.revision
    assert one.run_seconds == 70.0 and one.backend_ref == {"burst_milli": 2000, "run": "7"}
    # two GPUs for (at least) an hour, on top of the 5 s it had bought
    assert one.burst_gpu_seconds >= 5.0 + 2 * 3600
    assert one.finished_at is not None
    for key in ("state", "run_seconds", "backend_ref"):
        assert getattr(one, key) == getattr(other, key)
    assert abs(one.burst_gpu_seconds - other.burst_gpu_seconds) < 60
    # the same history: the submission's, then the move
    assert history(db, a) == history(db, b)
    assert history(db, a)[-1] == ("running", "completed", "all cells ran")


def test_a_row_changed_since_it_was_read_is_read_again(tmp_path: Path):
    ledger, _ = full_cluster(tmp_path, 1)
    db = ledger.db
    (job,) = insert_queued(db, tmp_path, [("ann", "gpu-1", "preemptible")])
    row = seen(db, job)
    with db.writing() as s:  # another write, the state unchanged (a waiting reason)
        s.execute(update(JOBS).where(JOBS.c.id == job).values(waiting_reason="w", started_at=None))
    calls: list[Any] = []

    def placed(r: Any) -> dict[str, Any]:
        calls.append(r)
        return {"allocation_ids": [1], "waiting_reason": None}

    with db.writing() as s:
        assert advance(s, row, "starting", "placed on h0:g0", placed)
    # asked twice: of the row as the pass read it, then of the row as it is
    assert len(calls) == 2 and isinstance(calls[1], JobRow)
    now = seen(db, job)
    assert (now.state, now.allocation_ids, now.waiting_reason) == ("starting", [1], None)
    assert history(db, job)[-1] == ("queued", "starting", "placed on h0:g0")


def test_a_job_no_longer_in_the_state_read_is_not_moved(tmp_path: Path):
    ledger, _ = full_cluster(tmp_path, 1)
    db = ledger.db
    (job,) = insert_queued(db, tmp_path, [("ann", "gpu-1", "preemptible")])
    row = seen(db, job)
    with db.writing() as s:  # cancelled meanwhile
        transition(s, s.get(JobRow, job), "cancelled", "by ann")
    before = history(db, job)
    with db.writing() as s:
        assert not advance(s, row, "starting", "placed", lambda r: {"allocation_ids": [1]})
    assert seen(db, job).state == "cancelled" and history(db, job) == before
    assert seen(db, job).allocation_ids == []


def test_a_move_its_values_decline_writes_nothing(tmp_path: Path):
    ledger, _ = full_cluster(tmp_path, 1)
    db = ledger.db
    (job,) = insert_queued(db, tmp_path, [("ann", "gpu-1", "preemptible")])
    row = seen(db, job)
    with db.writing() as s:
        assert not advance(s, row, "starting", "placed", lambda r: None)
    assert seen(db, job).revision == row.revision and len(history(db, job)) == 1


def test_moves_the_state_machine_forbids_are_refused_either_way(tmp_path: Path):
    ledger, _ = full_cluster(tmp_path, 1)
    db = ledger.db
    (job,) = insert_queued(db, tmp_path, [("ann", "gpu-1", "preemptible")])
    row = seen(db, job)
    with pytest.raises(InvalidTransition), db.writing() as s:
        advance(s, row, "completed", "never ran")
    with pytest.raises(ValueError, match="state"), db.writing() as s:
        advance(s, row, "starting", "placed", lambda r: {"state": "running"})
    assert seen(db, job).state == "queued" and len(history(db, job)) == 1
