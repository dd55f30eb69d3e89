"""What the spawn form's live availability costs: how many more of each profile fit.

For clusters of 8, 32, 128 and 200 hosts (8 A100s each: 2 in MIG mode with 7 1g instances, 6
for shares and whole GPUs; 5 profiles), a quarter full of shares, times per call of:

- ``trial fill``: the previous implementation without its cap of 256: filling each host on
  its own with trial placements until nothing fits, and adding up,
- ``unit count``: ``count_fits`` now, each host's free units from the fit rules, in arrays,
- ``availability cold``: ``Ledger.availability`` right after an allocation (counts redone),
- ``availability warm``: the same with nothing changed since (served from the cache).

    .venv/bin/python benchmarks/availability_probe.py [--repeat 10]

Prints the median of ``--repeat`` runs in milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuslice_hub.clusterview import build_hosts, count_fits
from gpuslice_hub.ledger import Caller
from tests.service.conftest import build_ledger
from tests.service.test_capacity import count_across_the_cluster as fill

PROFILES: list[dict] = [
    {"name": "mig-1g.10gb", "kind": "mig", "mig_profile": "1g.10gb"},
    {"name": "share-250", "kind": "share", "gpu_milli": 250, "gpu_memory_mib": 20480},
    {"name": "share-500", "kind": "share", "gpu_milli": 500, "gpu_memory_mib": 40960},
    {"name": "gpu-1", "kind": "gpu", "count": 1},
    {"name": "gpu-2", "kind": "gpu", "count": 2},
]


def hosts(n: int) -> list[dict]:
    return [
        {
            "name": f"n{i:03d}",
            "cpu_milli": 128000,
            "memory_mib": 1024000,
            "gpus": [
                {"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "count": 6},
                {
                    "model": "NVIDIA A100-SXM4-80GB",
                    "memory_mib": 81920,
                    "count": 2,
                    "mig": ["1g.10gb"] * 7,
                },
            ],
        }
        for i in range(n)
    ]


def median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def measure(n: int, repeat: int) -> tuple[float, float, float, float]:
    folder = tempfile.mkdtemp()
    ledger = build_ledger(f"sqlite:///{folder}/l.sqlite", profiles=PROFILES, hosts=hosts(n))
    try:
        for i in range(n * 6):  # a quarter of the share GPUs' capacity
            ledger.allocate(Caller(f"u{i}", (), f"u{i}"), "share-250", "")
        inv_hosts, gpus, active = ledger.snapshot()
        states = build_hosts(inv_hosts, gpus, active)
        requests = [p.request() for p in ledger.profiles.values()]
        policy = ledger.policy
        # one host at a time: what the previous count_fits did, only without the cap
        old = median_ms(
            lambda: [sum(fill(r, [h], policy) for h in states) for r in requests],
            min(repeat, 3),
        )
        new = median_ms(lambda: [count_fits(r, states) for r in requests], repeat)
        caller = Caller("probe", (), "probe")
        cold = []
        for _ in range(repeat):
            alloc, _ = ledger.allocate(caller, "share-250", "probe")
            start = time.perf_counter()
            ledger.availability("x", ())
            cold.append(time.perf_counter() - start)
            ledger.release(alloc["id"], "probe", "benchmark")
        ledger.availability("x", ())
        warm = median_ms(lambda: ledger.availability("x", ()), repeat)
        return old, new, 1000 * statistics.median(cold), warm
    finally:
        ledger.db.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    print(f"{'hosts':>5} {'trial fill':>11} {'unit count':>11} {'cold':>8} {'warm':>8}")
    for n in (8, 32, 128, 200):
        old, new, cold, warm = measure(n, args.repeat)
        print(f"{n:>5} {old:>11.1f} {new:>11.1f} {cold:>8.1f} {warm:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
