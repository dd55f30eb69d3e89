"""Defragmentation by moving preemptible jobs: make room for a request that the cluster has
the capacity for, but split across GPUs or hosts.

Unlike a Kubernetes scheduler, gpuslice can move work: a preemptible job checkpoints and
resumes elsewhere. When a queued job is refused for capacity, :func:`plan_move` looks for the
fewest running preemptible jobs whose slices, once given back, let the request be placed on
one host, *and* that can each be placed again in what is left (after the request): a move,
not an eviction, so no job loses its place and the cluster's work does not shrink. The
placement code decides every fit (the same code the ledger places with); nothing is guessed
from profile names.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ..clusterview import build_hosts
from ..ledger import Ledger
from ..placement import Request
from ..placement.select import select
from ..placement.state import ClusterState, from_hosts
from ..pools import Access
from ..profiles import Profile

# Jobs that may be moved: running, and preemptible (a checkpoint and a restart is all a
# move costs them).
MOVABLE_STATES = ("starting", "running")
# Hosts a plan looks at, the likeliest first: each costs a rebuild of the cluster's arrays
MAX_HOSTS = 16


@dataclass(frozen=True)
class Move:
    """Jobs to move so that job ``for_job`` fits on ``host``."""

    for_job: int
    host: str
    jobs: tuple[int, ...]
    # milli-GPUs the moved jobs hold: the work that checkpoints and restarts
    moved_milli: int
    # the allocations the moved jobs give back: the move is done once none is held
    freed: frozenset[int] = frozenset()


def plan_move(
    ledger: Ledger,
    for_job: int,
    profile: Profile,
    access: Access | None,
    candidates: Sequence[Any],
    access_of: Callable[[Any], Access | None],
    max_moves: int,
    request: Request | None = None,
) -> Move | None:
    """The fewest of ``candidates`` (running preemptible jobs) to move so that one slice of
    ``profile`` fits in the pools of ``access``, each moved job fitting again elsewhere (in
    its own pools, ``access_of(job)``), at most ``max_moves`` of them; None when no such
    move exists. ``request``: what will be placed (a share charged less than ``profile``
    promises, when overcommitted; default: the profile's request)."""
    if max_moves <= 0:
        return None
    hosts, gpus, active = ledger.snapshot()
    by_id = {a.id: a for a in active}
    movable: list[tuple[Any, list[Any]]] = []
    for job in candidates:
        if job.state not in MOVABLE_STATES or job.priority_class != "preemptible":
            continue
        found = [by_id.get(int(i)) for i in job.allocation_ids or []]
        held = [a for a in found if a is not None]
        if held and len(held) == len(found):
            movable.append((job, held))
    if not movable:
        return None
    request = request or profile.request()
    allowed = access.widest if access is not None else None
    built = build_hosts(hosts, gpus, active)
    if not built:
        return None
    state = ledger._within(from_hosts(built), allowed, None)
    # Moves change where capacity is free, never how much: without enough free in all,
    # no move can make room (the common case on a full cluster: no plan is tried)
    need = request.gpu_milli if request.kind == "share" else 1000 * request.count
    if request.kind in ("share", "gpu") and int(state.free_gpu_total().sum()) < need:
        return None
    # the hosts most likely to make room first: free plus movable capacity, a bounded
    # number of them (each costs a rebuild of the cluster's arrays)
    free_on = dict(zip(state.names, state.free_gpu_total().tolist(), strict=True))
    movable_on: dict[str, int] = {}
    for _, held in movable:
        for a in held:
            movable_on[a.host] = movable_on.get(a.host, 0) + a.gpu_milli
    ranked = sorted(movable_on, key=lambda h: -(movable_on[h] + free_on.get(h, 0)))
    best: Move | None = None
    for host in ranked[:MAX_HOSTS]:
        on_host = [(job, held) for job, held in movable if any(a.host == host for a in held)]
        # the largest first (fewest moves), then the least work since a checkpoint
        on_host.sort(
            key=lambda jh: (
                -sum(a.gpu_milli for a in jh[1] if a.host == host),
                -_saved_at(jh[0]),
            )
        )
        removed = _enough(ledger, hosts, gpus, active, host, request, allowed, on_host)
        if removed is None or len(removed) > max_moves:
            continue
        if best is not None and len(removed) >= len(best.jobs):
            continue
        if not _all_fit_again(
            ledger, hosts, gpus, active, host, request, allowed, removed, access_of
        ):
            continue
        milli = sum(a.gpu_milli for _, held in removed for a in held)
        freed = frozenset(a.id for _, held in removed for a in held)
        best = Move(for_job, host, tuple(job.id for job, _ in removed), milli, freed)
        if len(best.jobs) == 1:
            break
    return best


def _saved_at(job: Any) -> float:
    saved = getattr(job, "last_checkpoint_at", None) or getattr(job, "attempt_started_at", None)
    return saved.timestamp() if saved else 0.0


def _enough(
    ledger: Ledger,
    hosts: Sequence[Any],
    gpus: Sequence[Any],
    active: Sequence[Any],
    host: str,
    request: Any,
    allowed: frozenset[str] | None,
    ordered: list[tuple[Any, list[Any]]],
) -> list[tuple[Any, list[Any]]] | None:
    """Jobs of ``ordered`` (all on ``host``) to take off it so that ``request`` fits
    there, with none of them unnecessary; None when even all of them are not enough."""
    here = [h for h in hosts if h.name == host]
    mine = [g for g in gpus if g.host == host]
    on_host = [a for a in active if a.host == host]

    def fits(removed: list[tuple[Any, list[Any]]]) -> bool:
        gone = {a.id for _, held in removed for a in held}
        built = build_hosts(here, mine, [a for a in on_host if a.id not in gone])
        if not built:
            return False
        state = ledger._within(from_hosts(built), allowed, None)
        return select(state, request, ledger.policy, learn=False) is not None

    if fits([]):
        return None  # it fits already: no move needed (the refusal was for another reason)
    removed: list[tuple[Any, list[Any]]] = []
    for item in ordered:
        removed.append(item)
        if fits(removed):
            break
    else:
        return None
    # drop what the request turned out not to need, the last taken first
    for item in list(reversed(removed[:-1])):
        trial = [r for r in removed if r is not item]
        if fits(trial):
            removed = trial
    return removed


def _all_fit_again(
    ledger: Ledger,
    hosts: Sequence[Any],
    gpus: Sequence[Any],
    active: Sequence[Any],
    host: str,
    request: Any,
    allowed: frozenset[str] | None,
    removed: list[tuple[Any, list[Any]]],
    access_of: Callable[[Any], Access | None],
) -> bool:
    """Whether, with ``removed`` taken off and ``request`` placed on ``host``, every slice
    of every removed job can be placed again in its own pools."""
    gone = {a.id for _, held in removed for a in held}
    built = build_hosts(hosts, gpus, [a for a in active if a.id not in gone])
    if not built:
        return False
    state = from_hosts(built)
    if not _place(ledger, state, allowed, request, host):
        return False
    for job, held in removed:
        profile = ledger.profiles.get(job.profile)
        if profile is None:
            return False
        access = access_of(job)
        for _ in held:
            widest = access.widest if access is not None else None
            if not _place(ledger, state, widest, profile.request(), None):
                return False
    return True


def _place(
    ledger: Ledger,
    state: ClusterState,
    allowed: frozenset[str] | None,
    request: Any,
    host: str | None,
) -> bool:
    """Place ``request`` in ``state`` (within the ``allowed`` pools), recording it there."""
    view = ledger._within(state, allowed, None)
    chosen = select(view, request, ledger.policy, learn=False, host=host)
    if chosen is None:
        return False
    node, slots = chosen
    state.apply(node, request, slots)
    return True


class MoveBudget:
    """At most ``per_hour`` jobs moved in any hour (JobManager.defragment_moves_per_hour)."""

    def __init__(self, per_hour: int) -> None:
        self.per_hour = per_hour
        self._moved: deque[datetime] = deque()

    def left(self, now: datetime) -> int:
        while self._moved and now - self._moved[0] >= timedelta(hours=1):
            self._moved.popleft()
        return max(0, self.per_hour - len(self._moved))

    def spend(self, now: datetime, n: int) -> None:
        self._moved.extend([now] * n)
