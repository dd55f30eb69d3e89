"""The MIG variant of the openb protocol.

Profile set: the A100/H100 MIG compute profiles 1g, 2g, 3g, 4g and 7g (sevenths of a GPU;
named as on an A100 80GB: 1g.10gb, 2g.20gb, 3g.40gb, 4g.40gb). A fractional request is
rounded up to the smallest profile with at least its milli-GPU (1g <= 142, 2g <= 285,
3g <= 428, 4g <= 571); above 571 it needs a whole GPU.

MIG partitions are static, so the pool is planned before the run, as an operator would,
from the trace's own (original) requests: GPUs are left whole (MIG off) in proportion to
the demand that needs whole GPUs, and the rest are split into the valid geometries
4g+3g and 3g+2g+1g+1g in proportion to the demand for 4g versus smaller profiles.

Pools: ``timeslice`` is the plain protocol (every GPU time-sliced); ``mig`` partitions GPUs
by the plan and sends every fractional request to a MIG instance; ``mixed`` partitions
every other host (by name) by the plan and leaves the rest time-sliced, and a fractional
request takes a time-sliced share if any host has one, else a MIG instance.

Allocation is what was handed out (a MIG instance counts as its sevenths of a GPU, so
rounding up shows as allocation); ``requested`` is what the placed requests asked for.
"""

from __future__ import annotations

import time

import numpy as np

from gpuslice_hub.placement.select import select
from gpuslice_hub.placement.types import Request

from .columns import columns
from .simulate import SeedResult, make_policy, run_seed
from .workload import Pod, build_cluster, build_workload

PROFILES = {"1g.10gb": 1, "2g.20gb": 2, "3g.40gb": 3, "4g.40gb": 4}
LAYOUTS = {
    "4g+3g": ["4g.40gb", "3g.40gb"],
    "3g+2g+1g+1g": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
}


def profile_for(gpu_milli: int) -> str | None:
    """The smallest profile holding ``gpu_milli``; None when only a whole GPU does."""
    for name, sevenths in PROFILES.items():
        if sevenths * 1000 // 7 >= gpu_milli:
            return name
    return None


def as_mig(request: Request) -> Request:
    """The request a MIG pool serves: a share becomes a profile or a whole GPU."""
    if request.kind != "share":
        return request
    profile = profile_for(request.gpu_milli)
    if profile is None:
        return Request("gpu", request.cpu_milli, request.memory_mib, models=request.models)
    return Request("mig", request.cpu_milli, request.memory_mib, mig_profile=profile,
                   models=request.models)  # fmt: skip


def plan(originals: list[Request], n_gpus: int) -> dict[str, int]:
    """How many GPUs to leave whole and how many to split into each layout."""
    whole = 0.0
    big = 0.0
    small = 0.0
    for r in originals:
        m = as_mig(r)
        if m.kind == "gpu":
            whole += 7 * m.count
        elif m.kind == "mig":
            sevenths = PROFILES[m.mig_profile]
            if sevenths == 4:
                big += sevenths
            else:
                small += sevenths
    total = whole + big + small
    n_whole = round(n_gpus * whole / total)
    n_big = round((n_gpus - n_whole) * big / (big + small)) if big + small else 0
    return {"whole": n_whole, "4g+3g": n_big, "3g+2g+1g+1g": n_gpus - n_whole - n_big}


def layout_sequence(counts: dict[str, int]) -> list[str]:
    """Interleave the layouts so that every host gets a similar mix."""
    total = sum(counts.values())
    given = dict.fromkeys(counts, 0)
    out = []
    for i in range(total):
        name = max(counts, key=lambda k: counts[k] * (i + 1) / total - given[k])
        given[name] += 1
        out.append(name)
    return out


def partition(state, rows: np.ndarray, counts: dict[str, int]) -> None:
    """Turn GPUs of hosts ``rows`` into MIG GPUs following ``counts`` (in place)."""
    profiles = list(PROFILES)
    state.mig_profiles = profiles
    state.mig_milli = np.array([PROFILES[p] * 1000 // 7 for p in profiles], np.int64)
    state.mig_free = np.zeros((*state.gpu_ok.shape, len(profiles)), np.int32)
    state.mig_ok = np.zeros(state.gpu_ok.shape, bool)
    slots = [(r, i) for r in rows for i in np.flatnonzero(state.gpu_ok[r])]
    for (r, i), layout in zip(slots, layout_sequence(counts), strict=True):
        if layout == "whole":
            continue
        state.gpu_ok[r, i] = False
        state.gpu_free[r, i] = 0
        state.mig_ok[r, i] = True
        for p in LAYOUTS[layout]:
            state.mig_free[r, i, profiles.index(p)] += 1
    state.cache.clear()


def run_mig_seed(pods: list[Pod], nodes: list[dict], policy_name: str, seed: int, pool: str):
    if pool == "timeslice":
        return run_seed(pods, nodes, policy_name, seed)
    t0 = time.perf_counter()
    total_gpus = sum(r["gpus"] for r in nodes)
    workload = build_workload(pods, len(nodes), total_gpus * 1000, seed)
    state = build_cluster(nodes, workload.rank)
    rows = np.arange(len(nodes)) if pool == "mig" else np.arange(0, len(nodes), 2)
    n_part = int(state.gpu_ok[rows].sum())
    partition(state, rows, plan(workload.originals, n_part))
    policy = make_policy(policy_name, workload, seed)
    used = np.zeros(len(workload.pods), np.float64)
    requested = np.zeros(len(workload.pods), np.float64)
    handed = 0.0
    asked = 0.0
    failed = 0
    for i, (request, demand) in enumerate(zip(workload.pods, workload.demand, strict=True)):
        options = [as_mig(request)] if pool == "mig" else [request, as_mig(request)]
        for option in dict.fromkeys(options):
            chosen = select(state, option, policy)
            if chosen is not None:
                state.apply(chosen[0], option, chosen[1])
                if option.kind == "mig":
                    handed += PROFILES[option.mig_profile] * 1000 / 7
                else:
                    handed += option.total_gpu_milli
                asked += demand
                break
        else:
            failed += 1
        used[i] = handed
        requested[i] = asked
    arrived = np.cumsum(np.array(workload.demand, np.int64))
    result = SeedResult(
        seed, columns(arrived, used, total_gpus), failed, len(workload.pods),
        time.perf_counter() - t0,
    )  # fmt: skip
    result.extra["requested_pct_130"] = columns(arrived, requested, total_gpus)["130"] or 0.0
    result.extra["partitioned_gpus"] = float(n_part)
    return result
