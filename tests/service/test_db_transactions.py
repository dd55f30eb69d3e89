"""``Database.reading`` and ``Database.writing``: on SQLite a read connection and the
sessions are kept from one transaction to the next; nothing of one transaction may reach
the next (its snapshot, what its session noted, its objects, its callbacks)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import select, text

from gpuslice_hub.db.engine import Database, after_commit, open_database
from gpuslice_hub.db.models import LedgerLock
from gpuslice_hub.db.schema import upgrade
from gpuslice_hub.snapshot import bump_generation, current_generation
from tests.harness.postgres import DATABASES


@pytest.fixture
def db(tmp_path: Any) -> Any:
    database = open_database(f"sqlite:///{tmp_path}/t.sqlite")
    upgrade(database)
    yield database
    database.dispose()


@pytest.fixture(params=DATABASES)
def any_db(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/t.sqlite"
    else:
        url = request.getfixturevalue("postgres_db")
    database = open_database(url)
    upgrade(database)
    yield database
    database.dispose()


def _generation_via_another_connection(db: Database) -> None:
    with db.write_engine.connect() as conn:
        conn.execute(text("UPDATE ledger_lock SET generation = generation + 1 WHERE id = 1"))
        conn.commit()


def test_a_read_sees_what_was_committed_after_the_read_before(db):
    with db.reading() as s:
        before = current_generation(s)
    _generation_via_another_connection(db)
    with db.reading() as s:
        # neither the snapshot nor the generation the session noted is the last read's
        assert current_generation(s) == before + 1
    assert db._reader is not None and not db._reader.in_transaction()


def test_a_read_keeps_its_snapshot_while_it_lasts(any_db):
    # (PostgreSQL too: two statements of one listing must agree with each other)
    db = any_db
    with db.reading() as s:
        before = current_generation(s)
        _generation_via_another_connection(db)
        again = s.connection().execute(select(LedgerLock.generation)).scalar()
        assert again == before


def test_a_read_inside_a_read_and_reads_of_other_threads_run_beside_the_kept_one(db):
    started, finish = threading.Event(), threading.Event()
    seen: list[int] = []

    def other() -> None:
        with db.reading() as s:
            started.set()
            assert finish.wait(30)
            seen.append(current_generation(s))

    thread = threading.Thread(target=other)
    thread.start()
    assert started.wait(30)
    # the other thread holds a read open: this one reads all the same, on its own connection
    with db.reading() as outer, db.reading() as inner:
        assert inner.connection() is not outer.connection()
        assert current_generation(inner) == current_generation(outer)
    finish.set()
    thread.join(30)
    with db.reading() as s:
        assert seen == [current_generation(s)]


def test_objects_loaded_in_one_read_are_not_in_the_next(db):
    with db.reading() as s:
        lock = s.get(LedgerLock, 1)
        assert lock is not None and lock in s
    with db.reading() as s:
        assert not s.identity_map
        assert lock not in s
        assert s.get(LedgerLock, 1) is not lock


def test_a_read_that_failed_leaves_the_next_one_working(db):
    with pytest.raises(RuntimeError), db.reading() as s:
        s.connection().execute(select(LedgerLock.generation)).scalar()
        raise RuntimeError("the caller's own trouble")
    with db.reading() as s:
        assert current_generation(s) == 0


def test_a_broken_read_connection_is_replaced(db):
    with db.reading() as s:
        first = s.connection()
        first.invalidate()
    assert db._reader is None
    with db.reading() as s:
        assert s.connection() is not first
        assert current_generation(s) == 0


def test_a_write_sees_nothing_of_the_write_before(any_db):
    db = any_db
    ran: list[str] = []
    with pytest.raises(RuntimeError), db.writing() as s:
        after_commit(s, lambda: ran.append("rolled back"))
        s.get(LedgerLock, 1)
        raise RuntimeError("refused")
    with db.writing() as s:
        assert not s.identity_map
        first = current_generation(s)
        after_commit(s, lambda: ran.append("committed"))
    with db.writing() as s:
        # the generation noted by the write before is not this one's
        bump_generation(s)
        assert current_generation(s) == first + 1
    with db.writing() as s:
        assert current_generation(s) == first + 1
    _generation_via_another_connection(db)
    with db.writing() as s:
        assert current_generation(s) == first + 2
    # each callback once, only the committed write's
    assert ran == ["committed"]
