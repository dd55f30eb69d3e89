"""The scheduler's pass keeps job rows between passes and reads again only those whose
revision moved (jobs/row_cache.py): every write to a job, through the ORM or the pass's own
Core update of waiting reasons, must move it, or the pass would decide on a stale row."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, cast

import pytest
from sqlalchemy import Table, select, text, update
from sqlalchemy.orm import Session

from gpuslice_hub.db.jobs_models import JobRow
from gpuslice_hub.jobs import row_cache
from gpuslice_hub.jobs.row_cache import RowCache
from gpuslice_hub.jobs.states import ACTIVE
from tests.harness.postgres import DATABASES
from tests.jobs.full_cluster import PROFILES, full_cluster, hosts, insert_queued
from tests.service.conftest import build_ledger

JOBS = cast(Table, JobRow.__table__)


def full_read(db: Any, where: Any) -> list[Any]:
    with db.reading() as s:
        return list(s.connection().execute(select(*JOBS.c).where(where).order_by(JOBS.c.id)))


def cached(db: Any, cache: RowCache) -> list[Any]:
    with db.reading() as s:
        return cache.read(s.connection())


@pytest.mark.parametrize("engine", DATABASES)
def test_only_changed_rows_are_read_again_and_the_cache_always_equals_a_full_read(
    tmp_path: Path, engine: str, request: pytest.FixtureRequest
):
    # (on both databases: the pass asks for the keys on the driver's own cursor)
    url = (
        f"sqlite:///{tmp_path}/ledger.sqlite"
        if engine == "sqlite"
        else request.getfixturevalue("postgres_db")
    )
    ledger = build_ledger(url, profiles=PROFILES, hosts=hosts(1))
    db = ledger.db
    ids = insert_queued(db, tmp_path, [("ann", "gpu-1", "preemptible")] * 40)
    with db.writing() as s:
        for job_id in ids[:20]:
            s.get(JobRow, job_id).state = "running"
    active = RowCache(tuple(JOBS.c), JOBS.c.state.in_(ACTIVE))
    assert cached(db, active) == full_read(db, JOBS.c.state.in_(ACTIVE))
    assert active.reread == 20
    assert cached(db, active) == full_read(db, JOBS.c.state.in_(ACTIVE))
    assert active.reread == 0  # nothing changed: nothing read again

    with db.writing() as s:
        s.get(JobRow, ids[3]).cells_done = 5  # a write that changes no state
    assert [r.id for r in cached(db, active) if r.cells_done == 5] == [ids[3]]
    assert active.reread == 1

    rng = random.Random(7)
    before = {r.id for r in cached(db, active)}
    for step in range(60):
        job_id = rng.choice(ids)
        what = rng.randrange(3)
        with db.writing() as s:
            row = s.get(JobRow, job_id)
            if what == 0:
                row.state = rng.choice(["queued", "running", "preempting", "completed"])
            elif what == 1:
                row.backend_ref = {"step": step}
            else:
                row.run_seconds += 1.0
        rows = cached(db, active)
        assert rows == full_read(db, JOBS.c.state.in_(ACTIVE)), step
        # the pass forgets what it kept of jobs no longer watched when, and only when, told
        now = {r.id for r in rows}
        assert active.left == bool(before - now), step
        before = now


def test_the_pass_s_own_core_update_of_waiting_reasons_moves_the_revision(tmp_path: Path):
    ledger, scheduler = full_cluster(tmp_path, 1)  # every GPU held: the queue waits
    db = ledger.db
    insert_queued(db, tmp_path, [("ann", "gpu-1", "preemptible")] * 5)
    queued = RowCache((JOBS.c.id, JOBS.c.waiting_reason, JOBS.c.revision), JOBS.c.state == "queued")
    before = {r.id: r.waiting_reason for r in cached(db, queued)}
    assert set(before.values()) == {None}
    scheduler.tick()
    after = {r.id: r.waiting_reason for r in cached(db, queued)}
    assert queued.reread == 5 and None not in after.values()
    assert after == {r.id: r.waiting_reason for r in full_read(db, JOBS.c.state == "queued")}


def test_two_writers_of_one_row_move_its_revision_twice(postgres_db: str, tmp_path: Path):
    # On PostgreSQL a writer that loaded the row, then updates it after another writer's
    # commit (a waiting reason is written without the ledger lock), must not write the same
    # next revision: the cached row of the first commit would hide the second write.
    ledger = build_ledger(postgres_db, profiles=PROFILES, hosts=hosts(1))
    db = ledger.db
    (job_id,) = insert_queued(db, tmp_path, [("ann", "gpu-1", "normal")])
    with Session(db.write_engine) as first:
        row = first.get(JobRow, job_id)
        assert row is not None and row.revision == 0
        with db.write_engine.begin() as other:
            other.execute(update(JOBS).where(JOBS.c.id == job_id).values(waiting_reason="x"))
        row.cells_done = 3
        first.commit()
    (found,) = full_read(db, JOBS.c.id == job_id)
    assert (found.waiting_reason, found.cells_done, found.revision) == ("x", 3, 2)


def test_every_row_is_read_again_now_and_then_whatever_its_revision(tmp_path: Path):
    ledger, _ = full_cluster(tmp_path, 1)
    db = ledger.db
    ids = insert_queued(db, tmp_path, [("ann", "gpu-1", "preemptible")] * 3)
    queued = RowCache((JOBS.c.id, JOBS.c.revision, JOBS.c.not_before), JOBS.c.state == "queued")
    cached(db, queued)
    with db.writing() as s:  # textual SQL: no column default reaches it
        s.execute(
            text("UPDATE jobs SET not_before = '2030-01-01 00:00:00' WHERE id = :i"), {"i": ids[0]}
        )
    before = cached(db, queued)
    for _ in range(row_cache.FULL_READ_PASSES - 2):
        assert cached(db, queued)[0].not_before is None  # not seen: its revision did not move
    after = cached(db, queued)
    assert after[0].not_before is not None and queued.reread == 3
    assert after == [
        (r.id, r.revision, r.not_before) for r in full_read(db, JOBS.c.state == "queued")
    ]
    # only the row that differs is new to the pass; the others are the objects it had (its
    # memo of a quiet job holds by identity), and no row left
    assert queued.fresh == {ids[0]} and not queued.left
    assert [a is b for a, b in zip(after, before, strict=True)] == [False, True, True]


def test_a_read_that_finds_the_same_keys_returns_the_same_rows(tmp_path: Path):
    """The common pass: nothing among the active jobs changed (told by one comparison of
    their keys); then one write, and the next read sees it."""
    ledger, _ = full_cluster(tmp_path, 1)
    db = ledger.db
    ids = insert_queued(db, tmp_path, [("ann", "gpu-1", "preemptible")] * 5)
    with db.writing() as s:
        for job_id in ids:
            s.get(JobRow, job_id).state = "running"
    active = RowCache(tuple(JOBS.c), JOBS.c.state.in_(ACTIVE))
    first = cached(db, active)
    assert not active.unchanged and active.reread == 5
    again = cached(db, active)
    assert active.unchanged and again == first
    assert all(a is b for a, b in zip(again, first, strict=True))
    with db.writing() as s:
        s.get(JobRow, ids[2]).cells_done = 9
    after = cached(db, active)
    assert not active.unchanged and active.reread == 1
    assert after == full_read(db, JOBS.c.state.in_(ACTIVE)) and after[2].cells_done == 9
