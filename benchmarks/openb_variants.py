"""The FGD variants tried while designing the default policy (docs/benchmarks.md).

    .venv/bin/python benchmarks/openb_variants.py --trace default --seeds 42-47 \
        --variants fgd,exact,tb-host-bf,cpu-only

Each variant is FGD over the engine's candidate/fragmentation code with one thing changed:
the primary score, the GPU choice inside a host, the tie-break keys before the host rank,
or where the typical pods come from. Prints the mean of column 130 per variant.
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import replace
from pathlib import Path
from statistics import fmean

import numpy as np

from benchmarks.tracebench import simulate
from benchmarks.tracebench.cli import parse_seeds
from benchmarks.tracebench.workload import Workload, read_nodes, read_pods
from gpuslice_hub.placement.policies.fgd import FGD, ScoreCache, fragmentation_delta
from gpuslice_hub.placement.policies.typical import (
    OnlineTypical,
    Shape,
    Typical,
    shape_of,
    typical_from_counts,
    typical_from_requests,
)
from gpuslice_hub.placement.state import ClusterState
from gpuslice_hub.placement.types import Request

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "openb"

# name: (primary, gpu choice, tie-breaks, typical source, packed measure)
VARIANTS: dict[str, tuple[str, str, tuple[str, ...], str, bool]] = {
    "fgd": ("fgd", "first", (), "trace", False),
    "default": ("fgd", "first", ("cpu-only-gl",), "trace", False),
    "memory": ("fgd", "first", (), "trace-mem", False),
    "default-memory": ("fgd", "first", ("cpu-only-gl",), "trace-mem", False),
    "exact": ("exact", "first", (), "trace", False),
    "tb-exact": ("fgd", "exact", ("exact",), "trace", False),
    "tb-bestfit-all": ("fgd", "slot", ("slot", "host-gl", "host-cpu"), "trace", False),
    "tb-host-bf": ("fgd", "first", ("host-gl", "host-cpu"), "trace", False),
    "tb-host-wf": ("fgd", "first", ("host-gl-max", "host-cpu-max"), "trace", False),
    "tb-fewer-gpus": ("fgd", "first", ("fewer-gpus", "cpu-only-gl"), "trace", False),
    "tb-more-gpus": ("fgd", "first", ("more-gpus", "cpu-only-gl"), "trace", False),
    "tb-ratio": ("fgd", "first", ("ratio",), "trace", False),
    "gpu-exact": ("fgd", "exact", (), "trace", False),
    "gpu-waste": ("fgd", "waste", (), "trace", False),
    "linear40": ("linear40", "first", (), "trace", False),
    "linear100": ("linear100", "first", (), "trace", False),
    "typical-cov100": ("fgd", "first", (), "cov100", False),
    "typical-demand": ("fgd", "first", (), "demand", False),
    "packed": ("fgd", "first", (), "trace", True),
    "online": ("fgd", "first", (), "online", False),
    "first300": ("fgd", "first", (), "first300", False),
    "first2000": ("fgd", "first", (), "first2000", False),
}


def counts(requests: list[Request]) -> Counter[Shape]:
    c: Counter[Shape] = Counter()
    for r in requests:
        s = shape_of(r)
        if s is not None:
            c[s] += 1
    return c


def waste_table(requests: list[Request]) -> np.ndarray:
    """W[r]: expected final leftover of a GPU with r free, filled by random arrivals."""
    sizes: Counter[int] = Counter()
    for r in requests:
        if r.kind == "share":
            sizes[r.gpu_milli] += 1
        elif r.kind == "gpu":
            sizes[1000] += r.count
    s = np.array(sorted(sizes))
    p = np.array([sizes[x] for x in s], float)
    w = np.zeros(1001)
    for free in range(1001):
        fit = s <= free
        w[free] = (p[fit] * w[free - s[fit]]).sum() / p[fit].sum() if fit.any() else free
    return w


class Variant(FGD):
    n_keys = 4

    def __init__(self, spec: tuple, typical: Typical | None, waste: np.ndarray) -> None:
        super().__init__(typical)
        self.primary, self.gpu_choice, self.ties, _, self.packed = spec
        self.waste = waste

    def _fill(
        self,
        state: ClusterState,
        request: Request,
        rows: np.ndarray,
        typical: Typical,
        cache: ScoreCache,
    ) -> None:
        pos, gpu, delta, gl_after = fragmentation_delta(
            state, request, rows, typical, self.packed, self.memory
        )
        if self.primary == "fgd":
            prim = np.floor(100.0 / (1.0 + np.exp(-delta / 1000.0)))
        elif self.primary == "exact":
            prim = np.round(delta, 6)
        else:
            prim = np.floor(delta / int(self.primary.removeprefix("linear")))
        host = rows[pos]
        slot_after = np.zeros(pos.size)
        if request.kind == "share":
            slot_after = state.gpu_free[host, gpu] - request.gpu_milli
        inner = {
            "first": np.zeros(pos.size),
            "exact": np.round(delta, 6),
            "slot": -slot_after,
            "waste": np.zeros(pos.size),
        }[self.gpu_choice]
        if self.gpu_choice == "waste" and request.kind == "share":
            before = state.gpu_free[host, gpu]
            inner = -(self.waste[before - request.gpu_milli] - self.waste[before])
        order = np.lexsort((-inner, -prim, pos))
        first = np.ones(order.size, bool)
        first[1:] = pos[order][1:] != pos[order][:-1]
        best = order[first]
        r = host[best]
        cache.keys[r] = 0
        cache.keys[r, 0] = prim[best]
        cpu_after = state.cpu_free[r] - request.cpu_milli
        gl = gl_after[best]
        n_gpus = state.gpu_ok[r].sum(1)
        need = (typical.weight * typical.cpu).sum() / max(
            (typical.weight * typical.count * typical.milli).sum(), 1
        )
        for i, tie in enumerate(self.ties, start=1):
            key = {
                "exact": np.round(delta[best], 6),
                "slot": -slot_after[best],
                "host-gl": -gl,
                "host-cpu": -cpu_after,
                "host-gl-max": gl,
                "host-cpu-max": cpu_after,
                "fewer-gpus": -n_gpus,
                "more-gpus": n_gpus,
                "ratio": np.round(-np.abs(cpu_after - need * gl) / 1000.0),
                "cpu-only-gl": -gl if request.kind == "none" else np.zeros(r.size),
            }[tie]
            cache.keys[r, i] = key
        cache.gpu[r] = gpu[best]
        cache.version[rows] = state.version[rows]

    def _select(
        self, state: ClusterState, request: Request, candidates: np.ndarray, cache: ScoreCache
    ) -> int:
        k = cache.keys[candidates]
        order = np.lexsort((state.rank[candidates], -k[:, 3], -k[:, 2], -k[:, 1], -k[:, 0]))
        return int(candidates[order[0]])


def make(name: str, workload: Workload) -> Variant:
    spec = VARIANTS[name]
    source = spec[3]
    typical: Typical | None
    if source == "trace":
        typical = typical_from_counts(counts(workload.originals))
    elif source == "trace-mem":
        typical = typical_from_requests(workload.originals, memory=True)
    elif source == "cov100":
        typical = typical_from_counts(counts(workload.originals), coverage=1.0)
    elif source == "demand":
        t = typical_from_counts(counts(workload.originals), coverage=1.0)
        # weighed by GPU demand; integral, as fragmentation's exact sums want (frag.py)
        typical = replace(t, weight=t.weight * np.where(t.count > 0, t.count * t.milli, 0))
    elif source.startswith("first"):
        typical = typical_from_counts(counts(workload.pods[: int(source.removeprefix("first"))]))
    else:
        typical = None
    policy = Variant(spec, typical, waste_table(workload.originals))
    if source == "online":
        policy.online = OnlineTypical()
    policy.memory = source == "trace-mem"
    return policy


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--trace", default="default")
    ap.add_argument("--seeds", default="42-47")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    pods = read_pods(f"{args.data}/openb_pod_list_{args.trace}.csv")
    nodes = read_nodes(f"{args.data}/openb_node_list_gpu_node.csv")
    for name in args.variants.split(","):
        simulate.make_policy = lambda _n, wl, _s, name=name: make(name, wl)  # type: ignore[misc]
        cols = [
            simulate.run_seed(pods, nodes, name, s).columns["130"] for s in parse_seeds(args.seeds)
        ]
        print(
            f"{args.trace} {args.seeds} {name:16s} {fmean(c for c in cols if c is not None):.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
