"""The service's policy: FGD with the fit rules' memory check, and CPU-only requests sent
where the GPUs are taken.

Two changes to FGD as published (everything else is FGD: the integer score, the
lowest-index GPU among the best, the fixed random rank for ties):

- Memory. A typical request counts as fitting a host only if the host's free memory also
  covers it (each typical shape carries the mean memory of its requests), as the filter
  demands; FGD ignores memory, so it does not see GPUs that the host's memory strands.
- CPU-only requests. While a host keeps enough CPU for the typical requests, FGD scores a
  CPU-only request the same everywhere and the tie-break rank decides, so CPU-only work
  lands on hosts with free GPUs and later strands them. Among FGD's best-scoring hosts this
  policy prefers the one with the least free GPU.

Alternatives that did worse on the openb traces (exact fragmentation changes instead of
the truncated score, best-fit or spreading tie-breaks, other host orders, other typical
sets) are listed with their numbers in docs/benchmarks.md.

Without a workload given in advance the typical requests are learned from the requests
seen so far (``OnlineTypical``), as a service has to; the benchmark passes the trace's
typical requests, as it does for FGD.
"""

from __future__ import annotations

import numpy as np

from ..state import ClusterState
from ..types import Request
from .fgd import FGD, ScoreCache
from .typical import OnlineTypical, Typical


class Default(FGD):
    name = "default"
    n_keys = 2
    memory = True

    def __init__(self, typical: Typical | None = None) -> None:
        super().__init__(typical)
        if self.online is not None:
            self.online = OnlineTypical(memory=True)

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
        top = k[:, 0] == k[:, 0].max()  # sort only FGD's best-scoring hosts
        tied, k = candidates[top], k[top]
        order = np.lexsort((state.rank[tied], -k[:, 1]))
        return int(tied[order[0]])
