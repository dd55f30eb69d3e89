"""The PostgreSQL harness: a real server, not root, a fresh database per test."""

from __future__ import annotations

import threading

import psutil
import pytest
import sqlalchemy as sa

from tests.harness.postgres import PostgresServer, fresh_database

pytestmark = pytest.mark.postgres


def test_url_is_a_psycopg3_url_on_loopback(postgres_url: str):
    url = sa.engine.make_url(postgres_url)
    assert url.drivername == "postgresql+psycopg"
    assert url.host == "127.0.0.1"


def test_server_runs_as_a_non_root_user(postgres_server: PostgresServer, postgres_url: str):
    engine = sa.create_engine(postgres_url)
    with engine.connect() as conn:
        backend = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
        datadir = conn.execute(sa.text("SHOW data_directory")).scalar_one()
        # while connected: the backend exits with the connection
        assert psutil.Process(backend).uids().effective != 0
    engine.dispose()
    assert datadir == str(postgres_server.datadir)
    postmaster = int((postgres_server.datadir / "postmaster.pid").read_text().split()[0])
    assert psutil.Process(postmaster).uids().effective != 0


def test_create_table_and_query(postgres_db: str):
    engine = sa.create_engine(postgres_db)
    meta = sa.MetaData()
    gpus = sa.Table(
        "gpus",
        meta,
        sa.Column("uuid", sa.String, primary_key=True),
        sa.Column("memory_mib", sa.Integer, nullable=False),
    )
    with engine.begin() as conn:
        assert conn.execute(sa.text("SELECT current_database()")).scalar_one().startswith("test_")
        # a fresh database: nothing left over from other tests
        assert sa.inspect(conn).get_table_names() == []
        meta.create_all(conn)
        conn.execute(gpus.insert(), [{"uuid": "GPU-a", "memory_mib": 81559}])
    with engine.connect() as conn:
        assert conn.execute(sa.select(gpus.c.memory_mib)).scalar_one() == 81559
    engine.dispose()


def test_concurrent_connections_are_separate_backends(postgres_db: str):
    workers = 6
    engine = sa.create_engine(postgres_db, pool_size=workers, max_overflow=0)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE hits (backend int, n int)"))
    # every worker holds its connection open at the barrier, so they overlap for sure
    barrier = threading.Barrier(workers, timeout=30)
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            with engine.begin() as conn:
                pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
                barrier.wait()
                conn.execute(sa.text("INSERT INTO hits VALUES (:pid, :n)"), {"pid": pid, "n": n})
                barrier.wait()
        except BaseException as exc:  # re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT backend, n FROM hits")).all()
    engine.dispose()
    assert sorted(n for _, n in rows) == list(range(workers))
    assert len({backend for backend, _ in rows}) == workers


def test_row_lock_blocks_a_second_connection(postgres_db: str):
    engine = sa.create_engine(postgres_db)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE slot (id int primary key, holder text)"))
        conn.execute(sa.text("INSERT INTO slot VALUES (1, NULL)"))
    with engine.connect() as first, engine.connect() as second:
        first.begin()
        first.execute(sa.text("SELECT * FROM slot WHERE id = 1 FOR UPDATE"))
        second.begin()
        second.execute(sa.text("SET LOCAL lock_timeout = '200ms'"))
        with pytest.raises(sa.exc.OperationalError, match="lock timeout"):
            second.execute(sa.text("SELECT * FROM slot WHERE id = 1 FOR UPDATE"))
        second.rollback()
        first.rollback()
    engine.dispose()


def test_fresh_database_is_dropped_afterwards(postgres_url: str):
    engine = sa.create_engine(postgres_url)
    with fresh_database(postgres_url) as url:
        name = sa.engine.make_url(url).database
        leaked = sa.create_engine(url).connect()  # dropping must not wait for this one
        with engine.connect() as conn:
            exists = conn.execute(
                sa.text("SELECT count(*) FROM pg_database WHERE datname = :n"), {"n": name}
            ).scalar_one()
        assert exists == 1
    with engine.connect() as conn:
        exists = conn.execute(
            sa.text("SELECT count(*) FROM pg_database WHERE datname = :n"), {"n": name}
        ).scalar_one()
    assert exists == 0
    leaked.invalidate()
    engine.dispose()
