"""The service's own work at the size of a large site, and at 1/4 and 1/16 of it.

Full size: 200 hosts x 8 A100s (2 per host in MIG mode with 7 x 1g.10gb, 6 for shares and
whole GPUs), 500 users holding slices that report their usage, and 10 000 queued jobs; the
ledger is SQLite in a temp dir, the code is the service's (ledger, scheduler, metrics, admin
overview) called in this process, not through HTTP.

    .venv/bin/python benchmarks/scale.py [--sizes 1 4 16] [--repeat 50]

Prints per size: a scheduler pass after a person's slice is given back (p50/p99), with
nothing changed and at the minute's retry (medians of 5), the spawn form's availability for one user
right after an allocation and unchanged (p50/p99), allocate and release (p50/p99), one round
of usage reports from every holder, a /metrics scrape, and the admin overview.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import generate_latest

from gpuslice_hub.admin.overview import overview
from gpuslice_hub.db.models import utcnow
from gpuslice_hub.jobs.manager import JobManager
from gpuslice_hub.jobs.scheduler import Scheduler
from gpuslice_hub.ledger import Caller
from gpuslice_hub.loopwatch import tune_garbage_collection
from gpuslice_hub.metrics import make_registry
from tests.jobs.full_cluster import IdleBackend, queue
from tests.service.conftest import build_ledger

PROFILES: list[dict] = [
    {"name": "mig-1g.10gb", "kind": "mig", "mig_profile": "1g.10gb"},
    {"name": "share-250", "kind": "share", "gpu_milli": 250, "gpu_memory_mib": 20480},
    {"name": "gpu-1", "kind": "gpu", "count": 1},
    {"name": "gpu-2", "kind": "gpu", "count": 2},
]


def hosts(n: int) -> list[dict]:
    model = "NVIDIA A100-SXM4-80GB"
    return [
        {
            "name": f"n{i:03d}",
            "cpu_milli": 128000,
            "memory_mib": 1024000,
            "gpus": [
                {"model": model, "memory_mib": 81920, "count": 6},
                {"model": model, "memory_mib": 81920, "count": 2, "mig": ["1g.10gb"] * 7},
            ],
        }
        for i in range(n)
    ]


def pcts(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - start))
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(0.99 * len(times)))]


def measure(n_hosts: int, n_users: int, n_jobs: int, repeat: int) -> dict[str, str]:
    folder = Path(tempfile.mkdtemp())
    ledger = build_ledger(
        f"sqlite:///{folder}/l.sqlite", profiles=PROFILES, hosts=hosts(n_hosts), policy="default"
    )
    # about 60 % of the pool held, by n_users people: MIG instances, shares, whole GPUs
    held = []
    plan = ["mig-1g.10gb"] * 8 + ["share-250"] * 12 + ["gpu-1"] * 2
    for i in range(n_hosts * len(plan)):
        user = f"u{i % n_users}"
        alloc, _ = ledger.allocate(Caller(user, (), user), plan[i % len(plan)], f"s{i}")
        held.append(alloc["id"])
    out: dict[str, str] = {}
    probe = Caller("probe", (), "probe")

    def after_change() -> None:
        alloc, _ = ledger.allocate(probe, "share-250", "probe")
        start = time.perf_counter()
        ledger.availability("probe", ())
        after_change.times.append(1000 * (time.perf_counter() - start))  # type: ignore[attr-defined]
        ledger.release(alloc["id"], "probe", "benchmark")

    after_change.times = []  # type: ignore[attr-defined]
    for _ in range(min(repeat, 20)):
        after_change()
    cold = sorted(after_change.times)  # type: ignore[attr-defined]
    out["form after a change p50/p99"] = f"{statistics.median(cold):.0f} / {cold[-1]:.0f}"
    warm = pcts(lambda: ledger.availability("probe", ()), repeat)
    out["form unchanged p50/p99"] = f"{warm[0]:.0f} / {warm[1]:.0f}"

    allocs: list[int] = []

    def allocate() -> None:
        alloc, _ = ledger.allocate(probe, "share-250", f"a{len(allocs)}")
        allocs.append(alloc["id"])

    a = pcts(allocate, repeat)
    out["allocate p50/p99"] = f"{a[0]:.0f} / {a[1]:.0f}"
    r = pcts(lambda: ledger.release(allocs.pop(), "probe", "benchmark"), repeat)
    out["release p50/p99"] = f"{r[0]:.0f} / {r[1]:.0f}"

    # the queue: the first pass starts what fits (the rest of the pool), the next ones
    # find the pool full and the queue waiting
    queue(ledger, folder, n_jobs, "preemptible", users=n_users)
    manager = JobManager(ledger, ledger.db, IdleBackend(), folder / "jobs")  # type: ignore[arg-type]
    manager.run_jobs_as_service_user = True
    scheduler = Scheduler(manager)
    scheduler.tick()
    scheduler.tick()  # the first pass's own writes make the next one look again

    def after_release() -> None:
        # a person's slice given back: the pass tries the queue on the freed capacity
        ledger.release(held.pop(), "benchmark", "benchmark")
        scheduler.tick()

    p = pcts(after_release, min(repeat, 20))
    out["pass after a slice is freed p50/p99"] = f"{p[0]:.0f} / {p[1]:.0f}"
    out["pass, nothing changed"] = f"{pcts(scheduler.tick, 5)[0]:.0f}"

    def minute_retry() -> None:
        # at least once a minute the queue is tried again though nothing changed
        scheduler._full_at = None
        scheduler.tick()

    out["pass, the minute's retry"] = f"{pcts(minute_retry, 5)[0]:.0f}"

    def reports() -> None:
        for alloc_id in held:
            ledger.record_usage(alloc_id, 0.3, 1000.0, 0.0, 60.0)

    out["usage reports (all holders)"] = f"{pcts(reports, 1)[0]:.0f}"
    registry, _ = make_registry(ledger)
    generate_latest(registry)
    out["/metrics scrape"] = f"{pcts(lambda: generate_latest(registry), 5)[0]:.0f}"
    out["admin overview"] = (
        f"{pcts(lambda: overview(ledger, utcnow(), 'simulated', True), 3)[0]:.0f}"
    )
    out["held"] = str(len(held))
    ledger.db.dispose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 4, 1])
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    # the service's process settings (its start makes them): garbage collections that
    # walk the imports' objects would land in whatever is being timed
    tune_garbage_collection()
    by_size(args.sizes, lambda hosts, users, jobs: measure(hosts, users, jobs, args.repeat))


def by_size(sizes: list[int], measure_one: Callable[[int, int, int], dict[str, str]]) -> None:
    """Measure 200 hosts, 500 users and 10 000 jobs divided by each of ``sizes``, and print
    one table: a column per size, a row per figure."""
    rows = {}
    for div in sizes:
        n_hosts, n_users, n_jobs = 200 // div, 500 // div, 10_000 // div
        rows[f"{n_hosts} hosts, {n_users} users, {n_jobs} jobs"] = measure_one(
            n_hosts, n_users, n_jobs
        )
        print(f"done 1/{div}", file=sys.stderr, flush=True)
    keys = list(next(iter(rows.values())))
    print("ms | " + " | ".join(rows))
    for key in keys:
        print(f"{key} | " + " | ".join(r[key] for r in rows.values()))


if __name__ == "__main__":
    main()
