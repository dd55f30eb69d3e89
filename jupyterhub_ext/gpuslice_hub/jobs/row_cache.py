"""Job rows as the scheduler's pass reads them, kept between passes.

A pass looks at every active job once a second (and, when an engine queues the jobs, at
every queued one). Reading their whole rows each time, timestamps parsed and JSON decoded,
cost more than the rest of a pass with hundreds of jobs, to learn that almost none changed.
Every write to a job moves its ``revision`` (``db/jobs_models.py``), so a pass reads the
(id, revision) pairs of the rows it wants and the whole row only of those that are new or
whose revision moved.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, bindparam, select

from ..db.jobs_models import JobRow
from ..db.lean import Lean

CHUNK = 500  # ids per statement (old SQLite takes at most 999 parameters)
# Every this many reads, every row is read again whatever its revision: a write that did
# not move it (textual SQL, which no column default reaches) is seen within this many passes
FULL_READ_PASSES = 100


class RowCache:
    """The rows ``where`` selects, with ``columns`` (which must include the id, and the
    revision), as of the last :meth:`read`."""

    def __init__(self, columns: tuple[Any, ...], where: ColumnElement[bool]) -> None:
        self.columns, self.where = columns, where
        self._keys = select(JobRow.id, JobRow.revision).where(where).order_by(JobRow.id)
        # built once (building a statement costs about what running it does on SQLite); the
        # selection again: a row that left it between the two statements (another
        # transaction on PostgreSQL) is not taken
        self._some = Lean(
            select(*columns).where(JobRow.id.in_(bindparam("ids", expanding=True)), where),
            named=True,
        )
        # the keys' statement as the database's own SQL (its one parameter-free statement),
        # run on the driver's cursor: the most frequent query of the service, a pass a
        # second, where SQLAlchemy's execution and row objects cost more than SQLite does
        # (not a ``Lean``: with no parameter it runs so on PostgreSQL too)
        self._keys_sql: tuple[Any, str] | None = None
        self._rows: dict[int, Any] = {}
        # the keys the last read found: the same again (most passes) means the same rows,
        # told by one comparison, not a look at each
        self._keys_seen: list[Any] | None = None
        self.reread = 0  # rows read again by the last read (what tests check)
        self.unchanged = False  # the last read returned the rows of the one before
        self.left = False  # a row the read before returned is not among the last read's
        # ids whose row the last read returned as a new object (new, or read again): every
        # other row it returned is the very object the read before returned
        self.fresh: frozenset[int] = frozenset()
        self._keyset: set[Any] = set()
        self._missing: set[int] = set()  # ids of the last read's keys whose row was not found
        self._passes = 0

    def read(self, conn: Any) -> list[Any]:
        """The rows, in id order; what changed since the last read is read again."""
        self._passes += 1
        everything = self._keys_seen is None or self._passes > FULL_READ_PASSES
        if everything:
            self._passes = 1
        keys = self._key_pairs(conn)
        if keys == self._keys_seen and not everything:
            self.reread, self.unchanged, self.left = 0, True, False
            self.fresh = frozenset()
            return list(self._rows.values())
        ids, keyset = dict(keys), set(keys)  # (id order kept; built in C, not row by row)
        if everything:
            stale = list(ids)
        else:
            # new or moved: a set difference, no look at each row; with those whose row
            # was not found last time (they left the selection between the two statements)
            stale = [i for i, _ in keyset.difference(self._keyset)]
            stale += [i for i in self._missing if i in ids]
        self._keys_seen, self._keyset, self.unchanged = keys, keyset, False
        fresh: dict[int, Any] = {}
        for at in range(0, len(stale), CHUNK):
            for row in self._some.execute(conn, {"ids": stale[at : at + CHUNK]}).rows:
                fresh[row.id] = row
        # read again, or kept as it was; one that changed and left the selection: gone
        gone = self._missing = set(stale).difference(fresh)
        rows = self._rows
        self.reread = len(fresh)
        if everything and rows:
            # A row read again only because every row is now and then (its revision did not
            # move) stays the object the pass already has where it is equal: the pass's memo
            # of a quiet job holds by identity, and would otherwise be lost for all of them.
            for i in [i for i, row in fresh.items() if rows.get(i) == row]:
                del fresh[i]
        try:
            kept = {i: fresh[i] if i in fresh else rows[i] for i in ids if i not in gone}
        except KeyError:  # (never expected: a row not kept nor read; read them all again)
            self._keys_seen = None
            return self.read(conn)
        self.left = not rows.keys() <= kept.keys()
        self._rows = kept
        self.fresh = frozenset(fresh)
        return list(kept.values())

    def _key_pairs(self, conn: Any) -> list[tuple[int, int]]:
        """(id, revision) of the rows ``where`` selects, in id order, in ``conn``'s
        transaction."""
        compiled = self._keys_sql
        if compiled is None or compiled[0] is not conn.dialect:
            sql = self._keys.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True})
            compiled = self._keys_sql = (conn.dialect, str(sql))
        cursor = conn.connection.cursor()
        try:
            cursor.execute(compiled[1])
            return cursor.fetchall()  # (integers from either driver: no conversion)
        finally:
            cursor.close()
