"""Capacity refusals kept from one pass of the scheduler to the next.

A pass tries each blocked shape of the queue once (``Scheduler._start_queued``), and each
try is an allocation: the placement runs under the ledger's write lock, which spawns wait
for. Most passes follow a change that cannot free capacity: a job submitted, a spawn that
took a slice, a refusal. Every write that could free some (a release, a drain lifted, a
host added, an admin's setting) records an event of another kind, or moves the
inventory's generation, in its transaction and under the ledger lock (``ledger/``), so
events commit in id order. A refusal for lack of capacity therefore stands until such an
event or generation is seen, and a pass tells the shape the reason it was given instead
of trying it again. The minute's retry of the whole queue forgets them all: it is also
the safety net for a change that wrote no event.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from sqlalchemy import bindparam, select

from ..db.models import EventRow
from ..errors import Refused

# event kinds that only take capacity (or say that none was taken): every other kind may
# have freed some
TAKE_ONLY = frozenset({"allocated", "refused"})

_KINDS_BETWEEN = select(EventRow.kind).where(
    EventRow.id > bindparam("after"), EventRow.id <= bindparam("upto")
)


class KeptRefusals:
    def __init__(self) -> None:
        self._kept: dict[Hashable, Refused] = {}
        # the newest event id and the generation the kept refusals were checked against
        self._seen: tuple[int, int] | None = None
        self.forgotten = 0  # for tests: how often they were all forgotten

    def check(self, conn: Any, newest_event: int | None, generation: int) -> None:
        """Before a pass tries the queue, against the state it read (``newest_event``,
        ``generation``): forget every refusal that what happened since could undo. A
        write that lands after that state is seen by the next pass's check."""
        newest = int(newest_event or 0)
        seen = self._seen
        if seen is not None and self._kept:
            if generation != seen[1] or newest < seen[0]:
                self.forget()
            elif newest > seen[0]:
                kinds = conn.execute(_KINDS_BETWEEN, {"after": seen[0], "upto": newest})
                if any(kind not in TAKE_ONLY for kind in kinds.scalars()):
                    self.forget()
        self._seen = (newest, generation)

    def forget(self) -> None:
        if self._kept:
            self.forgotten += 1
        self._kept.clear()

    def get(self, shape: Hashable) -> Refused | None:
        return self._kept.get(shape)

    def keep(self, shape: Hashable, refusal: Refused) -> None:
        """``refusal`` for lack of capacity, given to ``shape`` (everything the attempt's
        answer depended on) in a pass checked against the current state."""
        if self._seen is not None:
            self._kept[shape] = refusal
