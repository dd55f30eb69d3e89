"""Backfill behind a blocked job without delaying it (EASY backfilling).

When the first job in queue order that the cluster cannot take now (the *head*) is
refused for capacity, it gets a reservation: the time it is expected to fit, worked out
from when the running batch jobs are expected to end (a run's ``max_runtime``, its only
estimate; a job being preempted ends at its grace period's deadline), and the cluster as it
will be then. A later job of any class may start now if it fits and either

* is expected to end before that time (it is gone when the head needs the room), or
* leaves the head room at that time: placed on the cluster as it will be then, beside the
  jobs already let through, the head still fits.

Interactive servers have no expected end: what they hold is held at the reservation's
time too. A head that would not fit even once every running batch job has ended waits for
people's servers to give slices back, at no time anyone can tell: later jobs take what
fits meanwhile, until the head has waited ``JobManager.hold_for_after``; from then on
nothing that would use its pools starts before it, so that it starts as soon as the room
is there and no job waits for ever behind a stream of smaller ones (no starvation).

The checks place on copies of the ledger's arrays with the ledger's own placement code,
``learn=False``: a what-if that the learning policies do not count. The ledger may then
place the job elsewhere than the check did; the check is an estimate of the head's room,
as ``max_runtime`` is of the runs' ends.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from ..clusterview import build_hosts
from ..ledger import Ledger
from ..placement import Request
from ..placement.select import select
from ..placement.state import ClusterState, from_hosts
from ..pools import Access

# The arrays a placement changes: copied for a what-if; the rest of a state is shared.
_MUTABLE = ("cpu_free", "mem_free", "gpu_free", "gpu_mem_free", "mig_free", "version", "tags")


def clone(state: ClusterState) -> ClusterState:
    """A copy of ``state`` that placements on it leave ``state`` as it was."""
    arrays = {name: getattr(state, name).copy() for name in _MUTABLE}
    return dataclasses.replace(state, **arrays, cache={})


def place_all(state: ClusterState, request: Request, count: int, policy: Any) -> bool:
    """Place ``count`` of ``request`` on ``state`` (changing it); whether all fitted."""
    for _ in range(count):
        chosen = select(state, request, policy, learn=False)
        if chosen is None:
            return False
        node, slots = chosen
        state.apply(node, request, slots)
    return True


def expected_end(job: Any, now: datetime) -> datetime:
    """When a running (or starting, or preempting) job is expected to give its slices
    back: its grace period's deadline while preempted, else its max runtime's end."""
    deadline = getattr(job, "preempt_deadline", None)
    if job.state == "preempting" and deadline is not None:
        return max(deadline, now)
    left = max(float(job.max_runtime) - float(job.run_seconds or 0.0), 0.0)
    started = job.attempt_started_at or now
    return max(started + timedelta(seconds=min(left, 1e9)), now)


@dataclasses.dataclass
class Reservation:
    """The head's reservation: ``start`` (None: not by batch jobs' ends alone) and the
    cluster at that time, with the jobs let through since applied to it."""

    job_id: int
    start: datetime | None
    # (None with no start: the cluster then is nobody's to keep, and never built)
    shadow: ClusterState | None
    request: Request
    count: int
    policy: Any
    # it waits for people's servers, and has waited past JobManager.hold_for_after
    strict: bool = False
    # (commits so far, request, count) found to delay the head (see ``allows``)
    _held: set[tuple[int, Request, int]] = dataclasses.field(default_factory=set)
    _commits: int = 0

    def allows(
        self, request: Request | None, count: int, ends: datetime
    ) -> tuple[bool, ClusterState | None]:
        """Whether a job of ``count`` x ``request``, expected to end at ``ends``, may
        start now without delaying the head, and the cluster at the reservation's time
        with it, to ``commit`` once it has started (None: nothing changes there)."""
        if self.start is not None and ends <= self.start:
            return True, None  # gone by then: the head's room is as it was
        if self.start is None or self.shadow is None or request is None:
            # no time to keep its room for: held for it once it waited long enough,
            # else whatever fits now may start (the ledger says what does)
            return not self.strict, None
        # the same shape held back against the same shadow is held back again: a pass
        # places each held shape once, not each of thousands of queued jobs
        key = (self._commits, request, count)
        if key in self._held:
            return False, None
        trial = clone(self.shadow)
        if not place_all(trial, request, count, self.policy) or not place_all(
            clone(trial), self.request, self.count, self.policy
        ):
            # it would take, then, room the head or the jobs let through before need
            self._held.add(key)
            return False, None
        return True, trial

    def commit(self, trial: ClusterState | None) -> None:
        """A job ``allows`` let through has started: what it holds at the reservation's
        time is no longer the head's, nor later jobs'."""
        if trial is not None:
            self.shadow = trial
            self._commits += 1

    def describe(self, head_name: str) -> str:
        """Why a job held back by this reservation waits (its waiting reason)."""
        when = (
            f"expected to start by {self.start:%Y-%m-%d %H:%M %Z}"
            if self.start is not None
            else "which waits for people's servers to give slices back"
        )
        return (
            f"held for job {self.job_id} ({head_name}), the first in the queue that does not "
            f"fit, {when}: this job would take the room reserved for it"
        )


def reserve(
    ledger: Ledger,
    job: Any,
    access: Access | None,
    running: Sequence[Any],
    now: datetime,
    hold_after: float,
) -> Reservation:
    """The reservation of ``job``, refused for capacity now, given the ``running`` batch
    jobs (rows with ``allocation_ids``, ``state``, ``max_runtime``, ``run_seconds``,
    ``attempt_started_at``, ``preempt_deadline``); ``hold_after``: ``hold_for_after``."""
    hosts, gpus, active = ledger.snapshot()
    request = ledger.request_for(job.user, ledger.profiles[job.profile], "batch", False)
    widest = access.widest if access is not None else None
    ends = sorted(
        ((expected_end(r, now), {int(a) for a in r.allocation_ids or []}) for r in running),
        key=lambda e: e[0],
    )

    def shadow_after(n: int) -> ClusterState:
        """The cluster once the first ``n`` runs (by expected end) have ended."""
        freed: set[int] = set().union(*(ids for _, ids in ends[:n])) if n else set()
        state = from_hosts(build_hosts(hosts, gpus, [a for a in active if a.id not in freed]))
        return ledger._within(state, widest, None)

    def fits(state: ClusterState) -> bool:
        return place_all(clone(state), request, job.slices, ledger.policy)

    # the fewest runs whose end lets it fit: fitting only gets easier as runs end, so a
    # binary search asks O(log n) placements, not one per running job
    lo, hi = 1, len(ends)
    shadow: ClusterState | None = None
    if not ends or not fits(last := shadow_after(hi)):
        start = None  # (no shadow: a reservation without a time keeps none)
    else:
        while lo < hi:
            mid = (lo + hi) // 2
            if fits(shadow_after(mid)):
                hi = mid
            else:
                lo = mid + 1
        start = ends[lo - 1][0]
        shadow = last if lo == len(ends) else shadow_after(lo)
    waited = (now - job.submitted_at).total_seconds() if job.submitted_at else 0.0
    # held for only if it fits at all, on its pools with nothing on them: a job asking for
    # more than any host has would otherwise hold every later job back for ever
    strict = (
        start is None
        and waited >= hold_after
        and fits(ledger._within(from_hosts(build_hosts(hosts, gpus, [])), widest, None))
    )
    return Reservation(job.id, start, shadow, request, job.slices, ledger.policy, strict)
