"""The service's policy: FGD made exact, with best-fit tie-breaks and learned typical requests.

Differences from the paper's FGD, each one a reason the paper's version leaves GPUs idle:
- The fragmentation change is compared exactly. FGD squashes it through a sigmoid and
  truncates to an integer score, so changes within ~40 milli-GPU tie and the tie goes to an
  arbitrary host.
- Ties (many hosts look alike) go to the tighter fit: the fuller GPU for a share, then the
  host left with the least free GPU, then the least free CPU. In particular CPU-only
  requests go to hosts whose GPUs are already taken, where their CPU use costs nothing.
- The typical requests are learned from the requests seen so far rather than given in
  advance, as a service has to.
"""

from __future__ import annotations

import numpy as np

from ..state import ClusterState
from ..types import Request
from .fgd import FGD, ScoreCache, fragmentation_delta
from .typical import Typical


class Default(FGD):
    name = "default"
    n_keys = 4
    exact = True
    tiebreak = True

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
        pos, gpu, delta, gpu_after = fragmentation_delta(state, request, rows, typical)
        slot_after = np.zeros(pos.size)
        if request.kind == "share":
            slot_after = state.gpu_free[rows[pos], gpu] - request.gpu_milli
        cpu_after = state.cpu_free[rows[pos]] - request.cpu_milli
        primary = np.round(delta, 6) if self.exact else np.floor(100 / (1 + np.exp(-delta / 1000)))
        keys = np.stack([primary, -slot_after, -gpu_after, -cpu_after], 1)
        if not self.tiebreak:
            keys[:, 1:] = 0
        # Within a host: best keys first, lowest GPU slot on ties (candidates are in GPU order).
        order = np.lexsort((-keys[:, 3], -keys[:, 2], -keys[:, 1], -keys[:, 0], pos))
        first = np.ones(order.size, bool)
        first[1:] = pos[order][1:] != pos[order][:-1]
        best = order[first]
        cache.keys[rows[pos[best]]] = keys[best]
        cache.gpu[rows[pos[best]]] = gpu[best]
        cache.version[rows] = state.version[rows]

    def _select(
        self, state: ClusterState, request: Request, candidates: np.ndarray, cache: ScoreCache
    ) -> int:
        k = cache.keys[candidates]
        order = np.lexsort((state.rank[candidates], -k[:, 3], -k[:, 2], -k[:, 1], -k[:, 0]))
        return int(candidates[order[0]])
