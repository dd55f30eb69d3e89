"""Hand-built clusters for the placement tests."""

from __future__ import annotations

import numpy as np

from gpuslice_hub.placement.state import ClusterState


def cluster(
    gpus: list[list[int]],
    cpu: list[int] | None = None,
    mem: list[int] | None = None,
    models: list[str] | None = None,
    rank: list[int] | None = None,
) -> ClusterState:
    """Hosts with the given free milli per GPU (rows padded with unusable slots)."""
    n = len(gpus)
    g = max(len(row) for row in gpus)
    free = np.zeros((n, g), np.int64)
    ok = np.zeros((n, g), bool)
    for r, row in enumerate(gpus):
        free[r, : len(row)] = row
        ok[r, : len(row)] = True
    names = sorted(set(models or ["T4"]))
    model = np.array([names.index(m) for m in (models or ["T4"] * n)], np.int32)
    return ClusterState(
        names=[f"h{i}" for i in range(n)],
        rank=np.array(rank if rank is not None else range(n), np.int64),
        cpu_free=np.array(cpu or [64_000] * n, np.int64),
        mem_free=np.array(mem or [256_000] * n, np.int64),
        gpu_free=free,
        gpu_mem_free=np.zeros((n, g), np.int64),
        gpu_mem_cap=np.zeros((n, g), np.int64),
        gpu_model=np.repeat(model[:, None], g, 1),
        gpu_ok=ok,
        models=names,
        mig_free=np.zeros((n, g, 0), np.int32),
    )
