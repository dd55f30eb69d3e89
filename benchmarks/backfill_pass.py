"""What backfill behind a blocked job costs a scheduler pass (jobs/reservation.py).

H hosts x 8 A100s, every GPU held by a running batch job with its own expected end; at the
head of the queue a job that needs a whole host (it gets a reservation: a binary search over
the running jobs' ends, each step a placement on a copy of the cluster), then N jobs of one
GPU that would run past the head's start (each shape is placed once against the cluster at
that time, then told the same). Times a pass after a change (the whole queue tried again),
median of ``--passes``.

    .venv/bin/python benchmarks/backfill_pass.py [--hosts 25 200] [--jobs 1000 10000]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import update

from gpuslice_hub.db.jobs_models import JobRow
from gpuslice_hub.db.models import utcnow
from gpuslice_hub.jobs.manager import JobManager
from gpuslice_hub.jobs.scheduler import Scheduler
from tests.jobs.full_cluster import IdleBackend, hosts, insert_queued
from tests.service.conftest import build_ledger

PROFILES = [{"name": f"gpu-{n}", "kind": "gpu", "count": n} for n in (1, 8)]


def measure(n_hosts: int, n_jobs: int, passes: int) -> tuple[float, float]:
    """ms: the pass that starts the running jobs' successors' queue, then one after a
    change."""
    folder = Path(tempfile.mkdtemp())
    ledger = build_ledger(f"sqlite:///{folder}/l.sqlite", PROFILES, hosts=hosts(n_hosts))
    manager = JobManager(ledger, ledger.db, IdleBackend(), folder / "jobs")  # type: ignore[arg-type]
    manager.log.setLevel(logging.WARNING)
    manager.run_jobs_as_service_user = True
    scheduler = Scheduler(manager)
    now = utcnow()
    running = insert_queued(
        ledger.db, folder, [(f"r{i}", "gpu-1", "normal") for i in range(8 * n_hosts)]
    )
    with ledger.db.writing() as s:
        for i, job_id in enumerate(running):  # ends spread over the next day
            s.execute(update(JobRow).where(JobRow.id == job_id).values(max_runtime=600 + 60 * i))
    scheduler.tick(now)
    head = [("h", "gpu-8", "normal")]
    rest = [(f"q{i}", "gpu-1", "normal") for i in range(n_jobs)]
    insert_queued(ledger.db, folder, head + rest)
    later = now + timedelta(seconds=1)
    start = time.perf_counter()
    scheduler.tick(later)
    first = time.perf_counter() - start
    times = []
    for _ in range(passes):
        scheduler._marker = None  # as after a change: the whole queue is tried
        start = time.perf_counter()
        scheduler.tick(later)
        times.append(time.perf_counter() - start)
    ledger.db.dispose()
    return 1000 * first, 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[25, 200])
    parser.add_argument("--jobs", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--passes", type=int, default=5)
    args = parser.parse_args()
    print(f"{'hosts':>5} {'running':>8} {'queued':>7}  {'first pass':>10}  {'after a change':>14}")
    for n_hosts in args.hosts:
        for n_jobs in args.jobs:
            first, again = measure(n_hosts, n_jobs, args.passes)
            print(f"{n_hosts:>5} {8 * n_hosts:>8} {n_jobs:>7}  {first:>8.0f}ms  {again:>12.0f}ms")


if __name__ == "__main__":
    main()
