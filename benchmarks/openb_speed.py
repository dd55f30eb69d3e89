"""Where one seed's time goes, with and without the per-host score cache.

    .venv/bin/python benchmarks/openb_speed.py --trace default --policy default --seed 42

Without the cache every feasible host is rescored for every request (what a plain
array implementation of FGD does); with it only hosts changed since the last request of
the same shape are.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
from pathlib import Path

from benchmarks.tracebench import simulate
from benchmarks.tracebench.workload import read_nodes, read_pods
from gpuslice_hub.placement import select as select_module

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "openb"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--trace", default="default")
    ap.add_argument("--policy", default="default")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--no-cache", action="store_true", help="also time without the cache")
    ap.add_argument("--profile", action="store_true", help="print the top functions")
    args = ap.parse_args()
    pods = read_pods(f"{args.data}/openb_pod_list_{args.trace}.csv")
    nodes = read_nodes(f"{args.data}/openb_node_list_gpu_node.csv")

    prof = cProfile.Profile() if args.profile else None
    if prof:
        prof.enable()
    r = simulate.run_seed(pods, nodes, args.policy, args.seed)
    if prof:
        prof.disable()
    print(f"cached:   {r.seconds:.2f} s, column 130 = {r.columns['130']}")
    for k, v in r.breakdown.items():
        print(f"  {k}: {v:.3f}")
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)

    if args.no_cache:
        original = select_module.select

        def uncached(state, request, policy, learn=True):
            state.cache.clear()  # forget every host's score: rescore all feasible hosts
            return original(state, request, policy, learn)

        simulate.select = uncached
        r = simulate.run_seed(pods, nodes, args.policy, args.seed)
        simulate.select = original
        print(f"uncached: {r.seconds:.2f} s, column 130 = {r.columns['130']}")
        for k, v in r.breakdown.items():
            print(f"  {k}: {v:.3f}")


if __name__ == "__main__":
    main()
