"""Which running jobs a scheduler pass looks at: every one, or, where the backend names
the runs whose answer may have changed (``Backend.changed_jobs``: the simulator's), only
those that might need a look.

A pass skips a job whose run is alive, whose folder the backend vouches unchanged, and
whose quiet memo still holds (``Scheduler._quiet``: the same row and runner claims as a
pass that found nothing to write, before a time-bound check could turn). A job the last
pass skipped stays skippable until

- its row is read again (``RowCache.fresh``: a new row object fails the memo's identity),
- its memo's time runs out (kept here, in a heap of those times),
- its backend names its run (a start, an exit, a folder written);

its claims and its memo change only when a pass looks at it. So the jobs to look at are
those the last pass looked at and those the three name; the others would pass the same
skip test, which is then not run for each of hundreds of running jobs. A pass that did not
finish (an error anywhere) leaves the next one to look at every job.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any


class WatchList:
    def __init__(self) -> None:
        # the ids the last finished pass looked at (did not skip); None: look at all
        self._looked: set[int] | None = None
        # (until when, job id) of the quiet memos that let a job be skipped; an entry of a
        # memo replaced since is left in and only makes its job looked at once more
        self._until: list[tuple[datetime, int]] = []

    def to_look_at(
        self,
        active: Sequence[Any],
        fresh: Collection[int],
        changed: Collection[int] | None,
        now: datetime,
    ) -> list[Any] | None:
        """The rows of ``active`` (in their order) a pass must look at, or None for all of
        them. ``fresh``: the ids whose row was read again; ``changed``: the ids the backend
        names, None where it cannot tell."""
        looked, self._looked = self._looked, None  # (set again only by a finished pass)
        if looked is None or changed is None:
            return None
        ids = looked.union(fresh, changed)
        until = self._until
        while until and until[0][0] <= now:
            ids.add(heapq.heappop(until)[1])
        return [job for job in active if job.id in ids]

    def looked(
        self,
        seen: Sequence[Any],
        looked: set[int],
        quiet: dict[int, tuple[Any, Any, datetime]],
        now: datetime,
        every: bool,
    ) -> None:
        """After a pass that finished: it saw ``seen`` (every active job when ``every``) and
        looked at ``looked`` of them; ``quiet`` holds the memos as the pass left them."""
        self._looked = looked
        if every or len(self._until) > 4 * len(quiet) + 64:
            # every memo's time once (a first pass, or entries left by replaced memos)
            self._until = [(q[2], i) for i, q in quiet.items() if q[2] > now]
            heapq.heapify(self._until)
            return
        for job in seen:
            q = quiet.get(job.id)
            if q is not None and q[2] > now:
                heapq.heappush(self._until, (q[2], job.id))
