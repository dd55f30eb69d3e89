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
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable

from sqlalchemy import make_url, text

from .engine import Database

WAIT_SECONDS = 20.0
# The advisory lock's key: the bytes of "gpuslice" as one integer (it fits PostgreSQL's
# signed bigint; advisory locks are per database).
ADVISORY_KEY = int.from_bytes(b"gpuslice", "big")


class LedgerInUse(RuntimeError):
    """Another gpuslice service holds this ledger."""


def hold_ledger(db: Database, shown_url: str, wait: float | None = None) -> Callable[[], None]:
    """Take this process's hold on ``db``; returns what lets it go. Raises ``LedgerInUse``
    when another process still holds it after ``wait`` seconds (``WAIT_SECONDS``).
    ``shown_url``: the ledger's URL as messages may show it (without a password)."""
    wait = WAIT_SECONDS if wait is None else wait
    if db.is_sqlite:
        path = make_url(db.url).database
        if not path or path == ":memory:":
            return lambda: None  # a ledger no other process can open
        return _hold_file(path + ".service-lock", shown_url, wait)
    return _hold_advisory(db, shown_url, wait)


def _hold_file(lock_path: str, shown_url: str, wait: float) -> Callable[[], None]:
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise LedgerInUse(_message(shown_url, f"process {holder}")) from None
            time.sleep(0.2)  # (polling a lock another process holds, until the deadline)
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)

    def let_go() -> None:
        with contextlib.suppress(OSError):
            os.close(fd)  # (closing the descriptor releases the lock)

    return let_go


def _hold_advisory(db: Database, shown_url: str, wait: float) -> Callable[[], None]:
    conn = db.write_engine.connect()
    deadline = time.monotonic() + wait
    try:
        while True:
            took = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": ADVISORY_KEY})
            got = bool(took.scalar())
            conn.commit()  # a session lock outlives the transaction; none is left open
            if got:
                break
            if time.monotonic() >= deadline:
                raise LedgerInUse(_message(shown_url, "another connection"))
            time.sleep(0.2)  # (polling a lock another process holds, until the deadline)
    except BaseException:
        conn.invalidate()
        raise

    def let_go() -> None:
        # Closed, not handed back to the pool (where the session, and its lock, would live
        # on): the session's advisory lock ends with it.
        with contextlib.suppress(Exception):
            conn.invalidate()

    return let_go


def _message(shown_url: str, holder: str) -> str:
    return (
        f"another gpuslice service ({holder}) is running on the ledger {shown_url}. Run one "
        "service per ledger: stop the other one, or give this one a ledger of its own "
        "(db_url)."
    )
