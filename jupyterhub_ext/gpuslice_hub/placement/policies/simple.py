"""The load-balancing baselines of the FGD paper: first-fit, random, best-fit and DotProd.

Scores follow the simulator's integer arithmetic (truncation before the tie-break), which
decides many ties; the constants 128 000 mCPU and 8 000 milli-GPU are its fixed normalisers.
"""

from __future__ import annotations

import numpy as np

from ..fit import gpu_fit, lowest_free_gpus
from ..state import ClusterState
from ..types import Request
from .base import ScoredPolicy, gpu_demand

CPU_NORM = 128_000.0
GPU_NORM = 8_000.0


class FirstFit(ScoredPolicy):
    """Every feasible host scores the same, so the lowest rank wins."""

    name = "first-fit"

    def scores(self, state: ClusterState, request: Request, candidates: np.ndarray) -> np.ndarray:
        return np.zeros(candidates.size)


class BestFit(ScoredPolicy):
    """Prefer the host left with the least free CPU and GPU after placing."""

    name = "best-fit"

    def scores(self, state: ClusterState, request: Request, candidates: np.ndarray) -> np.ndarray:
        cpu_left = state.cpu_free[candidates] - request.cpu_milli
        gpu_left = state.free_gpu_total()[candidates] - gpu_demand(state, request)
        # The simulator's float order: sum of (free - request) / norm * weight, then scale.
        s = cpu_left / CPU_NORM * 0.5 + gpu_left / GPU_NORM * 0.5
        return np.floor((1.0 - s) * 100.0)


class DotProd(ScoredPolicy):
    """Prefer the host whose free (CPU, GPU) vector is least aligned with the request."""

    name = "dotprod"

    def scores(self, state: ClusterState, request: Request, candidates: np.ndarray) -> np.ndarray:
        c_l = state.cpu_free[candidates] / CPU_NORM
        g_l = state.free_gpu_total()[candidates] / GPU_NORM
        d = c_l * (request.cpu_milli / CPU_NORM) + g_l * (gpu_demand(state, request) / GPU_NORM)
        return np.floor(100.0 * (1.0 - d / 2.0))


class Random:
    """A uniformly random feasible host; a share goes to a uniformly random fitting GPU."""

    name = "random"

    def __init__(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)

    def choose(
        self, state: ClusterState, request: Request, candidates: np.ndarray
    ) -> tuple[int, list[int]]:
        node = int(candidates[self.rng.integers(candidates.size)])
        if request.kind == "none":
            return node, []
        fit_row = gpu_fit(state, request, np.array([node]))[0]
        if request.kind == "gpu":
            return node, lowest_free_gpus(fit_row, request.count)
        fitting = np.flatnonzero(fit_row)
        return node, [int(fitting[self.rng.integers(fitting.size)])]
