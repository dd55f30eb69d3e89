"""Latency of one ``place()`` call as the service makes it (HostState in, Placement out).

    .venv/bin/python benchmarks/place_latency.py

50 hosts x 8 GPUs, half-used at random, a stream of mixed requests; median of 500 calls.
"""

from __future__ import annotations

import random
import statistics
import time

from gpuslice_hub.placement import GPUState, HostState, Request, get_policy, place


def hosts(n: int, rng: random.Random) -> list[HostState]:
    return [
        HostState(
            f"h{i}",
            rng.randrange(8_000, 96_000),
            rng.randrange(64_000, 512_000),
            [
                GPUState(f"h{i}g{j}", "A100", 81_920, free_milli=rng.choice([0, 190, 530, 1000]))
                for j in range(8)
            ],
            rank=i,
        )
        for i in range(n)
    ]


def main() -> None:
    rng = random.Random(1)
    kinds = [
        Request("share", cpu_milli=4000, gpu_milli=250, gpu_memory_mib=20_000),
        Request("share", cpu_milli=8000, gpu_milli=500),
        Request("gpu", cpu_milli=8000, count=1),
        Request("gpu", cpu_milli=16000, count=2),
        Request("none", cpu_milli=2000),
    ]
    for name in ("default", "fgd", "best-fit"):
        policy = get_policy(name)
        hs = hosts(50, rng)
        times = []
        for i in range(500):
            t0 = time.perf_counter()
            place(kinds[i % len(kinds)], hs, policy)
            times.append(time.perf_counter() - t0)
        med = statistics.median(times) * 1e3
        p95 = sorted(times)[int(0.95 * len(times))] * 1e3
        print(f"{name:10s} median {med:.2f} ms  p95 {p95:.2f} ms  (50 hosts x 8 GPUs)")


if __name__ == "__main__":
    main()
