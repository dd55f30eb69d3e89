"""Engines for the ledger: SQLite (WAL) by default, PostgreSQL at scale.

Every ledger write runs in a transaction that first takes the ledger lock: on PostgreSQL
``SELECT … FOR UPDATE`` of the single ``ledger_lock`` row; on SQLite ``BEGIN IMMEDIATE``
(SQLite has one writer at a time anyway; IMMEDIATE makes the read-then-write atomic
instead of failing with "database is locked" at the first write).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Connection, Engine, create_engine, event, select
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from .loopguard import WouldWait, in_short_write
from .models import LedgerLock

log = logging.getLogger(__name__)
_LOCK_ROW = select(LedgerLock).where(LedgerLock.id == 1).with_for_update()

# SQLite: the write-ahead log is copied back into the database file after this many
# commits (SQLite's own default, 1 000 pages, is about 50 allocations and releases).
CHECKPOINT_EVERY = 50

# How long a write waits for another process's write before "database is locked".
BUSY_TIMEOUT_MS = 30_000
BUSY_TIMEOUT_KEY = "gpuslice.busy_timeout_ms"

# ``session.info[AFTER_COMMIT]``: callables a write transaction leaves to run once it has
# committed (see ``after_commit``).
AFTER_COMMIT = "gpuslice.after_commit"


def after_commit(session: Session, fn: Callable[[], None]) -> None:
    """Run ``fn`` once ``session``'s transaction (a ``Database.writing``) has committed;
    not at all when it rolls back."""
    session.info.setdefault(AFTER_COMMIT, []).append(fn)


def _sqlite_engine(url: str) -> Engine:
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

    # A pool event, not the engine's: a listener for any of a connection's own events (its
    # "begin", say) has every statement on the engine's connections dispatch each of them,
    # which cost more than SQLite spent on the short ones (docs/benchmarks.md). So the
    # transaction's BEGIN is sent by ``Database`` (``_begin``), not from a listener.
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):  # type: ignore[no-untyped-def]
        # Take over transaction control from pysqlite, so BEGIN is ours to issue.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        # Not at the commit that fills the WAL (a 3 ms stall of whoever commits, the event
        # loop included: db/short_writes.py): ``Database`` checkpoints in a thread of its own.
        cur.execute("PRAGMA wal_autocheckpoint=0")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cur.close()
        _record.info[BUSY_TIMEOUT_KEY] = BUSY_TIMEOUT_MS

    return engine


def _sqlite_begin_read(conn: Connection) -> None:
    _driver_exec(conn, "BEGIN")


def _sqlite_begin_write(conn: Connection) -> None:
    # This process's writers queue on ``Database.writer``; SQLite's busy handler is only
    # ever waited on for another process (an admin's sqlite3 shell in a write transaction,
    # say). Not on the event loop: a short write there gives way to a thread
    # (db/short_writes.py), which waits.
    short = in_short_write()
    _set_busy_timeout(conn, 0 if short else BUSY_TIMEOUT_MS)
    try:
        _driver_exec(conn, "BEGIN IMMEDIATE")
    except OperationalError as e:
        if short and getattr(e.orig, "sqlite_errorcode", None) == sqlite3.SQLITE_BUSY:
            raise WouldWait("another process is writing the ledger") from e
        raise


def _set_busy_timeout(conn: Connection, ms: int) -> None:
    """The connection's busy timeout, set only when it changes (kept in the pool's record)."""
    if conn.info.get(BUSY_TIMEOUT_KEY) != ms:
        _driver_exec(conn, f"PRAGMA busy_timeout={int(ms)}")
        conn.info[BUSY_TIMEOUT_KEY] = ms


def _driver_exec(conn: Connection, sql: str) -> None:
    """``sql`` (no parameters, no rows) on the driver's own connection. A transaction's BEGIN,
    through SQLAlchemy's execution, cost about what SQLite spends on a short write; its
    errors are SQLAlchemy's all the same."""
    try:
        conn.connection.driver_connection.execute(sql).close()  # type: ignore[union-attr]
    except sqlite3.Error as e:
        raise DBAPIError.instance(sql, None, e, sqlite3.Error) from e


class _Joined(Session):
    """A session over a transaction ``Database`` began on a connection of its own, and
    commits or rolls back itself. ``connection()`` is that connection as it is: asked for it
    through the session's transaction bookkeeping, a short write spent about a third of its
    time there (docs/benchmarks.md). ORM work goes through that bookkeeping as ever."""

    def close(self) -> None:
        # Most transactions run statements on the connection and load no object: such a
        # session holds nothing to close, and closing it cost a fifth of a read transaction.
        # (Any ORM work, a load or an ``add``, begins the session's own transaction.)
        if self._transaction is None:
            return
        super().close()

    def connection(
        self,
        bind_arguments: Any = None,
        execution_options: Any = None,
    ) -> Connection:
        if bind_arguments is None and execution_options is None:
            return cast(Connection, self.bind)
        return super().connection(bind_arguments, execution_options)


def _begin(conn: Connection, send: Callable[[Connection], None] | None) -> None:
    """Begin ``conn``'s transaction; ``send`` issues SQLite's BEGIN on the driver (SQLite's
    dialect leaves it to the driver, whose own transaction handling ``_on_connect`` turned
    off)."""
    try:
        conn.begin()
        if send is not None:
            send(conn)
    except BaseException:
        # (a BEGIN that failed, SQLite busy: the Connection believes it is in a transaction
        # the database never began; it is no use to anyone after, so it is discarded)
        conn.invalidate()
        raise


@dataclass
class Database:
    url: str
    read_engine: Engine
    write_engine: Engine

    def __post_init__(self) -> None:
        # (an attribute: every transaction asks it several times)
        self.is_sqlite = self.url.startswith("sqlite")
        # Made once: each sessionmaker() call builds a Session subclass and its event
        # dispatch, which cost more than the queries of a whole allocation.
        self._read_sessions = sessionmaker(class_=_Joined, expire_on_commit=False)
        self._write_sessions = sessionmaker(class_=_Joined, expire_on_commit=False)
        # SQLite's one writer, within this process: a thread that wants to write waits here
        # and goes as soon as the writer before it is done, where SQLite's busy handler
        # polls with sleeps of up to 100 ms between tries.
        # Re-entrant: ``ShortWrites`` takes it around a whole ledger call that then writes.
        # (PostgreSQL writes run side by side; those that allocate queue on the lock row.)
        self.writer = threading.RLock()
        self._guard: contextlib.AbstractContextManager[Any] = (
            self.writer if self.is_sqlite else contextlib.nullcontext()
        )
        self._commits = 0  # (counted holding the writer)
        self._kept: Connection | None = None  # SQLite: the writes' connection (held by the writer)
        # SQLite: a read connection kept open for whichever thread finds it free
        # (``reading``); the others take one from the pool, as before
        self._reader: Connection | None = None
        self._reader_session: Session | None = None
        self._writer_session: Session | None = None  # (SQLite: held by the writer)
        self._reader_free = threading.Lock()
        self._checkpoint_due = False
        self._due_at = 0  # the commit that found a checkpoint due
        self._closed = False
        self._checkpointer: ThreadPoolExecutor | None = None
        self._checkpointer_lock = threading.Lock()

    def begin(self, conn: Connection) -> None:
        """Begin a read transaction on ``conn``, a connection of ``read_engine``: a
        snapshot, for as long as it lasts (PostgreSQL: the engine's REPEATABLE READ)."""
        _begin(conn, _sqlite_begin_read if self.is_sqlite else None)

    @contextlib.contextmanager
    def reading(self) -> Iterator[Session]:
        """A read transaction: one snapshot of the ledger, for as long as it lasts."""
        if self.is_sqlite and self._reader_free.acquire(blocking=False):
            try:
                with self._kept_reader() as conn:
                    self.begin(conn)
                    # its session kept too: closed after each read, it serves the next
                    # (building one cost a third of a short read)
                    session = self._reader_session
                    if session is None or session.bind is not conn:
                        session = self._reader_session = self._read_sessions(bind=conn)
                    try:
                        yield session
                    finally:
                        session.close()
                        session.info.clear()  # (what a transaction noted of itself)
            finally:
                self._reader_free.release()
            return
        with self.read_engine.connect() as conn:
            self.begin(conn)
            session = self._read_sessions(bind=conn)
            try:
                yield session
            finally:
                session.close()
            # (the connection's close rolls the read back)

    @contextlib.contextmanager
    def writing(self, lock: bool = True) -> Iterator[Session]:
        """A transaction holding the ledger lock; commits on success, rolls back on error.

        ``lock=False``: a write that allocates nothing and records no event (a usage report,
        a waiting reason, a sample) does not queue behind allocations on PostgreSQL. It must
        be safe on its own (an upsert, an update of one row). SQLite has one writer at a
        time whatever is asked.
        """
        # The transaction is the connection's, the session joins it (``_Joined``): a
        # session's own transaction cost about twice what SQLite spends on a short write.
        # (the connection taken once the writer is: none waits for it holding one)
        with self._guard, self._write_connection() as conn:
            _begin(conn, _sqlite_begin_write if self.is_sqlite else None)
            session = self._write_session(conn)
            try:
                if lock and not self.is_sqlite:
                    conn.execute(_LOCK_ROW)
                yield session
                session.flush()  # (what the ORM holds goes in before the commit)
                conn.commit()
            except BaseException:
                conn.rollback()
                raise
            finally:
                session.close()
                # (taken before the writer is given back: the next write may take this
                # session)
                callbacks = session.info.pop(AFTER_COMMIT, ())
                session.info.clear()
            checkpoint = self._committed() if self.is_sqlite else None
            if checkpoint == "now":
                self._checkpoint_starved()
        if checkpoint == "soon":
            self._checkpoint_soon()
        # committed: what the transaction asked to learn of it (never on a rollback).
        # The write stands whatever a callback does: its failure is logged, not raised
        # to a caller who would take the committed write for a failed one.
        for fn in callbacks:
            try:
                fn()
            except Exception:
                log.exception("a callback after a committed ledger write failed")

    @contextlib.contextmanager
    def _write_connection(self) -> Iterator[Connection]:
        """A connection for one write transaction. SQLite's writes take turns on the writer
        (held by the caller), so they share one connection, kept open: taking one from the
        pool and giving it back cost about a quarter of a short write. One left unusable is
        closed and the next write opens another."""
        if not self.is_sqlite:
            with self.write_engine.connect() as conn:
                yield conn
            return
        kept = self._kept
        if kept is None or kept.closed or kept.invalidated:
            kept = self._kept = self.write_engine.connect()
        try:
            yield kept
        except BaseException:
            # a refusal raised through the transaction rolled it back, and the connection
            # serves on; one whose rollback failed, or that was invalidated, does not
            if kept.invalidated or kept.in_transaction():
                self._kept = None
                with contextlib.suppress(Exception):
                    kept.close()
            raise

    def _write_session(self, conn: Connection) -> Session:
        """A session for a write transaction on ``conn``. SQLite's writes take turns on
        one connection, so they share one session too, closed after each write."""
        if not self.is_sqlite:
            return self._write_sessions(bind=conn)
        session = self._writer_session
        if session is None or session.bind is not conn:
            session = self._writer_session = self._write_sessions(bind=conn)
        return session

    @contextlib.contextmanager
    def _kept_reader(self) -> Iterator[Connection]:
        """The kept read connection (``_reader_free`` held), its transaction rolled back
        after: taking a connection from the pool for each read and giving it back cost
        about a third of a short read. One left unusable is closed; the next read opens
        another."""
        conn = self._reader
        if conn is None or conn.closed or conn.invalidated:
            conn = self._reader = self.read_engine.connect()
        try:
            yield conn
        finally:
            # the snapshot's end: none is held between reads (what was read stands if
            # that fails; the connection does not serve again)
            with contextlib.suppress(Exception):
                if not conn.invalidated:
                    conn.rollback()
            if conn.invalidated or conn.in_transaction():
                self._reader = self._reader_session = None
                with contextlib.suppress(Exception):
                    conn.close()

    def _committed(self) -> str | None:
        """Count a commit (the writer held). "soon" when a checkpoint is due and none is;
        "now" when the one due has waited ``CHECKPOINT_EVERY`` commits for the writer."""
        self._commits += 1
        if self._closed:
            return None
        if self._checkpoint_due:
            # A lock is not a queue: writers in threads that write back to back can take the
            # writer again and again before the checkpoint's thread gets it, and the log
            # then grows without bound (6 MB in a test on a loaded machine). So the writer
            # that finds it waiting this long makes it, holding the writer already; never
            # a short write on the loop, which gives the writer back at once anyway.
            if self._commits - self._due_at < CHECKPOINT_EVERY or in_short_write():
                return None
            self._due_at = self._commits
            return "now"
        if self._commits % CHECKPOINT_EVERY:
            return None
        self._checkpoint_due = True
        self._due_at = self._commits
        return "soon"

    def _checkpoint_starved(self) -> None:
        try:
            self._checkpoint_now()
        except Exception:
            log.exception("checkpointing the ledger's write-ahead log failed")

    def _checkpoint_soon(self) -> None:
        """Copy the WAL back into the database file in a thread of its own."""
        with self._checkpointer_lock:
            if self._closed:
                self._checkpoint_due = False
                return
            try:
                if self._checkpointer is None:
                    self._checkpointer = ThreadPoolExecutor(
                        1, thread_name_prefix="sqlite-checkpoint"
                    )
                self._checkpointer.submit(self.checkpoint)
            except RuntimeError:  # disposed of meanwhile: the last close checkpoints
                self._checkpoint_due = False

    def checkpoint(self) -> None:
        # Holding the writer: SQLite starts the log over only when a write finds every frame
        # of it copied back, which a checkpoint racing the writes of a busy service never
        # achieves (the log then grew by 80 KB a spawn). Writes wait for it meanwhile; the
        # API's short writes go to a thread rather than wait on the loop.
        try:
            with self.writer:
                self._checkpoint_now()
        except Exception:
            log.exception("checkpointing the ledger's write-ahead log failed")
        finally:
            self._checkpoint_due = False

    def _checkpoint_now(self) -> None:
        # a connection of the writers' pool (the writes' own is in no transaction while the
        # writer is held)
        raw = self.write_engine.raw_connection()
        try:
            cur = raw.cursor()
            cur.execute("PRAGMA wal_checkpoint(PASSIVE)")
            cur.fetchall()
            cur.close()
        finally:
            raw.close()

    def dispose(self) -> None:
        with self._checkpointer_lock:
            self._closed = True
            if self._checkpointer is not None:
                self._checkpointer.shutdown(wait=True)
        with self._guard:
            if self._kept is not None:
                self._kept.close()
                self._kept = None
        with self._reader_free:
            if self._reader is not None:
                self._reader.close()
                self._reader = None
        self.read_engine.dispose()
        if self.write_engine is not self.read_engine:
            self.write_engine.dispose()


def open_database(url: str) -> Database:
    if url.startswith("sqlite"):
        return Database(url, _sqlite_engine(url), _sqlite_engine(url))
    if url.startswith("postgresql://"):
        # Prefer psycopg 3, the driver we install and test with.
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    engine = create_engine(url, pool_size=10, max_overflow=20, pool_pre_ping=True)
    # A read is one snapshot, as on SQLite: under PostgreSQL's default READ COMMITTED each
    # statement sees what was committed before it, so a listing's jobs and their history,
    # read by two statements, could disagree with each other. (Read-only transactions never
    # fail to serialize under REPEATABLE READ; writes stay READ COMMITTED behind the lock
    # row. The level is the driver's to send with its BEGIN: no round trip more.)
    reads = engine.execution_options(isolation_level="REPEATABLE READ")
    return Database(url, reads, engine)
