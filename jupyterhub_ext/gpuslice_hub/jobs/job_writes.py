"""A job row's writes in statements, for the writes a scheduler pass makes thousands of
times a day (a start, a run's first word, its end): no ORM object loaded and flushed, and
each statement built once per set of columns (building one cost about what running it does
on SQLite). The row's ``revision`` moves with each, as with every write (its ``onupdate``)."""

from __future__ import annotations

import functools
from typing import Any, cast

from sqlalchemy import Table, bindparam, insert, update

from ..db.jobs_models import JobRow, JobTransitionRow
from ..db.lean import Lean

JOBS = cast(Table, JobRow.__table__)
TRANSITIONS = cast(Table, JobTransitionRow.__table__)
RECORD_TRANSITION = Lean(insert(TRANSITIONS))


@functools.cache
def _update(columns: frozenset[str], guards: tuple[str, ...]) -> Lean:
    where = [JOBS.c.id == bindparam("job_id")]
    where += [JOBS.c[g] == bindparam(f"was_{g}") for g in guards]
    # (bound parameters may not take a column's own name in an UPDATE: "new_" names them)
    values = {c: bindparam(f"new_{c}", type_=JOBS.c[c].type) for c in sorted(columns)}
    return Lean(update(JOBS).where(*where).values(values))


def write_job(conn: Any, job_id: int, values: dict[str, Any], **was: Any) -> bool:
    """Set ``values`` in job ``job_id``'s row where its columns ``was`` still hold what
    they say (``revision=7``: as read; ``state="running"``). True when the row was
    written."""
    params = {"job_id": job_id, **{f"new_{c}": v for c, v in values.items()}}
    params.update({f"was_{g}": v for g, v in was.items()})
    done = _update(frozenset(values), tuple(sorted(was))).execute(conn, params)
    return bool(done.rowcount == 1)


def record_transition(
    conn: Any, job_id: int, old: str | None, state: str, at: Any, reason: str
) -> None:
    """The history's line for a move of ``job_id`` from ``old`` (None: submitted) to
    ``state``."""
    RECORD_TRANSITION.execute(
        conn,
        {"job_id": job_id, "from_state": old, "state": state, "at": at, "reason": reason[:1024]},
    )
