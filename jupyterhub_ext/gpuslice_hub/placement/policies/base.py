"""What a policy is, and the argmax every scoring policy shares."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..fit import best_gpus
from ..state import ClusterState
from ..types import Request


class Policy(Protocol):
    """Chooses a host among feasible ones, and the GPUs on it.

    ``candidates`` holds the indices of the feasible hosts (never empty). A policy may keep
    state between calls (a learned request distribution, a random generator); the cluster
    state it is given is read-only to it.
    """

    name: str

    def choose(
        self, state: ClusterState, request: Request, candidates: np.ndarray
    ) -> tuple[int, list[int]]: ...


def argmax_by_rank(state: ClusterState, candidates: np.ndarray, scores: np.ndarray) -> int:
    """The highest score; among equal scores the lowest rank (fixed per host)."""
    tied = candidates[scores == scores.max()]
    return int(tied[np.argmin(state.rank[tied])])


class ScoredPolicy:
    """A node score (higher is better) plus the protocol's ``best`` GPU choice."""

    name = ""

    def scores(self, state: ClusterState, request: Request, candidates: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def choose(
        self, state: ClusterState, request: Request, candidates: np.ndarray
    ) -> tuple[int, list[int]]:
        if candidates.size == 1:
            node = int(candidates[0])
        else:
            node = argmax_by_rank(state, candidates, self.scores(state, request, candidates))
        return node, best_gpus(state, node, request)


def gpu_demand(state: ClusterState, request: Request) -> int:
    """The request's GPU demand in milli-GPU (the G of the protocol's formulas)."""
    if request.kind == "mig":
        p = state.mig_index(request.mig_profile)
        return int(state.mig_milli[p]) if p >= 0 else 0
    return request.total_gpu_milli
