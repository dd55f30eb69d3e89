"""What one job-scheduler pass costs with a full cluster and a long queue.

A ledger of H hosts x 8 A100s whose every GPU is held by an interactive server, and a queue
of N jobs that cannot start (preemptible, or ``normal`` behind a blocked one): the pass the
service makes every second (and on every submission) decides again that none can start.
Times the first pass (it records each job's waiting reason), and the median of the next
ones after a change (the queue is tried again) and when nothing changed (it is not read).

    .venv/bin/python benchmarks/scheduler_pass.py [--hosts 25 200] [--jobs 1000 10000]

The passes run in a worker thread in the service, so they no longer stall the event loop;
what they cost still decides how fast a queue reacts to a freed slice.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.jobs.full_cluster import full_cluster, queue


def measure(n_hosts: int, n_jobs: int, priority: str, passes: int) -> tuple[float, float, float]:
    """ms: the first pass, a pass after a change (the queue is tried again), and a pass
    when nothing changed (the queue is not read)."""
    folder = Path(tempfile.mkdtemp())
    ledger, scheduler = full_cluster(folder, n_hosts)
    try:
        queue(ledger, folder, n_jobs, priority)
        start = time.perf_counter()
        scheduler.tick()
        first = time.perf_counter() - start
        changed, unchanged = [], []
        for _ in range(passes):
            scheduler._marker = None  # as after a change: the whole queue is tried
            start = time.perf_counter()
            scheduler.tick()
            changed.append(time.perf_counter() - start)
            start = time.perf_counter()
            scheduler.tick()
            unchanged.append(time.perf_counter() - start)
        ms = [1000 * statistics.median(t) for t in (changed, unchanged)]
        return 1000 * first, ms[0], ms[1]
    finally:
        ledger.db.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[25, 200])
    parser.add_argument("--jobs", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--passes", type=int, default=5)
    args = parser.parse_args()
    print(
        f"{'hosts':>5} {'jobs':>6} {'class':>12} {'first pass':>11} {'after a change':>15} "
        f"{'nothing changed':>16}"
    )
    for n_hosts in args.hosts:
        for n_jobs in args.jobs:
            for priority in ("preemptible", "normal"):
                first, changed, same = measure(n_hosts, n_jobs, priority, args.passes)
                print(
                    f"{n_hosts:>5} {n_jobs:>6} {priority:>12} {first:>9.0f}ms {changed:>13.0f}ms "
                    f"{same:>14.1f}ms",
                    flush=True,
                )


if __name__ == "__main__":
    main()
