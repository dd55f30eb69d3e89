"""The service's policy: FGD, plus sending CPU-only requests where the GPUs are taken.

FGD scores a CPU-only request by how much its CPU use fragments the host's free GPUs for
the typical requests; while the host keeps enough CPU for them, every host scores the same
and FGD falls back to the tie-break rank, so CPU-only work lands on hosts with free GPUs
and later strands them (a GPU whose host has no CPU left is lost). Among FGD's best-scoring
hosts this policy prefers the one with the least free GPU; everything else is FGD as
published (integer score, lowest-index GPU, fixed random rank for ties).

Measured alternatives that did worse on the openb traces and why they are not here:
comparing FGD's fragmentation change exactly instead of through the truncated integer
score (-1 pp: the coarse score lets the fixed rank pack hosts in a consistent order), and
best-fit tie-breaks for GPU requests (-0.2 pp). See docs/benchmarks.md.

Without a workload given in advance the typical requests are learned from the requests
seen so far (``OnlineTypical``), as a service has to; the benchmark passes the trace's
typical requests, as it does for FGD.
"""

from __future__ import annotations

import numpy as np

from ..state import ClusterState
from ..types import Request
from .fgd import FGD, ScoreCache
from .typical import Typical


class Default(FGD):
    name = "default"
    n_keys = 2

    def __init__(self, typical: Typical | None = None) -> None:
        super().__init__(typical)

    def _fill(
        self,
        state: ClusterState,
        request: Request,
        rows: np.ndarray,
        typical: Typical,
        cache: ScoreCache,
    ) -> None:
        super()._fill(state, request, rows, typical, cache)
        if request.kind == "none":
            free = np.where(state.gpu_ok[rows], state.gpu_free[rows], 0).sum(1)
            cache.keys[rows, 1] = -free

    def _select(
        self, state: ClusterState, request: Request, candidates: np.ndarray, cache: ScoreCache
    ) -> int:
        k = cache.keys[candidates]
        order = np.lexsort((state.rank[candidates], -k[:, 1], -k[:, 0]))
        return int(candidates[order[0]])
