"""GpuPacking and GpuClustering, the two GPU-aware heuristics of the FGD paper."""

from __future__ import annotations

import numpy as np

from ..fit import gpu_fit
from ..state import ClusterState
from ..types import Request
from .base import ScoredPolicy


class GpuPacking(ScoredPolicy):
    """Fill partly used GPUs first, then partly used hosts, and open empty hosts last."""

    name = "gpu-packing"

    def scores(self, state: ClusterState, request: Request, candidates: np.ndarray) -> np.ndarray:
        if request.kind in ("none", "mig"):
            return np.zeros(candidates.size)
        ok = state.gpu_ok[candidates]
        free = state.gpu_free[candidates]
        all_free = np.where(ok, free >= 1000, True).all(1)
        n_gpus = ok.sum(1)
        if request.kind == "gpu":
            partly = np.full(candidates.size, float(max(50 - request.count, 33)))
        else:
            fit = gpu_fit(state, request, candidates)
            tightest = np.where(fit, free, 10_000).min(1)
            used_partial = np.maximum(100 - (tightest * 100 // 1000) // 10, 50)
            partly = np.where(tightest >= 1000, 49, used_partial).astype(float)
        return np.where(all_free, 33.0 - n_gpus, partly)


class GpuClustering(ScoredPolicy):
    """Keep shares with shares and k-GPU requests with k-GPU requests, on fuller hosts."""

    name = "gpu-clustering"

    def scores(self, state: ClusterState, request: Request, candidates: np.ndarray) -> np.ndarray:
        if request.kind == "none":
            return np.zeros(candidates.size)
        tag = 1 << min(request.count, 62) if request.kind == "gpu" else 1
        tags = state.tags[candidates]
        base = (25 * (8000 - state.free_gpu_total()[candidates])) // 8000
        bonus = np.where(
            tags == tag, 75, np.where((tags & tag) != 0, 50, np.where(tags == 0, 25, 0))
        )
        return (base + bonus).astype(float)
