"""Run the openb protocol over traces x policies and append one JSON line per cell.

    .venv/bin/python benchmarks/openb_sweep.py --traces default,cpu050 \
        --policies fgd,default --seeds 42-51 --out benchmarks/results/openb.jsonl

Each line is what ``python -m benchmarks.tracebench openb --json`` prints for that cell.
One process, one core: run it in the background and keep other heavy work off the machine meanwhile.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from pathlib import Path

from benchmarks.tracebench.cli import main as bench_main
from benchmarks.tracebench.cli import parse_seeds

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "openb"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--traces", default="default,cpu050,gpushare40,gpuspec10,multigpu20")
    ap.add_argument(
        "--policies", default="random,dotprod,gpu-clustering,gpu-packing,best-fit,fgd,default"
    )
    ap.add_argument("--seeds", default="42-51")
    ap.add_argument("--mig", default="", help="mig, timeslice or mixed: the MIG variant")
    ap.add_argument("--out", default="benchmarks/results/openb.jsonl")
    args = ap.parse_args()
    parse_seeds(args.seeds)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for trace in args.traces.split(","):
        for policy in args.policies.split(","):
            argv = [
                "openb",
                "--pods", f"{args.data}/openb_pod_list_{trace}.csv",
                "--nodes", f"{args.data}/openb_node_list_gpu_node.csv",
                "--policy", policy,
                "--seeds", args.seeds,
                "--json",
            ]  # fmt: skip
            if args.mig:
                argv += ["--mig", args.mig]
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                bench_main(argv)
            line = buf.getvalue().strip()
            with out.open("a") as f:
                f.write(line + "\n")
            cell = json.loads(line)
            print(trace, policy, cell["allocated_pct"], cell["seconds_per_seed"], flush=True)


if __name__ == "__main__":
    main()
