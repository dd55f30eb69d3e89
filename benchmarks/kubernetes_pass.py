"""What the service's job pass costs when Kubernetes queues the jobs
(``job_backend = "kubernetes"``).

No cluster runs here: the stand-in API server of the tests (``tests/jobs/fake_kube_api.py``,
real HTTP, the API's JSON) runs in a child process on the same machine, playing a full
cluster: every Job's pod waits, unschedulable. A ledger on SQLite, N queued gpuslice jobs.
Measured:

* handing the queue to the cluster: the passes until every job has a Kubernetes Job (200
  creates per pass, as the service does), in seconds per 100 jobs;
* a steady pass: the Jobs and their pods for all N jobs, their waiting reasons and the
  priority order (median of ``--passes``), split into reading the cluster and the rest;
  read with two paged list calls a pass (``lists``), and from a watch kept current between
  passes (``watch``, the service's way: the pass reads what the watch holds).

The API server's own work is the stand-in's (a Python dict and ``json.dumps``), so the
list figures are what the client side costs plus a light server; a real API server's
serving time comes on top.

    .venv/bin/python benchmarks/kubernetes_pass.py [--jobs 100 1000 5000] [--modes lists watch]
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import func, select

from gpuslice_hub.db.jobs_models import JobRow
from gpuslice_hub.jobs.accounts import Account
from gpuslice_hub.jobs.backends.kubernetes_client import KubernetesBackend
from gpuslice_hub.jobs.manager import JobManager
from gpuslice_hub.jobs.scheduler import Scheduler
from gpuslice_hub.kubeapi import api_configuration
from tests.jobs.fake_kube_api import FakeCluster, start_fake_api
from tests.jobs.full_cluster import insert_queued
from tests.service.conftest import build_ledger

FULL = "0/200 nodes are available: 200 Insufficient nvidia.com/mig-1g.10gb."
PROFILES = [{"name": "mig-1g.10gb", "kind": "mig", "mig_profile": "1g.10gb"}]
HOSTS = [
    {
        "name": "gpu-node-1",
        "cpu_milli": 64000,
        "memory_mib": 512000,
        "gpus": [{"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "mig": ["1g.10gb"]}],
    }
]
OWNER = Account("ann", 1234, 1234, (1234,), "/home/ann", "/bin/bash")


def serve(urls: Any) -> None:
    cluster, _stop = start_fake_api(FakeCluster(full=FULL, validate=lambda manifest: None))
    urls.put(cluster.url)
    while True:
        time.sleep(3600)


def in_cluster(jobs: JobManager) -> int:
    with jobs.db.reading() as s:
        return int(
            s.scalar(select(func.count(JobRow.id)).where(JobRow.waiting_reason.is_not(None))) or 0
        )


def measure(n: int, passes: int, watch: bool) -> tuple[float, float, float]:
    context = multiprocessing.get_context("fork")
    urls = context.Queue()
    server = context.Process(target=serve, args=(urls,), daemon=True)
    server.start()
    try:
        folder = Path(tempfile.mkdtemp())
        ledger = build_ledger(f"sqlite:///{folder}/l.sqlite", profiles=PROFILES, hosts=HOSTS)
        url = urls.get(timeout=30)
        backend = KubernetesBackend(api_configuration(url), "gpuslice", "r", "c", watch=watch)
        jobs = JobManager(ledger, ledger.db, backend, folder / "jobs")
        jobs.log.setLevel(logging.ERROR)
        jobs.account = lambda user: OWNER  # type: ignore[method-assign]
        scheduler = Scheduler(jobs)
        insert_queued(jobs.db, jobs.root, [("ann", "mig-1g.10gb", "preemptible")] * n, "k8s")
        start = time.perf_counter()
        while in_cluster(jobs) < n:
            scheduler.tick()
        handed = time.perf_counter() - start
        scheduler.tick()  # the waiting reasons become the scheduler's
        if watch:
            # the watch holds every Job and pod before the passes are timed
            deadline = time.monotonic() + 600
            while not all(len(i.snapshot() or ()) >= n for i in backend._informers or ()):
                assert time.monotonic() < deadline, "the watch did not catch up"
                time.sleep(0.05)
        scheduler.tick()
        calls: list[float] = []
        real = backend.poll_many

        def timed(refs):  # type: ignore[no-untyped-def]
            t = time.perf_counter()
            try:
                return real(refs)
            finally:
                calls.append(time.perf_counter() - t)

        backend.poll_many = timed  # type: ignore[method-assign]
        totals = []
        for _ in range(passes):
            start = time.perf_counter()
            scheduler.tick()
            totals.append(time.perf_counter() - start)
        ledger.db.dispose()
        backend.close()
        return 100 * handed / n, 1000 * statistics.median(totals), 1000 * statistics.median(calls)
    finally:
        server.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[100, 1000, 5000])
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument(
        "--modes", nargs="+", default=["lists", "watch"], choices=["lists", "watch"]
    )
    args = parser.parse_args()
    print(
        f"{'jobs':>6} {'mode':>6} {'handing to k8s':>15} {'steady pass':>12} {'of it reading':>14}"
    )
    for n in args.jobs:
        for mode in args.modes:
            handed, total, read = measure(n, args.passes, mode == "watch")
            print(
                f"{n:>6} {mode:>6} {handed:>9.2f} s/100 {total:>10.1f}ms {read:>12.1f}ms",
                flush=True,
            )


if __name__ == "__main__":
    main()
