"""The ledger's frequent statements on SQLite's own cursor (gpuslice_hub/db/lean.py).

The whole suite runs with ``GPUSLICE_LEAN_CHECK`` (tests/conftest.py), so each lean
execution is compared with SQLAlchemy's: these tests make sure that comparison is not
vacuous (the statements do take the lean path on SQLite, and a difference is caught), and
that what a caller gets back and what it catches are SQLAlchemy's."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import (
    JSON,
    Column,
    Integer,
    MetaData,
    Table,
    bindparam,
    create_engine,
    insert,
    select,
)
from sqlalchemy.exc import IntegrityError

from gpuslice_hub import snapshot as snapshot_module
from gpuslice_hub.db import lean as lean_module
from gpuslice_hub.db.jobs_models import JobRow, JobTransitionRow
from gpuslice_hub.db.lean import Lean
from gpuslice_hub.db.models import EventRow
from gpuslice_hub.jobs import manager as manager_module
from gpuslice_hub.jobs.job_writes import RECORD_TRANSITION, _update
from gpuslice_hub.jobs.manager import JobManager
from gpuslice_hub.jobs.queue_cache import COUNT_BETWEEN, NEWEST_TRANSITION, TRANSITIONS_AFTER
from gpuslice_hub.jobs.scheduler import Scheduler
from gpuslice_hub.ledger import Caller
from gpuslice_hub.ledger import allocation as allocation_module
from gpuslice_hub.ledger.base import _INSERT_EVENT
from gpuslice_hub.snapshot import _GENERATION, NEWEST_EVENT
from tests.jobs.full_cluster import PROFILES, IdleBackend, hosts, insert_queued
from tests.jobs.notebooks import notebook
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


def test_an_insert_computes_the_python_side_defaults_sqlalchemy_would(tmp_path: Path):
    # a constant and a function of nothing (``utcnow``, ``list``) are computed by the lean
    # path, for each execution; the rows are those SQLAlchemy's own execution writes
    ledger = build_ledger(f"sqlite:///{tmp_path}/l.sqlite")
    with_default = Lean(insert(EventRow.__table__).returning(EventRow.__table__.c.id))
    values = {k: v for k, v in EVENT.items() if k != "ts"}
    before = datetime.now(UTC)
    with ledger.db.writing() as s:
        got = [with_default.execute(s.connection(), values).scalar_one() for _ in range(2)]
    (plan,) = with_default._plans.values()
    assert plan is not None and [k for k, _ in plan.calls] == ["ts"]
    with ledger.db.reading() as s:
        rows = [s.get(EventRow, i) for i in got]
        assert all(r is not None and r.detail == EVENT["detail"] for r in rows)
        stamps = [r.ts for r in rows if r is not None]
        assert before <= stamps[0] <= stamps[1] <= datetime.now(UTC)
    ledger.db.dispose()


def test_a_computed_default_of_another_type_than_sqlalchemys_is_caught():
    # the check sets a called default's value aside (``utcnow`` gives another instant each
    # call) but not its type
    engine = create_engine("sqlite://")
    table = Table(
        "t",
        MetaData(),
        Column("id", Integer, primary_key=True),
        Column("n", Integer, default=lambda: 7),
    )
    table.metadata.create_all(engine)
    lean = Lean(insert(table))
    with engine.begin() as conn:
        lean.execute(conn, {"id": 1})
        (plan,) = lean._plans.values()
        assert plan is not None and [k for k, _ in plan.calls] == ["n"]
        plan.calls = (("n", lambda: "7"),)  # text where SQLAlchemy sends a number
        with pytest.raises(AssertionError, match="lean default n differs"):
            lean.execute(conn, {"id": 2})
    engine.dispose()


def test_a_default_that_reads_its_context_goes_through_sqlalchemy():
    engine = create_engine("sqlite://")
    table = Table(
        "t",
        MetaData(),
        Column("id", Integer, primary_key=True),
        Column("a", Integer, default=7),
        Column("b", JSON, default=list),
        Column("c", Integer, default=lambda ctx: ctx.get_current_parameters()["a"] + 1),
    )
    table.metadata.create_all(engine)
    lean, plain = Lean(insert(table).returning(table.c.id)), Lean(insert(table))
    with engine.begin() as conn:
        lean.execute(conn, {"a": 1})  # ``c`` needs its context: SQLAlchemy's
        plain.execute(conn, {"a": 2, "c": 5})  # ``b`` is ``list()``: lean
        rows = conn.execute(select(table.c.a, table.c.b, table.c.c).order_by(table.c.id))
        assert [tuple(r) for r in rows] == [(1, [], 2), (2, [], 5)]
    assert list(lean._plans.values()) == [None]
    (plan,) = plain._plans.values()
    assert plan is not None and [k for k, _ in plan.calls] == ["b"]
    engine.dispose()


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


def test_a_submission_a_start_and_a_spawn_take_the_lean_path(tmp_path: Path):
    """The statements of a job's submission and start, and of a server's spawn and
    release, run on SQLite's cursor (the check compares each with SQLAlchemy's)."""
    ledger = build_ledger(f"sqlite:///{tmp_path}/l.sqlite", profiles=PROFILES, hosts=hosts(1))
    jobs = JobManager(ledger, ledger.db, IdleBackend(), tmp_path / "jobs")  # type: ignore[arg-type]
    jobs.run_jobs_as_service_user = True
    body = {"notebook": notebook(["1"], False), "profile": "gpu-1"}
    job_id = int(jobs.submit(Caller("ann", ("lab",), "ann"), body)["id"])
    Scheduler(jobs).tick()
    started = jobs.current(job_id)
    assert started.state == "starting" and started.revision > 0 and started.slices == 1
    bob = Caller("bob", (), "hub")
    first, created = ledger.allocate(bob, "share-250", "s1")
    again, created_again = ledger.allocate(bob, "share-250", "s1")  # the server's own slice
    wide, _ = ledger.allocate(bob, "gpu-2", "s2")  # two claims, one statement each
    stored = ledger.get(wide["id"])
    assert stored is not None and len(wide["assignments"]) == 2
    assert stored["assignments"] == wide["assignments"]  # (each id with its own claim)
    assert created and not created_again and again["id"] == first["id"]
    ledger.release(first["id"], "bob", "server stopped")
    for stmt in (
        manager_module.CURRENT_ROW,
        manager_module._UNFINISHED,
        manager_module._INSERT_JOB,
        allocation_module._SERVERS_SLICE,
        allocation_module._INSERT_CLAIM,
        snapshot_module._ALLOCATION,
        snapshot_module._ITS_CLAIMS,
    ):
        plans = list(stmt._plans.values())
        assert plans and None not in plans, stmt.stmt
    ledger.db.dispose()
