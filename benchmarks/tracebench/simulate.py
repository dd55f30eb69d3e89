"""One seed of the protocol: place every pod in order, log (arrived, used) after each."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from gpuslice_hub.placement.policies.typical import typical_from_requests
from gpuslice_hub.placement.select import select
from gpuslice_hub.placement.state import ClusterState

from .columns import columns
from .workload import Pod, Workload, build_cluster, build_workload


@dataclass
class SeedResult:
    seed: int
    columns: dict[str, float | None]
    failed: int
    pods: int
    seconds: float
    breakdown: dict[str, float] = field(default_factory=dict)
    extra: dict[str, float] = field(default_factory=dict)


def make_policy(name: str, workload: Workload, seed: int):
    """The policy as the benchmark runs it.

    FGD and default get the trace's typical pods in advance, as in the paper;
    ``default-online`` learns them from the arriving requests, as the service does.
    """
    from gpuslice_hub.placement import POLICIES

    if name == "default-online":
        return POLICIES["default"]()
    if name == "random":
        return POLICIES[name](seed=seed + 1_000_003)
    if name == "fgd":
        return POLICIES[name](typical_from_requests(workload.originals))
    if name == "default":
        return POLICIES[name](typical_from_requests(workload.originals, memory=True))
    return POLICIES[name]()


def run_seed(
    pods: list[Pod],
    nodes: list[dict],
    policy_name: str,
    seed: int,
    cluster: ClusterState | None = None,
    workload: Workload | None = None,
    ks: tuple[int, ...] = (100, 110, 120, 130),
) -> SeedResult:
    t_start = time.perf_counter()
    total_gpus = sum(r["gpus"] for r in nodes)
    if workload is None:
        workload = build_workload(pods, len(nodes), total_gpus * 1000, seed)
    state = cluster if cluster is not None else build_cluster(nodes, workload.rank)
    policy = make_policy(policy_name, workload, seed)
    t_built = time.perf_counter()
    arrived = np.cumsum(np.array(workload.demand, np.int64))
    used = np.zeros(len(workload.pods), np.int64)
    failed = 0
    t_select = 0.0
    t_apply = 0.0
    for i, request in enumerate(workload.pods):
        t0 = time.perf_counter()
        chosen = select(state, request, policy)
        t1 = time.perf_counter()
        t_select += t1 - t0
        if chosen is None:
            failed += 1
        else:
            state.apply(chosen[0], request, chosen[1])
            t_apply += time.perf_counter() - t1
        used[i] = state.used_milli
    t_placed = time.perf_counter()
    cols = columns(arrived, used, total_gpus, ks)
    t_end = time.perf_counter()
    timing = getattr(policy, "timing", None)
    breakdown = {
        "build_workload_and_cluster": t_built - t_start,
        "select_total": t_select,
        "apply": t_apply,
        "loop_overhead": (t_placed - t_built) - t_select - t_apply,
        "columns": t_end - t_placed,
    }
    if timing is not None:
        breakdown["select.fragmentation_scoring"] = timing.frag_s
        breakdown["select.filter_and_argmax"] = t_select - timing.frag_s
        breakdown["hosts_rescored"] = float(timing.hosts_scored)
    return SeedResult(seed, cols, failed, len(workload.pods), t_end - t_start, breakdown)
