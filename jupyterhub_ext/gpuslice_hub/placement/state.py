"""The cluster as arrays: what every policy scores and what the trace benchmark mutates.

One row per host, one column per GPU slot (hosts with fewer GPUs leave slots unusable).
The service builds a fresh state from ``HostState`` values for each decision; the trace
benchmark builds one and applies every placement to it, so both run the same selection code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .types import HostState, Request


@dataclass
class ClusterState:
    names: list[str]
    rank: np.ndarray  # int64[N]; ties go to the lowest rank
    cpu_free: np.ndarray  # int64[N] milli-CPU
    mem_free: np.ndarray  # int64[N] MiB
    gpu_free: np.ndarray  # int64[N, G] milli-GPU (0 in unusable slots)
    gpu_mem_free: np.ndarray  # int64[N, G] MiB
    gpu_mem_cap: np.ndarray  # int64[N, G] MiB
    gpu_model: np.ndarray  # int32[N, G] index into ``models``
    # Slots that take shares and whole GPUs: present, not drained, not MIG-partitioned.
    gpu_ok: np.ndarray  # bool[N, G]
    models: list[str]
    # Free MIG instances per (host, GPU, profile); profiles index ``mig_profiles``.
    mig_free: np.ndarray  # int32[N, G, P]
    mig_profiles: list[str] = field(default_factory=list)
    mig_milli: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    mig_ok: np.ndarray | None = None  # bool[N, G]: MIG GPUs that are not drained
    # Bumped on every change to a host, so policies can cache per-host scores.
    version: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # Bit set of the kinds of GPU requests placed on each host (GpuClustering's tags).
    tags: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    used_milli: int = 0
    gpu_uuids: list[list[str]] = field(default_factory=list)
    hosts: Sequence[HostState] = ()
    cache: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.names)
        if self.version.size != n:
            self.version = np.zeros(n, np.int64)
        if self.tags.size != n:
            self.tags = np.zeros(n, np.int64)
        if self.mig_ok is None:
            self.mig_ok = np.zeros(self.gpu_ok.shape, bool)

    @property
    def n_hosts(self) -> int:
        return len(self.names)

    def model_mask(self, models: tuple[str, ...]) -> np.ndarray:
        """bool[M]: which of the state's GPU models ``models`` allows (empty allows all)."""
        key = ("model_mask", models)
        mask = self.cache.get(key)
        if mask is None:
            allowed = set(models)
            mask = np.array([not models or m in allowed for m in self.models], bool)
            self.cache[key] = mask
        return mask

    def eligible(self, models: tuple[str, ...]) -> np.ndarray:
        """bool[N, G]: share/whole-GPU slots whose model ``models`` allows."""
        key = ("eligible", models)
        elig = self.cache.get(key)
        if elig is None:
            if not self.models:  # hosts without GPUs: the padding slots index no model
                elig = np.zeros(self.gpu_ok.shape, bool)
            else:
                elig = self.gpu_ok & self.model_mask(models)[self.gpu_model]
            self.cache[key] = elig
        return elig

    def free_gpu_total(self) -> np.ndarray:
        """int64[N]: free milli-GPU on each host's share/whole-GPU slots."""
        return np.where(self.gpu_ok, self.gpu_free, 0).sum(1)

    def mig_index(self, profile: str) -> int:
        try:
            return self.mig_profiles.index(profile)
        except ValueError:
            return -1

    def apply(self, node: int, request: Request, gpus: Sequence[int]) -> None:
        """Record ``request`` on host ``node`` using GPU slots ``gpus``."""
        self.cpu_free[node] -= request.cpu_milli
        self.mem_free[node] -= request.memory_mib
        if request.kind == "share":
            (i,) = gpus
            self.gpu_free[node, i] -= request.gpu_milli
            self.gpu_mem_free[node, i] -= share_memory(request, int(self.gpu_mem_cap[node, i]))
            self.used_milli += request.gpu_milli
            self.tags[node] |= 1
        elif request.kind == "gpu":
            for i in gpus:
                self.gpu_free[node, i] = 0
                self.gpu_mem_free[node, i] = 0
            self.used_milli += 1000 * len(gpus)
            self.tags[node] |= 1 << min(len(gpus), 62)
        elif request.kind == "mig":
            (i,) = gpus
            p = self.mig_index(request.mig_profile)
            self.mig_free[node, i, p] -= 1
            self.used_milli += int(self.mig_milli[p])
        self.version[node] += 1


def share_memory(request: Request, gpu_memory_mib: int) -> int:
    """A share without a memory cap is charged memory in proportion to its milli-GPU."""
    return request.gpu_memory_mib or gpu_memory_mib * request.gpu_milli // 1000


def from_hosts(hosts: Sequence[HostState]) -> ClusterState:
    """Arrays for the service's hosts."""
    n = len(hosts)
    g = max((len(h.gpus) for h in hosts), default=0) or 1
    models = sorted({gpu.model for h in hosts for gpu in h.gpus})
    profiles = sorted({s.profile for h in hosts for gpu in h.gpus for s in gpu.mig})
    mig_milli = np.zeros(len(profiles), np.int64)
    for h in hosts:
        for gpu in h.gpus:
            for slot in gpu.mig:
                mig_milli[profiles.index(slot.profile)] = slot.milli
    state = ClusterState(
        names=[h.name for h in hosts],
        rank=np.array([h.rank for h in hosts], np.int64),
        cpu_free=np.zeros(n, np.int64),
        mem_free=np.zeros(n, np.int64),
        gpu_free=np.zeros((n, g), np.int64),
        gpu_mem_free=np.zeros((n, g), np.int64),
        gpu_mem_cap=np.zeros((n, g), np.int64),
        gpu_model=np.zeros((n, g), np.int32),
        gpu_ok=np.zeros((n, g), bool),
        models=models,
        mig_free=np.zeros((n, g, len(profiles)), np.int32),
        mig_profiles=profiles,
        mig_milli=mig_milli,
        mig_ok=np.zeros((n, g), bool),
        gpu_uuids=[[] for _ in hosts],
        hosts=list(hosts),
    )
    for r, host in enumerate(hosts):
        fill_row(state, r, host)
    return state


def fill_row(state: ClusterState, r: int, host: HostState) -> None:
    """Write ``host`` into row ``r``: its GPUs' models and MIG profiles must be among the
    state's (true for a host of the inventory the state was built from)."""
    assert isinstance(state.hosts, list)
    state.hosts[r] = host
    state.gpu_uuids[r] = [gpu.uuid for gpu in host.gpus]
    state.cpu_free[r] = host.cpu_milli_free
    state.mem_free[r] = host.memory_mib_free
    for arr in (state.gpu_free, state.gpu_mem_free, state.gpu_mem_cap, state.gpu_model):
        arr[r] = 0
    state.gpu_ok[r] = False
    assert state.mig_ok is not None
    state.mig_ok[r] = False
    state.mig_free[r] = 0
    for i, gpu in enumerate(host.gpus):
        state.gpu_model[r, i] = state.models.index(gpu.model)
        state.gpu_mem_cap[r, i] = gpu.memory_mib
        if gpu.is_mig:
            state.mig_ok[r, i] = not gpu.drained
            for slot in gpu.mig:
                if slot.free and not gpu.drained:
                    state.mig_free[r, i, state.mig_profiles.index(slot.profile)] += 1
            continue
        state.gpu_ok[r, i] = not gpu.drained
        state.gpu_free[r, i] = gpu.free_milli
        state.gpu_mem_free[r, i] = gpu.free_memory_mib
