"""FGD (Weng et al., USENIX ATC '23): place where fragmentation grows least.

Scores are cached per (request shape, host) and recomputed only for hosts whose state
changed since (see ``ClusterState.version``): in a trace most requests repeat a few shapes
and each placement changes one host, which is what makes the full protocol fast.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..fit import best_gpus
from ..state import ClusterState
from ..types import Request
from .base import argmax_by_rank
from .candidates import candidates
from .frag import allowed_by_typical, fragmentation
from .typical import OnlineTypical, Typical


@dataclass
class ScoreCache:
    """Per host: the best candidate's score key(s) and GPU, valid while ``version`` matches."""

    keys: np.ndarray  # float64[N, K]
    gpu: np.ndarray  # int64[N]
    version: np.ndarray  # int64[N]


@dataclass
class Timing:
    frag_s: float = 0.0
    hosts_scored: int = 0
    calls: int = 0


def fragmentation_delta(
    state: ClusterState,
    request: Request,
    rows: np.ndarray,
    typical: Typical,
    packed: bool = False,
    memory: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For each candidate of ``rows``: (pos, gpu, F(host) - F(host after), free milli after)."""
    cand = candidates(state, request, rows)
    model = allowed = None
    if not typical.any_model:
        key = ("allowed", typical.version, id(typical))
        allowed = state.cache.get(key)
        if allowed is None:
            allowed = state.cache[key] = allowed_by_typical(typical, state.models)
        model = state.gpu_model[rows]
    ok = state.gpu_ok[rows]
    mem = state.mem_free[rows] if memory else None
    free, cpu = state.gpu_free[rows], state.cpu_free[rows]
    # (scaled: exact, so a placement that leaves F as it was has a delta of exactly 0)
    before = fragmentation(typical, free, ok, cpu, model, allowed, packed, mem, scaled=True)
    after = fragmentation(
        typical,
        cand.free_after,
        ok[cand.pos],
        cand.cpu_after,
        None if model is None else model[cand.pos],
        allowed,
        packed,
        None if mem is None else mem[cand.pos] - request.memory_mib,
        scaled=True,
    )
    gpu_after = np.where(ok[cand.pos], cand.free_after, 0).sum(1)
    delta = (before[cand.pos] - after) / typical.weight.sum()
    return cand.pos, cand.gpu, delta, gpu_after


class FGD:
    """Fragmentation gradient descent with the paper's integer score and GPU choice.

    ``typical`` is the workload's typical requests, known in advance as in the paper; without
    it the policy learns them from the requests it is asked to place.
    """

    name = "fgd"
    n_keys = 1
    packed = False
    memory = False  # FGD as published ignores host memory

    def __init__(self, typical: Typical | None = None) -> None:
        self.fixed = typical
        self.online = OnlineTypical() if typical is None else None
        self.timing = Timing()

    def typical(self) -> Typical | None:
        if self.online is not None:
            return self.online.current
        return self.fixed

    def observe(self, request: Request) -> None:
        """Learn from every request, placed or refused (``select`` calls this first)."""
        if self.online is not None:
            self.online.observe(request)

    def choose(
        self, state: ClusterState, request: Request, candidates: np.ndarray
    ) -> tuple[int, list[int]]:
        typical = self.typical()
        if request.kind == "mig" or typical is None:
            node = int(candidates[np.argmin(state.rank[candidates])])
            return node, best_gpus(state, node, request)
        cache = self._cache(state, request, typical)
        stale = candidates[cache.version[candidates] != state.version[candidates]]
        if stale.size:
            t0 = time.perf_counter()
            self._fill(state, request, stale, typical, cache)
            self.timing.frag_s += time.perf_counter() - t0
            self.timing.hosts_scored += stale.size
        self.timing.calls += 1
        node = self._select(state, request, candidates, cache)
        if request.kind == "share":
            return node, [int(cache.gpu[node])]
        return node, best_gpus(state, node, request)

    def _cache(self, state: ClusterState, request: Request, typical: Typical) -> ScoreCache:
        key = (
            "score",
            self,  # not id(self): a collected policy's id is reused by the next one
            typical.version,
            request.kind,
            request.cpu_milli,
            request.gpu_milli,
            request.gpu_memory_mib,
            request.count,
            request.models,
            # the memory-aware measure depends on the memory the request takes
            request.memory_mib if self.memory else 0,
        )
        cache = state.cache.get(key)
        if cache is None:
            if len(state.cache) > 4096:
                drop = [k for k in state.cache if k[0] == "score" and k[2] != typical.version]
                for k in drop:
                    del state.cache[k]
            n = state.n_hosts
            cache = ScoreCache(
                np.zeros((n, self.n_keys)), np.full(n, -1, np.int64), np.full(n, -1, np.int64)
            )
            state.cache[key] = cache
        return cache

    def _fill(
        self,
        state: ClusterState,
        request: Request,
        rows: np.ndarray,
        typical: Typical,
        cache: ScoreCache,
    ) -> None:
        pos, gpu, delta, _ = fragmentation_delta(
            state, request, rows, typical, self.packed, self.memory
        )
        score = np.floor(100.0 / (1.0 + np.exp(-delta / 1000.0)))
        # Candidates are grouped by host in GPU order: keep each host's first best one.
        order = np.lexsort((-score, pos))
        first = np.ones(order.size, bool)
        first[1:] = pos[order][1:] != pos[order][:-1]
        best = order[first]
        cache.keys[rows[pos[best]], 0] = score[best]
        cache.gpu[rows[pos[best]]] = gpu[best]
        cache.version[rows] = state.version[rows]

    def _select(
        self, state: ClusterState, request: Request, candidates: np.ndarray, cache: ScoreCache
    ) -> int:
        return argmax_by_rank(state, candidates, cache.keys[candidates, 0])
