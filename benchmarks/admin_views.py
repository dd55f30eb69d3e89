"""How long the admin panel's read models take, in process, over a SQLite ledger (WAL file).

For clusters of 8, 32 and 128 hosts (8 GPUs each: 2 in MIG mode with 7 1g instances, 6 for
shares and whole GPUs; 6 profiles), filled with allocations until placement refuses, each
with a fresh usage report:

- ``overview``: ``GET api/admin/overview``'s model (inventory, holders, fragmentation),
- ``sample``: one usage sample (the sampler's work every ``usage_sample_interval``),

and, on the 32-host ledger, with 90 days of samples every 300 s (25,920 rows) and 20,000
allocations of history (30,000 days of GPU time) plus 2,000 culls:

- ``series 90d``: the 90-day series averaged into 500 points,
- ``groups``: per-group GPU-hours over 7 and 30 days, and the reclaimed totals.

    .venv/bin/python benchmarks/admin_views.py [--repeat 20]

Prints the median and the worst of ``--repeat`` warm runs, in milliseconds.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sqlalchemy import insert  # noqa: E402

from gpuslice_hub.admin.accounting import group_usage, reclaimed  # noqa: E402
from gpuslice_hub.admin.overview import overview  # noqa: E402
from gpuslice_hub.admin.usage import FIELDS, series, take_sample  # noqa: E402
from gpuslice_hub.db.admin_models import UsageReportRow, UsageSampleRow  # noqa: E402
from gpuslice_hub.db.models import AllocationRow, EventRow, utcnow  # noqa: E402
from gpuslice_hub.errors import Refused  # noqa: E402
from gpuslice_hub.ledger import Caller, Ledger  # noqa: E402
from tests.service.conftest import build_ledger  # noqa: E402

PROFILES = [
    {"name": "mig-1g.10gb", "kind": "mig", "mig_profile": "1g.10gb", "cpu_milli": 2000},
    {"name": "share-100", "kind": "share", "gpu_milli": 100, "cpu_milli": 1000},
    {"name": "share-250", "kind": "share", "gpu_milli": 250, "cpu_milli": 2000},
    {"name": "share-500", "kind": "share", "gpu_milli": 500, "cpu_milli": 4000},
    {"name": "gpu-1", "kind": "gpu", "count": 1, "cpu_milli": 8000},
    {"name": "gpu-2", "kind": "gpu", "count": 2, "cpu_milli": 16000},
]


def hosts(n: int) -> list[dict[str, Any]]:
    return [
        {
            "name": f"node-{i:03d}",
            "cpu_milli": 256000,
            "memory_mib": 2048000,
            "gpus": [
                {
                    "model": "NVIDIA A100-SXM4-80GB",
                    "memory_mib": 81920,
                    "count": 2,
                    "mig": ["1g.10gb"] * 7,
                },
                {"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "count": 6},
            ],
        }
        for i in range(n)
    ]


def fill(ledger: Ledger, rng: random.Random) -> int:
    """Allocate random profiles until ten refusals in a row; report usage for each."""
    names = [p["name"] for p in PROFILES]
    made, misses = [], 0
    while misses < 10:
        user = f"u{rng.randrange(500)}"
        try:
            alloc, _ = ledger.allocate(
                Caller(user, (f"g{rng.randrange(12)}",), user), rng.choice(names), f"s{len(made)}"
            )
        except Refused:
            misses += 1
            continue
        misses = 0
        made.append(alloc["id"])
    now = utcnow()
    with ledger.db.writing() as s:
        s.execute(
            insert(UsageReportRow),
            [
                {
                    "allocation_id": i,
                    "reported_at": now,
                    "utilization": rng.uniform(0, 100),
                    "memory_mib": 1000.0,
                    "idle_seconds": 0.0,
                    "interval_seconds": 60.0,
                }
                for i in made
            ],
        )
    return len(made)


def history(ledger: Ledger, rng: random.Random) -> None:
    now = utcnow()
    samples = [
        {"ts": now - timedelta(seconds=300 * i), **{k: rng.randrange(3000) for k in FIELDS}}
        for i in range(90 * 24 * 12)
    ]
    allocs = []
    for i in range(20000):
        start = now - timedelta(days=rng.uniform(0, 60))
        allocs.append(
            {
                "user": f"u{i % 500}",
                "server_name": f"h{i}",
                "profile": "share-250",
                "kind": "share",
                "purpose": rng.choice(["interactive", "batch"]),
                "host": "node-000",
                "groups": [f"g{rng.randrange(12)}"],
                "gpu_milli": 250,
                "active": False,
                "created_at": start,
                "released_at": start + timedelta(hours=rng.uniform(0.1, 72)),
            }
        )
    with ledger.db.writing() as s:
        s.execute(insert(UsageSampleRow), samples)
        ids = list(s.execute(insert(AllocationRow).returning(AllocationRow.id), allocs).scalars())
        s.execute(
            insert(EventRow),
            [
                {
                    "ts": now - timedelta(days=rng.uniform(0, 60)),
                    "kind": "idle-culled",
                    "allocation_id": rng.choice(ids),
                    "detail": {"reclaimed_gpu_hours": rng.uniform(0, 2)},
                }
                for _ in range(2000)
            ],
        )


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, float]:
    fn()  # warm: caches, statement compilation
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        runs.append(1000 * (time.perf_counter() - t0))
    return statistics.median(runs), max(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    rng = random.Random(7)
    print(f"{'case':<28} {'median ms':>10} {'max ms':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in (8, 32, 128):
            ledger = build_ledger(f"sqlite:///{tmp}/ledger{n}.sqlite", PROFILES, hosts=hosts(n))
            count = fill(ledger, rng)
            label = f"{n} hosts, {count} allocs"
            med, worst = timed(lambda: overview(ledger, utcnow()), args.repeat)  # noqa: B023
            print(f"{'overview ' + label:<28} {med:>10.1f} {worst:>8.1f}")
            med, worst = timed(lambda: take_sample(ledger, utcnow()), args.repeat)  # noqa: B023
            print(f"{'sample ' + label:<28} {med:>10.1f} {worst:>8.1f}")
            if n == 32:
                history(ledger, rng)
                now = utcnow()
                since = now - timedelta(days=90)
                med, worst = timed(lambda: series(ledger, since, now, 500), args.repeat)  # noqa: B023
                print(f"{'series 90d -> 500 points':<28} {med:>10.1f} {worst:>8.1f}")

                def groups() -> None:
                    group_usage(ledger, now)  # noqa: B023
                    reclaimed(ledger, now)  # noqa: B023

                med, worst = timed(groups, args.repeat)
                print(f"{'groups + reclaimed':<28} {med:>10.1f} {worst:>8.1f}")
            ledger.db.dispose()


if __name__ == "__main__":
    main()
