"""Cost of one GPU-activity sampling tick vs the number of kernels and GPU processes.

Uses the fake NVML driver (tests/fakes/fake_pynvml.py) and a fake /proc in a temporary
directory: N kernels under one server, each with one child worker that is the GPU
process (so attribution walks two levels), spread over 8 GPUs, all with utilization
samples. Reports, per N:

* cold  — first tick, nothing cached (every /proc status read);
* warm  — steady state: statuses cached (re-read every 30 to 60 s per PID);
* nocache — every status re-read each tick (ttl=0): the worst case;
* CPU share of one core at the default 5 s interval (warm tick, and amortised with the
  cache's re-reads).

Run:  .venv/bin/python benchmarks/sampling_tick.py [--sizes 10,100,1000] [--repeat 50]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from gpuslice.activity import (
    DEFAULT_SAMPLE_INTERVAL,
    ActivitySampler,
    Attributor,
    NvmlActivitySource,
    ProcReader,
)
from tests.fakes.fake_pynvml import FakeNVML

SERVER = 100
GPUS = 8
TTL = 30.0


def write_status(root: Path, pid: int, ppid: int, uid: int = 1000) -> None:
    d = root / str(pid)
    d.mkdir()
    # Real status files are ~1.4 kB with NSpid near the middle; pad to match.
    pad = "".join(f"Pad{i}:\t0\n" for i in range(40))
    (d / "status").write_text(
        f"Name:\tpython\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{pid}\nNgid:\t0\n"
        f"Pid:\t{pid}\nPPid:\t{ppid}\nTracerPid:\t0\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
        f"Gid:\t{uid}\t{uid}\t{uid}\t{uid}\nNStgid:\t{pid}\nNSpid:\t{pid}\n{pad}"
    )


def build(root: Path, n: int) -> tuple[dict, dict[str, int]]:
    write_status(root, 1, 0, uid=0)
    write_status(root, SERVER, 1)
    kernels = {}
    devices: list[dict] = [
        {"uuid": f"GPU-{g}", "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "processes": []}
        for g in range(GPUS)
    ]
    for i in range(n):
        kpid, wpid = 1000 + 2 * i, 1001 + 2 * i
        write_status(root, kpid, SERVER)
        write_status(root, wpid, kpid)
        kernels[f"k{i}"] = kpid
        devices[i % GPUS]["processes"].append(
            {"pid": wpid, "used_memory_mib": 512, "sm_util": i % 3 * 20}
        )
    return {"devices": devices}, kernels


def measure(root: Path, state: dict, kernels: dict[str, int], ttl: float, repeat: int):
    clock = [0.0]
    reader = ProcReader(str(root), ttl=ttl, clock=lambda: clock[0])
    sampler = ActivitySampler(
        NvmlActivitySource(nvml=FakeNVML(state)),
        Attributor(reader, server_pid=SERVER, server_uid=1000),
    )
    t0 = time.perf_counter()
    sampler.tick(kernels)
    cold = time.perf_counter() - t0
    times = []
    for _ in range(repeat):
        clock[0] += 0.001  # well inside the TTL unless ttl == 0
        t0 = time.perf_counter()
        sampler.tick(kernels)
        times.append(time.perf_counter() - t0)
    sampler.close()
    return cold, statistics.median(times)


def procfs_read_cost(samples: int = 2000) -> float:
    """Mean cost of reading one real /proc/<pid>/status on this machine, in seconds."""
    pids = [p for p in os.listdir("/proc") if p.isdigit()][:200]
    n = 0
    t0 = time.perf_counter()
    while n < samples:
        for p in pids:
            try:
                with open(f"/proc/{p}/status", "rb") as f:
                    f.read()
            except OSError:
                pass
            n += 1
    return (time.perf_counter() - t0) / n


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10,100,1000")
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    interval = DEFAULT_SAMPLE_INTERVAL
    # A PID's cached status is re-read after ttl*(1 + (pid % 16)/16): ~1.47*ttl on average.
    reread_every = 1.47 * TTL / interval

    print(
        f"machine: {cpu_model()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, {platform.platform()}"
    )
    print(f"real /proc/<pid>/status read here: {procfs_read_cost() * 1e6:.1f} µs")
    print()
    print(
        "| kernels = GPU processes | cold tick | warm tick | nocache tick "
        "| CPU of one core at 5 s (warm / amortised) |"
    )
    print("|---:|---:|---:|---:|---:|")
    for n in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as d:
            root = Path(d)
            state, kernels = build(root, n)
            cold, warm = measure(root, state, kernels, TTL, args.repeat)
            _, nocache = measure(root, state, kernels, 0.0, max(5, args.repeat // 5))
        amortised = warm + (nocache - warm) / reread_every
        print(
            f"| {n} | {cold * 1e3:.2f} ms | {warm * 1e3:.2f} ms | {nocache * 1e3:.2f} ms "
            f"| {warm / interval * 100:.3f} % / {amortised / interval * 100:.3f} % |"
        )


if __name__ == "__main__":
    main()
