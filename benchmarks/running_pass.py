"""What one job-scheduler pass costs when many jobs run and nothing changed.

H hosts x 8 A100s, N ``normal`` jobs of one GPU each started by the first pass (a backend
that runs nothing and answers "alive"): every later pass polls and checks each running job
and finds nothing to do. Prints the median of the later passes.

    .venv/bin/python benchmarks/running_pass.py [--hosts 200] [--jobs 100 1000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuslice_hub.jobs.manager import JobManager
from gpuslice_hub.jobs.scheduler import Scheduler
from tests.jobs.full_cluster import PROFILES, IdleBackend, hosts, insert_queued
from tests.service.conftest import build_ledger


def measure(n_hosts: int, n_jobs: int, passes: int) -> tuple[int, float]:
    folder = Path(tempfile.mkdtemp())
    ledger = build_ledger(
        f"sqlite:///{folder}/ledger.sqlite", profiles=PROFILES, hosts=hosts(n_hosts)
    )
    try:
        manager = JobManager(ledger, ledger.db, IdleBackend(), folder / "jobs")  # type: ignore[arg-type]
        manager.run_jobs_as_service_user = True
        scheduler = Scheduler(manager)
        insert_queued(
            ledger.db, folder, [(f"u{i % 500}", "gpu-1", "normal") for i in range(n_jobs)]
        )
        scheduler.tick()
        running = len(manager.backend.started)  # type: ignore[attr-defined]
        times = []
        for _ in range(passes):
            start = time.perf_counter()
            scheduler.tick()
            times.append(time.perf_counter() - start)
        return running, 1000 * statistics.median(times)
    finally:
        ledger.db.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--hosts", type=int, default=200)
    parser.add_argument("--jobs", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--passes", type=int, default=7)
    args = parser.parse_args()
    print(f"{'hosts':>5} {'running':>8} {'pass, nothing changed':>22}")
    for n in args.jobs:
        running, ms = measure(args.hosts, n, args.passes)
        print(f"{args.hosts:>5} {running:>8} {ms:>20.1f}ms", flush=True)


if __name__ == "__main__":
    main()
