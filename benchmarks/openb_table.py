"""Markdown tables from ``openb_sweep.py`` results beside the published numbers.

.venv/bin/python benchmarks/openb_table.py benchmarks/results/openb.jsonl
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "openb"
PUBLISHED_NAME = {
    "random": "Random",
    "dotprod": "DotProd",
    "gpu-clustering": "GpuClustering",
    "gpu-packing": "GpuPacking",
    "best-fit": "BestFit",
    "fgd": "FGD",
}
TRACES = ["default", "cpu050", "gpushare40", "gpuspec10", "multigpu20"]


def load(path: str) -> dict[tuple[str, str], dict]:
    cells = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            cell = json.loads(line)
            cells[(cell["trace"], cell["policy"])] = cell  # later lines win
    return cells


def published() -> dict[tuple[str, str, str], float]:
    with open(DATA / "published_allocation.csv", newline="") as f:
        return {
            (r["trace"], r["policy"], r["arrival_pct"]): float(r["mean_allocated_pct"])
            for r in csv.DictReader(f)
        }


def main() -> None:
    cells = load(sys.argv[1])
    pub = published()
    col = sys.argv[2] if len(sys.argv) > 2 else "130"
    policies = [
        p for p in [*PUBLISHED_NAME, "default", "default-online"] if any(k[1] == p for k in cells)
    ]
    print(f"Allocated GPU % at {col} % arrival: ours (published, ours - published)\n")
    print("| policy | " + " | ".join(TRACES) + " |")
    print("|---|" + "---|" * len(TRACES))
    for p in policies:
        row = []
        for t in TRACES:
            cell = cells.get((t, p))
            if cell is None:
                row.append("not run")
                continue
            ours = cell["allocated_pct"][col]
            ref = pub.get((t, PUBLISHED_NAME.get(p, "FGD"), col))
            label = "FGD " if p.startswith("default") else ""
            if ref is None:
                row.append(f"{ours:.2f}")
            else:
                row.append(f"{ours:.2f} ({label}{ref:.2f}, {ours - ref:+.2f})")
        print(f"| {p} | " + " | ".join(row) + " |")
    seeds = {tuple(c["seeds"]) for c in cells.values()}
    print(f"\nseeds: {sorted(seeds)}")


if __name__ == "__main__":
    main()
