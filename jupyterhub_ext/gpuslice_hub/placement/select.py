"""The one selection step the service and the trace benchmark share."""

from __future__ import annotations

import numpy as np

from .fit import feasible_mask
from .policies.base import Policy
from .state import ClusterState
from .types import Request


def select(
    state: ClusterState,
    request: Request,
    policy: Policy,
    learn: bool = True,
    host: str | None = None,
    avoid: frozenset[str] = frozenset(),
) -> tuple[int, list[int]] | None:
    """(host index, GPU slots) for ``request``, or None when no host can take it.

    ``host``: only that host may take it (Slurm already runs the work there; the ledger
    records it where it is).

    A learning policy sees every real request, placed or refused; ``learn=False`` is for
    what-if questions ("how many more of these would fit?") that must not skew what it learns.
    """
    observe = getattr(policy, "observe", None)
    if learn and observe is not None:
        observe(request)
    candidates = np.flatnonzero(feasible_mask(state, request))
    if host is not None:
        candidates = candidates[[state.names[i] == host for i in candidates]]
    if avoid:
        candidates = candidates[[state.names[i] not in avoid for i in candidates]]
    if candidates.size == 0:
        return None
    return policy.choose(state, request, candidates)
