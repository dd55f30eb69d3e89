"""Which running preemptible job to preempt so that a request fits.

A candidate is a preemptible job whose slices, once released, let the request be placed
(checked with the same placement code the ledger uses, not guessed from profile names).
Lowest priority class first (a job already giving its slices back before all); among the
candidates of that rank, the one that wastes least: the least GPU capacity left idle once
the request has its room (a whole GPU's job preempted for a quarter share left 750 milli
idle for an hour: issue 47), then the least work since its last checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..clusterview import build_hosts
from ..db.jobs_models import JobRow
from ..db.models import utcnow
from ..ledger import Ledger
from ..placement import Placement, Request, place_in
from ..placement.state import from_hosts
from ..pools import Access
from ..profiles import Profile
from .states import PRIORITY_CLASSES


def pick_victim(
    ledger: Ledger,
    profile: Profile,
    candidates: Sequence[Any],
    below_rank: int,
    access: Access | None = None,
    request: Request | None = None,
    limit: int | None = None,
) -> Any:
    """``candidates``: preemptible jobs holding slices (running or already preempting), as
    ``JobRow`` objects or rows of their ``id``, ``state``, ``priority_class``,
    ``attempt_started_at`` and ``allocation_ids``; the one chosen is returned.
    ``access``: the pools the request may use (split pools): a victim must free room there.
    ``request``: what will be placed (a share charged less than ``profile`` promises, when
    overcommitted; default: the profile's request). ``limit``: look at the first ``limit``
    candidates only, in the order a spawn looks at them (the spawn form's bounded look).

    Asked when ``request`` fits nowhere as things stand (a spawn refused for capacity; a
    profile the spawn form counts none of): a job's release can then only make room on the
    hosts where it holds slices, so only those are placed on."""
    hosts, gpus, active = ledger.snapshot()
    eligible = [j for j in candidates if PRIORITY_CLASSES[j.priority_class] < below_rank]
    first = _in_first_pools(ledger, active, access)

    # a job already giving its slice back counts first: no need to preempt a second one;
    # then (split pools) one in the pools the request tries first (a borrower of the
    # person's own pool before a job in the peak pool)
    def rank(j: Any) -> tuple[bool, bool, int]:
        return (j.state != "preempting", not first(j), PRIORITY_CLASSES[j.priority_class])

    def since_safe(j: Any) -> float:
        """Seconds of its work a preemption puts at stake (since its last checkpoint)."""
        saved = [t for t in (j.attempt_started_at, getattr(j, "last_checkpoint_at", None)) if t]
        return (now - max(saved)).total_seconds() if saved else 0.0

    # (then the most recently started first: the order a bounded look sees them in)
    eligible.sort(
        key=lambda j: (
            *rank(j),
            -(j.attempt_started_at.timestamp() if j.attempt_started_at else 0),
        )
    )
    if limit is not None:
        eligible = eligible[:limit]
    request = request or profile.request()
    host_of = {a.id: a.host for a in active}
    milli_of = {a.id: a.gpu_milli for a in active}
    now = utcnow()
    best: tuple[tuple[int, float], Any] | None = None
    for job in eligible:
        if best is not None and rank(job) != rank(best[1]):
            break  # a candidate of a better rank was found: none of a worse one is chosen
        freed = {int(i) for i in job.allocation_ids or []}
        where = {host_of[i] for i in freed if i in host_of}
        if not where:
            continue  # it holds nothing (any more): its release frees nothing
        remaining = build_hosts(
            [h for h in hosts if h.name in where],
            [g for g in gpus if g.host in where],
            [a for a in active if a.host in where and a.id not in freed],
        )
        if not remaining:
            continue
        state = from_hosts(remaining)
        if access is not None:
            state = ledger._within(state, access.widest, None)
        if not isinstance(place_in(request, state, ledger.policy, learn=False), Placement):
            continue
        waste = max(sum(milli_of.get(i, 0) for i in freed) - request.total_gpu_milli, 0)
        key = (waste, since_safe(job))
        if best is None or key < best[0]:
            best = (key, job)
    return best[1] if best is not None else None


def _in_first_pools(
    ledger: Ledger, active: list[Any], access: Access | None
) -> Callable[[JobRow], bool]:
    """Whether a job holds a slice in the pools ``access`` tries first (always False
    without split pools, or when it tries all its pools at once)."""
    pools = ledger.pools
    if pools is None or access is None or len(access.tries) < 2:
        return lambda job: False
    wanted = access.tries[0]
    where = {
        a.id: {pools.pool_of(a.host, c.gpu_uuid) for c in a.claims if c.active} for a in active
    }
    return lambda job: any(where.get(int(i), set()) & wanted for i in job.allocation_ids or [])
