"""The openb workload and cluster, built as PROTOCOL.md describes (sections 1 and 2).

Go's ``math/rand`` is replaced by NumPy's generator, so per-seed values differ from the
published ones; the protocol says to compare 10-seed means.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpuslice_hub.placement.state import ClusterState
from gpuslice_hub.placement.types import Request

TUNE = 1.3


@dataclass(frozen=True)
class Pod:
    name: str
    request: Request
    gpu_milli: int  # num_gpu * g: what the pod adds to "arrived"
    per_gpu_milli: int  # g: what the tune-up's stop test uses


@dataclass(frozen=True)
class Workload:
    pods: list[Request]  # arrival order: shuffled originals, then tune-up copies
    demand: list[int]  # milli-GPU of each pod
    originals: list[Request]  # name-sorted originals (FGD's typical pods come from these)
    rank: np.ndarray  # node tie-break ranks


def read_pods(path: str | Path) -> list[Pod]:
    """Every CSV row becomes a pod, sorted by name."""
    pods = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            cpu, mem = int(row["cpu_milli"]), int(row["memory_mib"])
            num = int(row["num_gpu"])
            g = min(int(row["gpu_milli"]), 1000) if num > 0 else 0
            spec = (row.get("gpu_spec") or "").strip()
            models = tuple(m for m in spec.split("|") if m)
            if num == 0 or g == 0:
                req = Request("none", cpu_milli=cpu, memory_mib=mem)
                num, g = 0, 0
            elif num == 1 and g < 1000:
                req = Request("share", cpu_milli=cpu, memory_mib=mem, gpu_milli=g, models=models)
            else:
                req = Request("gpu", cpu_milli=cpu, memory_mib=mem, count=num, models=models)
            pods.append(Pod(row["name"], req, num * g, g))
    pods.sort(key=lambda p: p.name)
    return pods


def read_nodes(path: str | Path) -> list[dict]:
    with open(path, newline="") as f:
        rows = [
            {
                "name": r["sn"],
                "cpu": int(r["cpu_milli"]),
                "mem": int(r["memory_mib"]),
                "gpus": int(r["gpu"]),
                "model": r["model"],
            }
            for r in csv.DictReader(f)
        ]
    rows.sort(key=lambda r: r["name"])
    return rows


def build_workload(pods: list[Pod], n_nodes: int, capacity_milli: int, seed: int) -> Workload:
    """Shuffle, tune up to 130 % of capacity, and draw the node ranks (protocol section 1)."""
    rng = np.random.default_rng(seed)
    rng.integers(1 << 62)  # the discarded draw: keeps the order of draws as the protocol's
    seq = [pods[i] for i in rng.permutation(len(pods))]
    total = sum(p.gpu_milli for p in pods)
    target = TUNE * capacity_milli
    while True:
        p = pods[int(rng.integers(len(pods)))]
        # The simulator's quirk: the stop test adds the per-GPU milli, the total adds all.
        if total + p.per_gpu_milli > target:
            break
        seq.append(p)
        total += p.gpu_milli
    rank = rng.permutation(n_nodes)
    return Workload(
        pods=[p.request for p in seq],
        demand=[p.gpu_milli for p in seq],
        originals=[p.request for p in pods],
        rank=rank,
    )


def build_cluster(nodes: list[dict], rank: np.ndarray) -> ClusterState:
    """The node list as a ClusterState; GPU memory is not modelled (the protocol ignores it)."""
    n = len(nodes)
    g = max(r["gpus"] for r in nodes)
    models = sorted({r["model"] for r in nodes})
    count = np.array([r["gpus"] for r in nodes])
    ok = np.arange(g)[None, :] < count[:, None]
    model = np.repeat(np.array([models.index(r["model"]) for r in nodes], np.int32)[:, None], g, 1)
    return ClusterState(
        names=[r["name"] for r in nodes],
        rank=np.asarray(rank, np.int64),
        cpu_free=np.array([r["cpu"] for r in nodes], np.int64),
        mem_free=np.array([r["mem"] for r in nodes], np.int64),
        gpu_free=np.where(ok, 1000, 0).astype(np.int64),
        gpu_mem_free=np.zeros((n, g), np.int64),
        gpu_mem_cap=np.zeros((n, g), np.int64),
        gpu_model=model,
        gpu_ok=ok,
        models=models,
        mig_free=np.zeros((n, g, 0), np.int32),
    )
