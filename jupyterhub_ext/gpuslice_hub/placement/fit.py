"""The fit rules, over all hosts at once: which hosts can take a request, and on which GPUs.

A host fits when its free CPU and memory cover the request and
- ``share``: one allowed GPU has free milli >= the share and free memory >= its cap;
- ``gpu``: ``count`` allowed GPUs are fully free (the openb rule "free >= g" with g = 1000);
- ``mig``: one allowed MIG GPU has a free instance of the profile;
- ``none``: nothing more.
"""

from __future__ import annotations

import numpy as np

from .state import ClusterState
from .types import Request


def gpu_fit(state: ClusterState, request: Request, rows: np.ndarray | None = None) -> np.ndarray:
    """bool[N, G] (or [len(rows), G]): the GPU slots that could take (part of) ``request``."""
    sel = slice(None) if rows is None else rows
    if request.kind == "share":
        fit = state.eligible(request.models)[sel] & (state.gpu_free[sel] >= request.gpu_milli)
        if request.gpu_memory_mib:
            fit &= state.gpu_mem_free[sel] >= request.gpu_memory_mib
        return fit
    if request.kind == "gpu":
        return state.eligible(request.models)[sel] & (state.gpu_free[sel] >= 1000)
    shape = state.gpu_ok[sel].shape
    if request.kind == "mig":
        p = state.mig_index(request.mig_profile)
        if p < 0:
            return np.zeros(shape, bool)
        allowed = state.model_mask(request.models)[state.gpu_model[sel]]
        return (state.mig_free[sel][:, :, p] > 0) & allowed
    return np.zeros(shape, bool)


def feasible_mask(state: ClusterState, request: Request) -> np.ndarray:
    """bool[N]: hosts that can take ``request`` (the protocol's filter)."""
    mask = (state.cpu_free >= request.cpu_milli) & (state.mem_free >= request.memory_mib)
    if request.kind == "none":
        return mask
    fit = gpu_fit(state, request)
    if request.kind == "gpu":
        return mask & (fit.sum(1) >= request.count)
    return mask & fit.any(1)


def fit_counts(state: ClusterState, request: Request) -> np.ndarray:
    """int64[N]: how many of ``request`` each host takes, placed one after another.

    By the rules above, without trying each placement: a placement consumes one unit of
    one slot (a share's milli and its memory cap, a free MIG instance) or ``count`` whole
    GPUs, and which slot a policy picks never changes how many units are left in all, so
    the count is the host's units, bounded by its CPU and memory. The spawn form and the
    scheduler ask this for every profile on every host; trial placements cost seconds at
    hundreds of hosts, this costs milliseconds.
    """
    big = np.iinfo(np.int64).max
    bound = np.full(state.n_hosts, big, np.int64)
    if request.cpu_milli > 0:
        bound = np.minimum(bound, state.cpu_free // request.cpu_milli)
    if request.memory_mib > 0:
        bound = np.minimum(bound, state.mem_free // request.memory_mib)
    if request.kind == "none":
        if request.cpu_milli <= 0 and request.memory_mib <= 0:
            raise ValueError("a request for nothing fits without limit")
    else:
        fit = gpu_fit(state, request)
        if request.kind == "share":
            units = state.gpu_free // max(request.gpu_milli, 1)
            if request.gpu_memory_mib:
                units = np.minimum(units, state.gpu_mem_free // request.gpu_memory_mib)
            gpu_units = np.where(fit, units, 0).sum(1)
        elif request.kind == "gpu":
            gpu_units = fit.sum(1) // max(request.count, 1)
        else:
            p = state.mig_index(request.mig_profile)
            gpu_units = np.where(fit, state.mig_free[:, :, p], 0).sum(1) if p >= 0 else 0
        bound = np.minimum(bound, gpu_units)
    return np.maximum(bound, 0).astype(np.int64)


def lowest_free_gpus(fit_row: np.ndarray, count: int) -> list[int]:
    """The ``count`` lowest-indexed fitting slots: where whole-GPU requests go."""
    return [int(i) for i in np.flatnonzero(fit_row)[:count]]


def tightest_gpu(state: ClusterState, node: int, fit_row: np.ndarray) -> int:
    """The fitting slot with the least free milli, the lowest index on ties."""
    idx = np.flatnonzero(fit_row)
    return int(idx[np.argmin(state.gpu_free[node, idx])])


def mig_gpu(state: ClusterState, node: int, fit_row: np.ndarray, request: Request) -> int:
    """The MIG GPU with the fewest free instances of the profile: keeps other GPUs whole."""
    idx = np.flatnonzero(fit_row)
    p = state.mig_index(request.mig_profile)
    free_all = state.mig_free[node, idx].sum(1)
    order = np.lexsort((idx, free_all, state.mig_free[node, idx, p]))
    return int(idx[order[0]])


def best_gpus(state: ClusterState, node: int, request: Request) -> list[int]:
    """The protocol's ``best`` GPU choice, shared by the simple policies."""
    if request.kind == "none":
        return []
    fit_row = gpu_fit(state, request, np.array([node]))[0]
    if request.kind == "gpu":
        return lowest_free_gpus(fit_row, request.count)
    if request.kind == "mig":
        return [mig_gpu(state, node, fit_row, request)]
    return [tightest_gpu(state, node, fit_row)]
