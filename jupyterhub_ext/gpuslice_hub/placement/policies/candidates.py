"""The hosts a request would leave behind: one candidate per (host, distinct GPU choice).

A share could go to any fitting GPU, but GPUs with the same free milli, free memory and
model leave identical hosts, so only the lowest-indexed of each such group is a candidate.
Whole-GPU requests take the lowest-indexed fully free GPUs; CPU-only requests take no GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..fit import gpu_fit
from ..state import ClusterState
from ..types import Request


@dataclass
class Candidates:
    pos: np.ndarray  # int[M]: index into the host subset, ascending
    gpu: np.ndarray  # int[M]: GPU slot taken by a share, -1 otherwise
    free_after: np.ndarray  # int64[M, G]
    cpu_after: np.ndarray  # int64[M]


def candidates(state: ClusterState, request: Request, rows: np.ndarray) -> Candidates:
    free = state.gpu_free[rows]
    cpu_after = state.cpu_free[rows] - request.cpu_milli
    k = rows.size
    if request.kind == "share":
        fit = gpu_fit(state, request, rows)
        g = free.shape[1]
        same = (free[:, :, None] == free[:, None, :]) & fit[:, None, :]
        same &= state.gpu_model[rows][:, :, None] == state.gpu_model[rows][:, None, :]
        same &= state.gpu_mem_free[rows][:, :, None] == state.gpu_mem_free[rows][:, None, :]
        dup = (same & np.tri(g, g, -1, dtype=bool)).any(2)
        pos, gpu = np.nonzero(fit & ~dup)
        after = free[pos]
        after[np.arange(pos.size), gpu] -= request.gpu_milli
        return Candidates(pos, gpu, after, cpu_after[pos])
    pos = np.arange(k)
    after = free.copy()
    if request.kind == "gpu":
        fit = gpu_fit(state, request, rows)
        taken = fit & (np.cumsum(fit, 1) <= request.count)
        after[taken] = 0
    return Candidates(pos, np.full(k, -1), after, cpu_after)
