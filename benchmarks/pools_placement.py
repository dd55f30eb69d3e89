"""What split pools cost a placement: allocate + release cycles of the ledger (in process,
SQLite) on a cluster half full, with and without a reserved pool, for people and for batch.

    .venv/bin/python benchmarks/pools_placement.py [--hosts 50,200] [--cycles 300]

Each host has 8 A100-80GB; the first quarter of the hosts is reserved for people
(``JobManager.reserved_pools``). The placement policy is the service's default (FGD), whose
per-host scores are what a pooled placement could lose between decisions.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpuslice_hub.ledger import Caller, Ledger  # noqa: E402
from gpuslice_hub.pools import parse_pools  # noqa: E402
from tests.service.conftest import build_ledger  # noqa: E402

PROFILES = [
    {"name": "share-250", "kind": "share", "gpu_milli": 250, "gpu_memory_mib": 20480},
    {"name": "share-500", "kind": "share", "gpu_milli": 500, "gpu_memory_mib": 40960},
    {"name": "gpu-1", "kind": "gpu", "count": 1},
]
GPU = {"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "count": 8}


def hosts(n: int) -> list[dict]:
    return [
        {"name": f"h{i:04d}", "cpu_milli": 256000, "memory_mib": 2048000, "gpus": [GPU]}
        for i in range(n)
    ]


def fill(ledger: Ledger, n_hosts: int, rng: random.Random) -> None:
    """About half of the GPUs' capacity held, by people and by batch, mixed shapes."""
    target = n_hosts * 8 * 1000 // 2
    held = i = 0
    while held < target:
        profile = rng.choice(["share-250", "share-500", "gpu-1"])
        batch = rng.random() < 0.6
        caller = Caller(f"u{i % 300}", (), "bench")
        try:
            ledger.allocate(
                caller, profile, f"f{i}", purpose="batch" if batch else "interactive", quiet=True
            )
        except Exception:
            break
        held += {"share-250": 250, "share-500": 500, "gpu-1": 1000}[profile]
        i += 1


def cycles(ledger: Ledger, n: int, purpose: str, rng: random.Random) -> list[float]:
    out = []
    for i in range(n):
        profile = rng.choice(["share-250", "share-500", "gpu-1"])
        caller = Caller(f"c{i % 50}", (), "bench")
        t = time.perf_counter()
        a, _ = ledger.allocate(caller, profile, f"c{i}", purpose=purpose, quiet=True)
        out.append(time.perf_counter() - t)
        ledger.release(a["id"], "bench", "benchmark")
    return out


def run(n_hosts: int, n_cycles: int, pooled: bool) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        ledger = build_ledger(
            f"sqlite:///{tmp}/l.sqlite", PROFILES, hosts=hosts(n_hosts), policy="default"
        )
        if pooled:
            reserved = [f"h{i:04d}" for i in range(n_hosts // 4)]
            ledger.pools = parse_pools({"people": {"hosts": reserved}}, "", {}, 200)
        rng = random.Random(1)
        fill(ledger, n_hosts, rng)
        cycles(ledger, 20, "interactive", rng)  # warm the caches
        out = {p: cycles(ledger, n_cycles, p, rng) for p in ("interactive", "batch")}
        ledger.db.dispose()
        return out


def ms(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="50,200")
    ap.add_argument("--cycles", type=int, default=300)
    args = ap.parse_args()
    print("| hosts | pools | request | allocate p50 (ms) | p99 (ms) |")
    print("|---:|---|---|---:|---:|")
    for n in (int(x) for x in args.hosts.split(",")):
        for pooled in (False, True):
            for purpose, times in run(n, args.cycles, pooled).items():
                split = "1/4 reserved" if pooled else "none"
                print(f"| {n} | {split} | {purpose} | {ms(times, 50):.2f} | {ms(times, 99):.2f} |")


if __name__ == "__main__":
    main()
