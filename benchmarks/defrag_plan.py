"""What one defragmentation plan costs on a full cluster, where no move can make room.

    .venv/bin/python benchmarks/defrag_plan.py [--hosts 50,200,500]

Every GPU (8 A100s per host) holds a preemptible half-GPU job and a person's 0.4-GPU share:
0.1 of each GPU is free, so the free capacity adds up to far more than the half GPU asked
for (the plan's quick check passes) but no move can gather it. This is the worst case a
scheduler pass meets: the plan looks at its bounded set of hosts and finds nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpuslice_hub.jobs.defrag import plan_move  # noqa: E402
from gpuslice_hub.ledger import Caller  # noqa: E402
from tests.jobs.full_cluster import hosts  # noqa: E402
from tests.service.conftest import build_ledger  # noqa: E402

PROFILES = [
    {"name": "share-500", "kind": "share", "gpu_milli": 500, "gpu_memory_mib": 40960},
    {"name": "share-400", "kind": "share", "gpu_milli": 400, "gpu_memory_mib": 20480},
]


def plan_seconds(n_hosts: int, repeat: int) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as tmp:
        ledger = build_ledger(f"sqlite:///{tmp}/l.sqlite", PROFILES, hosts=hosts(n_hosts))
        jobs = []
        for i in range(n_hosts * 8):
            a, _ = ledger.allocate(
                Caller(f"b{i}", (), "bench"),
                "share-500",
                f"job-{i}",
                purpose="batch",
                preemptible=True,
                learn=False,
                quiet=True,
            )
            jobs.append(
                SimpleNamespace(
                    id=i,
                    state="running",
                    priority_class="preemptible",
                    allocation_ids=[a["id"]],
                    profile="share-500",
                    groups=[],
                    last_checkpoint_at=None,
                    attempt_started_at=None,
                )
            )
            ledger.allocate(Caller(f"u{i}", (), f"u{i}"), "share-400", "", learn=False)
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            move = plan_move(
                ledger, -1, ledger.profiles["share-500"], None, jobs, lambda j: None, 10
            )
            times.append(time.perf_counter() - t)
            assert move is None
        ledger.db.dispose()
        return statistics.median(times), len(jobs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="50,200,500")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print("| hosts | running preemptible jobs | one plan (s, median) |")
    print("|---:|---:|---:|")
    for n in (int(x) for x in args.hosts.split(",")):
        seconds, jobs = plan_seconds(n, args.repeat)
        print(f"| {n} | {jobs} | {seconds:.2f} |")


if __name__ == "__main__":
    main()
