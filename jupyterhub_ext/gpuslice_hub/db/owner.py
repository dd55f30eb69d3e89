"""One service per ledger: the service holds its ledger for as long as it runs.

Two services on one ledger would each run a job scheduler, a reconciler and a sampler with
nothing between them, each keep its own pending preemptions, and, on SQLite, write while
the other's event loop assumes it is the only writer (db/short_writes.py). The docs always
said to run one; now a second one refuses to start and says why.

- SQLite: an exclusive ``flock`` on ``<ledger>.service-lock`` beside the database file,
  holding the owner's pid for the message. The kernel lets go when the process ends,
  however it ends.
- PostgreSQL: a session advisory lock on a connection of its own, kept open; the server
  lets go when that connection closes (the process ending closes it).

A service restarted by the hub may start before the one it replaces is quite gone, so a
start waits up to ``WAIT_SECONDS`` for the lock before refusing.

A hold can be lost while the service runs: PostgreSQL lets go of the lock when the hold's
connection drops (a network cut, an admin's ``pg_terminate_backend``, a server restart),
and a lock file someone deleted is one a second service can create and lock again. So
the service checks its hold every ``CHECK_SECONDS`` (``LedgerHold.check``): a hold lost
and still free is taken again; one another service took stops this one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time

from sqlalchemy import Connection, create_engine, make_url, text
from sqlalchemy.pool import NullPool

from gpuslice.errors import GPUSliceError

from .engine import Database

WAIT_SECONDS = 20.0
# How often a running service makes sure it still holds its ledger: the longest two
# services could both run after a hold was lost.
CHECK_SECONDS = 5.0
# The advisory lock's key: the bytes of "gpuslice" as one integer (it fits PostgreSQL's
# signed bigint; advisory locks are per database).
ADVISORY_KEY = int.from_bytes(b"gpuslice", "big")

# libpq's: a keepalive after 10 s of silence, every 5 s, 3 unanswered and the connection is
# dead; data unacknowledged for 30 s, likewise.
_NOTICE_A_DEAD_PEER = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}
_TRY_LOCK = text("SELECT pg_try_advisory_lock(:k)")
# Whether this session holds the lock: pg_locks shows a bigint key as its high and low
# 32 bits (classid, objid), with objsubid 1.
_HOLDS_LOCK = text(
    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted"
    " AND pid = pg_backend_pid() AND classid = :hi AND objid = :lo AND objsubid = 1)"
)


class LedgerInUse(GPUSliceError, RuntimeError):
    """Another gpuslice service holds this ledger. ``holder``: which (a process, or
    another connection); ``shown_url``: the ledger's URL as messages show it."""

    def __init__(self, shown_url: str, holder: str, upgrading: bool = False) -> None:
        super().__init__(
            f"another gpuslice service ({holder}) is running on the ledger {shown_url}: stop "
            "it before upgrading its database (upgrade-db never runs under a running service)"
            if upgrading
            else _message(shown_url, holder)
        )
        self.shown_url = shown_url
        self.holder = holder


class LedgerHold:
    """This process's hold on its ledger (``hold_ledger``). ``check`` runs in a thread while
    the service runs; it and ``let_go`` take turns, and a hold let go of is never checked
    (taken) again."""

    def __init__(self) -> None:
        self._turn = threading.Lock()
        self._let_go = False

    def check(self) -> str | None:
        """Make sure the hold stands. Returns None when it did all along (or was let go
        of), or what happened when it was lost (and was taken again, or cannot be looked at
        now: the check after tries again). Raises ``LedgerInUse`` when another process
        holds the ledger now."""
        with self._turn:
            return None if self._let_go else self._check()

    def let_go(self) -> None:
        with self._turn:
            if not self._let_go:
                self._let_go = True
                self._release()

    def _check(self) -> str | None:
        raise NotImplementedError

    def _release(self) -> None:
        raise NotImplementedError


class _NoHold(LedgerHold):
    """An in-memory ledger: no other process can open it."""

    def _check(self) -> str | None:
        return None

    def _release(self) -> None:
        pass


def hold_ledger(db: Database, shown_url: str, wait: float | None = None) -> LedgerHold:
    """Take this process's hold on ``db`` (``let_go`` of what it returns lets it go). Raises
    ``LedgerInUse`` when another process still holds it after ``wait`` seconds
    (``WAIT_SECONDS``). ``shown_url``: the ledger's URL as messages may show it (without a
    password)."""
    wait = WAIT_SECONDS if wait is None else wait
    if db.is_sqlite:
        path = make_url(db.url).database
        if not path or path == ":memory:":
            return _NoHold()
        return _FileHold(path + ".service-lock", shown_url, wait)
    return _AdvisoryHold(db, shown_url, wait)


class _FileHold(LedgerHold):
    def __init__(self, path: str, shown_url: str, wait: float) -> None:
        super().__init__()
        self.path = path
        self.shown_url = shown_url
        self.fd = _lock_file(path, shown_url, wait)

    def _check(self) -> str | None:
        mine = os.fstat(self.fd)
        try:
            there = os.stat(self.path)
        except FileNotFoundError:
            there = None
        if there is not None and (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino):
            return None
        # Removed or replaced: the lock this process holds is on a file no other process
        # can open any more, so it keeps no one out. Lock the one at the path.
        fd = _lock_file(self.path, self.shown_url, 0)  # (raises LedgerInUse)
        os.close(self.fd)
        self.fd = fd
        return f"the ledger's lock file {self.path} was removed; this service holds it again"

    def _release(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)  # (closing the descriptor releases the lock)


def _lock_file(lock_path: str, shown_url: str, wait: float) -> int:
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                    raise LedgerInUse(shown_url, f"process {holder}") from None
                time.sleep(0.2)  # (polling a lock another process holds, until the deadline)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
    except BaseException:
        os.close(fd)  # (a lock taken is let go with it, never left on a lost descriptor)
        raise
    return fd


class _AdvisoryHold(LedgerHold):
    def __init__(self, db: Database, shown_url: str, wait: float) -> None:
        super().__init__()
        self.shown_url = shown_url
        # A connection of its own, which notices a dead server or a cut network within
        # about 30 s (TCP keepalives, a send timeout), where the kernel's defaults take
        # about 15 minutes: a check waits on it until then.
        self.engine = create_engine(
            db.write_engine.url, poolclass=NullPool, connect_args=_NOTICE_A_DEAD_PEER
        )
        self.conn = self.engine.connect()
        deadline = time.monotonic() + wait
        try:
            while not self._try_lock(self.conn):
                if time.monotonic() >= deadline:
                    raise LedgerInUse(shown_url, "another connection")
                time.sleep(0.2)  # (polling a lock another process holds, until the deadline)
        except BaseException:
            self.let_go()
            raise

    @staticmethod
    def _try_lock(conn: Connection) -> bool:
        got = bool(conn.execute(_TRY_LOCK, {"k": ADVISORY_KEY}).scalar())
        conn.commit()  # a session lock outlives the transaction; none is left open
        return got

    def _check(self) -> str | None:
        try:
            held = self._holds(self.conn)
        except Exception:
            # The connection dropped (the session, and its lock, ended with it). Once
            # rolled back, the same Connection starts a new session.
            with contextlib.suppress(Exception):
                self.conn.rollback()
            try:
                held = self._holds(self.conn)
            except Exception as e:  # the server cannot be reached: nor can it be written to
                with contextlib.suppress(Exception):
                    self.conn.invalidate()
                    self.conn.rollback()
                return f"could not check this service's hold on the ledger: {e}"
        if held:
            return None
        try:
            got = self._try_lock(self.conn)
        except Exception as e:
            with contextlib.suppress(Exception):
                self.conn.rollback()
            return f"could not take the ledger's hold again: {e}"
        if not got:
            raise LedgerInUse(self.shown_url, "another connection")
        return "the connection holding the ledger was lost; this service holds it again"

    @staticmethod
    def _holds(conn: Connection) -> bool:
        """Whether ``conn``'s session holds the lock (a new session after a drop does not)."""
        hi, lo = divmod(ADVISORY_KEY, 1 << 32)
        held = bool(conn.execute(_HOLDS_LOCK, {"hi": hi, "lo": lo}).scalar())
        conn.commit()
        return held

    def _release(self) -> None:
        # Closed, not handed back to a pool (where the session, and its lock, would live
        # on): the session's advisory lock ends with it.
        with contextlib.suppress(Exception):
            self.conn.invalidate()
        self.engine.dispose()


def _message(shown_url: str, holder: str) -> str:
    return (
        f"another gpuslice service ({holder}) is running on the ledger {shown_url}. Run one "
        "service per ledger: stop the other one, or give this one a ledger of its own "
        "(db_url)."
    )
