"""How the simulator's result moves with the share of interactive demand, the idle
fraction of sessions and the reclaim timeout (issue #14's sensitivity).

Each variant changes one thing of the base case (a smaller cluster than the seeds' case,
with as many users per GPU) and runs policy 1 and policy 4 on the same seed; the reclaim
timeout only matters to policy 4, which runs alone there.

    .venv/bin/python benchmarks/sim_sensitivity.py [--hosts 6] [--days 7] [--seed 1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.sim.cli import main as sim


def variants(users: int) -> list[tuple[str, list[str], str]]:
    """(what changes, extra arguments, policies)."""
    folder = Path(tempfile.mkdtemp(prefix="sim-sensitivity-"))
    out: list[tuple[str, list[str], str]] = []
    for factor in (0.5, 1.0, 2.0):
        out.append(
            (f"interactive users x{factor:g}", ["--users", str(round(users * factor))], "1,4")
        )
    for minutes in (10, 25, 60):
        toml = folder / f"idle{minutes}.toml"
        toml.write_text(f"[stretches]\nidle_median_minutes = {minutes}\n")
        out.append((f"idle stretch median {minutes} min", ["--interactive", str(toml)], "1,4"))
    # policy 4 as it is (3 600 s), then with each other timeout
    out.append(("reclaim timeout 1800, 3600, 7200 s", ["--vary", "idle_timeout=1800,7200"], "4"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--hosts", type=int, default=6)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--batch-load", type=float, default=1.0)
    args = parser.parse_args()
    users = round(300 * args.hosts / 25)  # the base case's 1.5 users per GPU
    base = ["run", "--hosts", str(args.hosts), "--mig-hosts", "1", "--days", str(args.days)]
    base += ["--seed", str(args.seed), "--batch-load", str(args.batch_load), "--users", str(users)]
    for what, extra, policies in variants(users):
        print(f"\n## {what}\n", flush=True)
        sim([*base, *extra, "--policies", policies])


if __name__ == "__main__":
    main()
