"""``python -m benchmarks.tracebench``: benchmarks of the placement engine.

``python -m benchmarks.tracebench openb --pods FILE --nodes FILE --policy NAME
--seeds 42-51 [--json]``
runs the openb protocol (data/openb/PROTOCOL.md) once per seed and prints the seed means.
``--mig {mig,timeslice,mixed}`` runs the MIG variant instead (see ``tracebench/mig.py``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from gpuslice_hub.placement import POLICIES

from .report import summarise, table
from .simulate import run_seed
from .workload import read_nodes, read_pods


def parse_seeds(text: str) -> list[int]:
    """``42-51``, ``42,44`` or ``42``."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)-(\d+)", part)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            if hi < lo:
                raise argparse.ArgumentTypeError(f"empty seed range {part!r}")
            seeds.extend(range(lo, hi + 1))
        elif part.isdigit():
            seeds.append(int(part))
        else:
            raise argparse.ArgumentTypeError(f"bad seed list {text!r}")
    return seeds


def trace_name(path: str) -> str:
    stem = Path(path).stem
    return stem.removeprefix("openb_pod_list_")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.tracebench", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    openb = sub.add_parser("openb", help="the openb trace protocol of the FGD paper")
    openb.add_argument("--pods", required=True, help="openb_pod_list_*.csv")
    openb.add_argument("--nodes", required=True, help="openb_node_list_gpu_node.csv")
    openb.add_argument("--policy", default="default", choices=[*sorted(POLICIES), "default-online"])
    openb.add_argument("--seeds", type=parse_seeds, default=parse_seeds("42-51"))
    openb.add_argument("--json", action="store_true", help="print one JSON object")
    openb.add_argument(
        "--mig",
        choices=("mig", "timeslice", "mixed"),
        help="MIG variant: requests rounded up to MIG profiles on partitioned GPUs",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    pods = read_pods(args.pods)
    nodes = read_nodes(args.nodes)
    if args.mig:
        from .mig import run_mig_seed

        results = [run_mig_seed(pods, nodes, args.policy, s, args.mig) for s in args.seeds]
    else:
        results = [run_seed(pods, nodes, args.policy, s) for s in args.seeds]
    summary = summarise(trace_name(args.pods), args.policy, results)
    if args.mig:
        summary["mig_pool"] = args.mig
    if args.json:
        json.dump(summary, sys.stdout)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(table(summary, results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
