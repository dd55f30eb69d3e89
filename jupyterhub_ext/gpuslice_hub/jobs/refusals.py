"""Capacity refusals kept from one pass of the scheduler to the next.

A pass tries each blocked shape of the queue once (``Scheduler._start_queued``), and each
try is an allocation: quotas, then the placement, under the ledger's write lock, which
spawns wait for. Many passes follow a change that alters nothing such a try depends on: a
job submitted, a spawn refused. Every write that could change the answer (an allocation
or a release, a drain, a host added, an admin's setting or quota) records an event of
another kind than "refused", or moves the inventory's generation, in its transaction and
under the ledger lock (``ledger/``), so events commit in id order. A refusal for lack of
capacity, given to one user's job of one shape, therefore stands until such an event (where
no quota bounds anyone, an allocation is none: see ``UNCHANGING_UNBOUNDED``) or generation is
seen, and the pass tells the job the reason it was given instead of trying
again. Whatever happens, a refusal is kept for at most ``max_age``: the safety net for a
change that wrote no event.
"""

from __future__ import annotations

from collections.abc import Hashable
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, select

from ..db.lean import Lean
from ..db.models import EventRow
from ..errors import Refused

# events after which every allocation would be answered as before: a refusal writes only
# its event. Nor does an allocation make room for another: it only takes capacity (a
# release, its own event, gives it back), and a queued job's refusal names no count it
# changes (``ledger/capacity.py``). But where quotas bound anyone, it moves its holder's and
# groups' standing, which decides before capacity does: then it counts as a change.
UNCHANGING = frozenset({"refused"})
UNCHANGING_UNBOUNDED = frozenset({"refused", "allocated"})


def _changing_between(unchanging: frozenset[str]) -> Lean:
    """One event between two states that may have changed an answer, if any."""
    return Lean(
        select(EventRow.id)
        .where(
            EventRow.id > bindparam("after"),
            EventRow.id <= bindparam("upto"),
            EventRow.kind.not_in(sorted(unchanging)),
        )
        .limit(1)
    )


_CHANGING_BETWEEN = {k: _changing_between(k) for k in (UNCHANGING, UNCHANGING_UNBOUNDED)}


class KeptRefusals:
    def __init__(self, max_age: float) -> None:
        self.max_age = max_age
        self._kept: dict[Hashable, Refused] = {}
        # the newest event id and the generation the kept refusals were checked against
        self._seen: tuple[int, int] | None = None
        self._since: datetime | None = None  # the check the oldest kept one followed

    def check(
        self,
        conn: Any,
        newest_event: int | None,
        generation: int,
        now: datetime,
        quotas_bound: bool = True,
    ) -> None:
        """Before a pass tries the queue, against the state it read (``newest_event``,
        ``generation``): forget every refusal that what happened since could undo, and
        all of them past ``max_age``. A write that lands after that state is seen by the
        next pass's check. ``quotas_bound``: whether any quota limits anyone (then an
        allocation may change an answer)."""
        newest = int(newest_event or 0)
        seen = self._seen
        if self._kept:
            if (
                seen is None
                or generation != seen[1]
                or newest < seen[0]
                or self._since is None
                or (now - self._since).total_seconds() >= self.max_age
            ):
                self.forget()
            elif newest > seen[0]:
                unchanging = UNCHANGING if quotas_bound else UNCHANGING_UNBOUNDED
                changing = _CHANGING_BETWEEN[unchanging].execute(
                    conn, {"after": seen[0], "upto": newest}
                )
                if changing.first() is not None:
                    self.forget()
        if not self._kept:
            self._since = now
        self._seen = (newest, generation)

    def forget(self) -> None:
        self._kept.clear()

    def get(self, key: Hashable) -> Refused | None:
        return self._kept.get(key)

    def keep(self, key: Hashable, refusal: Refused) -> None:
        """``refusal`` for lack of capacity, given in a pass checked against the current
        state to ``key`` (everything the attempt's answer depended on: the user and their
        groups, the shape, the pools tried, the hosts avoided)."""
        if self._seen is not None:
            self._kept[key] = refusal
