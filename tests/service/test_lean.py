"""The ledger's frequent statements on SQLite's own cursor (gpuslice_hub/db/lean.py).

The whole suite runs with ``GPUSLICE_LEAN_CHECK`` (tests/conftest.py), so each lean
execution is compared with SQLAlchemy's: these tests make sure that comparison is not
vacuous (the statements do take the lean path on SQLite, and a difference is caught), and
that what a caller gets back and what it catches are SQLAlchemy's."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import bindparam, insert, select
from sqlalchemy.exc import IntegrityError

from gpuslice_hub.db import lean as lean_module
from gpuslice_hub.db.jobs_models import JobRow, JobTransitionRow
from gpuslice_hub.db.lean import Lean
from gpuslice_hub.db.models import EventRow
from gpuslice_hub.jobs.job_writes import RECORD_TRANSITION, _update
from gpuslice_hub.jobs.queue_cache import COUNT_BETWEEN, NEWEST_TRANSITION, TRANSITIONS_AFTER
from gpuslice_hub.ledger.base import _INSERT_EVENT
from gpuslice_hub.snapshot import _GENERATION, NEWEST_EVENT
from tests.jobs.full_cluster import insert_queued
from tests.service.conftest import build_ledger

EVENT = {
    "ts": datetime(2026, 12, 4, 18, 30, 1, 250000, tzinfo=UTC),
    "kind": "allocated",
    "user": "ann",
    "actor": "hub",
    "allocation_id": None,
    "profile": "gpu-1",
    "reason": None,
    "detail": {"host": "n1", "why": ["a", 1, None]},
}


def test_the_check_is_on_in_the_suite():
    assert lean_module._CHECK


def test_the_frequent_statements_take_the_lean_path_on_sqlite(tmp_path: Path):
    ledger = build_ledger(f"sqlite:///{tmp_path}/l.sqlite")
    with ledger.db.writing() as s:
        conn = s.connection()
        NEWEST_EVENT.execute(conn)
        _GENERATION.execute(conn)
        NEWEST_TRANSITION.execute(conn)
        TRANSITIONS_AFTER.execute(conn, {"after": 0})
        COUNT_BETWEEN.execute(conn, {"after": 0, "upto": 5})
        _INSERT_EVENT.execute(conn, EVENT)
        _update(frozenset({"waiting_reason"}), ("revision",)).execute(
            conn, {"job_id": 1, "new_waiting_reason": "x", "was_revision": 0}
        )
    for stmt in (NEWEST_EVENT, _GENERATION, NEWEST_TRANSITION, TRANSITIONS_AFTER):
        assert list(stmt._plans.values()) != [None], stmt.stmt
    assert all(_INSERT_EVENT._plans.values())
    ledger.db.dispose()


def test_what_comes_back_is_what_sqlalchemy_reads(db_url: str):
    # on either database: the JSON and the timestamp as written, the id the ORM reads
    ledger = build_ledger(db_url)
    with ledger.db.writing() as s:
        event_id = _INSERT_EVENT.execute(s.connection(), EVENT).scalar_one()
    with ledger.db.reading() as s:
        row = s.get(EventRow, event_id)
        assert row is not None
        assert (row.ts, row.detail, row.kind) == (EVENT["ts"], EVENT["detail"], "allocated")
        newest = NEWEST_EVENT.execute(s.connection()).scalar()
        assert newest == event_id
        assert newest == s.scalar(select(EventRow.id).order_by(EventRow.id.desc()).limit(1))
    ledger.db.dispose()


def test_a_constraint_broken_raises_sqlalchemys_error_and_writes_nothing(db_url: str):
    ledger = build_ledger(db_url)
    line = {"job_id": 424242, "from_state": None, "state": "queued", "at": EVENT["ts"]}
    with pytest.raises(IntegrityError), ledger.db.writing() as s:  # no such job
        RECORD_TRANSITION.execute(s.connection(), {**line, "reason": "submitted"})
    with ledger.db.reading() as s:
        assert s.scalar(select(JobTransitionRow.id)) is None
    ledger.db.dispose()


def test_an_update_counts_the_rows_it_wrote(db_url: str, tmp_path: Path):
    # ``write_job`` tells a write from a lost race by the count: one row, then none once
    # the revision it expects has moved on
    ledger = build_ledger(db_url)
    (job_id,) = insert_queued(ledger.db, tmp_path, [("ann", "gpu-1", "normal")])
    update_reason = _update(frozenset({"waiting_reason"}), ("revision",))
    for expected in (1, 0):
        with ledger.db.writing() as s:
            done = update_reason.execute(
                s.connection(), {"job_id": job_id, "new_waiting_reason": "x", "was_revision": 0}
            )
        assert done.rowcount == expected
    with ledger.db.reading() as s:
        row = s.get(JobRow, job_id)
        assert row is not None and (row.waiting_reason, row.revision) == ("x", 1)
    ledger.db.dispose()


def test_a_lean_execution_that_differs_from_sqlalchemys_is_caught(tmp_path: Path):
    ledger = build_ledger(f"sqlite:///{tmp_path}/l.sqlite")
    stmt = Lean(
        select(EventRow.id).where(EventRow.id > bindparam("a"), EventRow.id < bindparam("b"))
    )
    with ledger.db.reading() as s:
        stmt.execute(s.connection(), {"a": 0, "b": 10})
        (plan,) = stmt._plans.values()
        assert plan is not None
        plan.names = tuple(reversed(plan.names))  # the parameters sent the wrong way round
        with pytest.raises(AssertionError, match="differs from SQLAlchemy"):
            stmt.execute(s.connection(), {"a": 0, "b": 10})
    ledger.db.dispose()


def test_statements_it_cannot_run_go_through_sqlalchemy(tmp_path: Path):
    # an INSERT that leaves a column to its Python-side default is SQLAlchemy's to run
    # (it computes the default); the row is the same (PostgreSQL: every test on db_url)
    ledger = build_ledger(f"sqlite:///{tmp_path}/l.sqlite")
    with_default = Lean(insert(EventRow.__table__).returning(EventRow.__table__.c.id))
    values = {k: v for k, v in EVENT.items() if k != "ts"}
    with ledger.db.writing() as s:
        got = with_default.execute(s.connection(), values).scalar_one()
    (plan,) = with_default._plans.values()
    assert plan is None  # ``ts`` has a Python-side default
    with ledger.db.reading() as s:
        row = s.get(EventRow, got)
        assert row is not None and row.ts is not None and row.detail == EVENT["detail"]
    ledger.db.dispose()


def test_in_lists_and_rows_read_by_column_name(db_url: str):
    ledger = build_ledger(db_url)
    stmt = Lean(
        select(EventRow.id, EventRow.kind, EventRow.detail)
        .where(EventRow.id.in_(bindparam("ids", expanding=True)), EventRow.kind != "x")
        .order_by(EventRow.id),
        named=True,
    )
    with ledger.db.writing() as s:
        ids = [
            _INSERT_EVENT.execute(s.connection(), {**EVENT, "kind": f"k{i}"}).scalar_one()
            for i in range(4)
        ]
    with ledger.db.reading() as s:
        conn = s.connection()
        for some in ([ids[2]], ids[:3], ids):
            rows = stmt.execute(conn, {"ids": some}).rows
            assert [(r.id, r.kind, r.detail) for r in rows] == [
                (i, f"k{ids.index(i)}", EVENT["detail"]) for i in some
            ]
        assert stmt.execute(conn, {"ids": []}).rows == []  # (SQLAlchemy's own empty IN)
    if db_url.startswith("sqlite"):
        (plan,) = stmt._plans.values()
        assert plan is not None and sorted(plan._sqls) == [(1,), (3,), (4,)]
    ledger.db.dispose()
