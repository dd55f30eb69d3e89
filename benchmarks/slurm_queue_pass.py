"""What the service's job pass costs when Slurm queues the jobs (``job_backend = "slurm"``).

A real single-node Slurm (the test harness's: slurmctld, slurmd, munged in a temp dir; run
as root) whose only 1g.10gb instance a job outside gpuslice holds, a ledger on SQLite, and N
queued gpuslice jobs on that profile. Measured:

* handing the queue to Slurm: the passes until every job has a Slurm job id (200 ``sbatch``
  per pass, as the service does), in seconds per 100 jobs;
* a steady pass: one ``squeue --json`` for all N jobs, their waiting reasons and Slurm's
  priority order (median of ``--passes``), split into the squeue call and the rest.

    sudo .venv/bin/python benchmarks/slurm_queue_pass.py [--jobs 100 1000 3000]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import func, select

from gpuslice_hub.db.jobs_models import JobRow
from gpuslice_hub.jobs.backends.slurm import SlurmBackend
from gpuslice_hub.jobs.manager import JobManager
from gpuslice_hub.jobs.scheduler import Scheduler
from tests.harness.slurm import PROFILES, running_cluster, slurm_hosts, start_cluster
from tests.jobs.full_cluster import insert_queued
from tests.service.conftest import build_ledger

HOLD = 'while [ ! -e "$SLURM_JOB_ID.release" ]; do sleep 1; done\n'


def queue_jobs(jobs: JobManager, n: int) -> None:
    insert_queued(jobs.db, jobs.root, [("root", "mig-1g.10gb", "preemptible")] * n, "slurm")


def in_slurm(jobs: JobManager) -> int:
    with jobs.db.reading() as s:
        return int(
            s.scalar(select(func.count(JobRow.id)).where(JobRow.waiting_reason.is_not(None))) or 0
        )


def measure(cluster, n: int, passes: int) -> tuple[float, float, float]:
    folder = Path(tempfile.mkdtemp())
    ledger = build_ledger(
        f"sqlite:///{folder}/l.sqlite", profiles=PROFILES, hosts=slurm_hosts(cluster.node.name)
    )
    backend = SlurmBackend(sys.executable, env=cluster.env)
    jobs = JobManager(ledger, ledger.db, backend, folder / "jobs")
    jobs.log.setLevel(logging.ERROR)
    jobs.run_jobs_as_service_user = True
    scheduler = Scheduler(jobs)
    queue_jobs(jobs, n)
    start = time.perf_counter()
    while in_slurm(jobs) < n:
        scheduler.tick()
    handed = time.perf_counter() - start
    scheduler.tick()  # the waiting reasons become Slurm's
    calls: list[float] = []
    real = backend.records

    def timed(ids):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        try:
            return real(ids)
        finally:
            calls.append(time.perf_counter() - t)

    backend.records = timed  # type: ignore[method-assign]
    totals = []
    for _ in range(passes):
        start = time.perf_counter()
        scheduler.tick()
        totals.append(time.perf_counter() - start)
    cluster.run("scancel", "--state=PENDING")
    ledger.db.dispose()
    return 100 * handed / n, 1000 * statistics.median(totals), 1000 * statistics.median(calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[100, 1000, 3000])
    parser.add_argument("--passes", type=int, default=5)
    args = parser.parse_args()
    with ExitStack() as stack:
        cluster = stack.enter_context(running_cluster(start_cluster, "gpuslice-bench-"))
        holder = cluster.sbatch(HOLD, "--gres=gpu:1g.10gb:1")
        cluster.wait_state(holder, "RUNNING", timeout=60)
        print(f"{'jobs':>6} {'handing to Slurm':>17} {'steady pass':>12} {'of it squeue':>13}")
        for n in args.jobs:
            handed, total, squeue = measure(cluster, n, args.passes)
            print(f"{n:>6} {handed:>11.2f} s/100 {total:>10.0f}ms {squeue:>11.0f}ms", flush=True)


if __name__ == "__main__":
    main()
