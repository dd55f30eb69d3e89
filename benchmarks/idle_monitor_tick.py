"""Cost of one full tick of the gpuslice server extension vs the number of kernels.

Where ``sampling_tick.py`` measures the sampler alone, this runs the extension's whole
``Monitor.tick()``: the kernel-manager lookups, the hop to the sampler thread, the
sampler (fake NVML, fake /proc, statuses cached: the steady state), the idle trackers,
the reclaim rules and the memory-cap check. The kernel manager is a stand-in with the
attributes the monitor reads; no decision fires (every kernel is idle but far from its
deadline), which is what almost every tick is.

Run:  .venv/bin/python benchmarks/idle_monitor_tick.py [--sizes 10,100,1000] [--repeat 50]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

from sampling_tick import SERVER, build, cpu_model

from gpuslice.activity import (
    DEFAULT_SAMPLE_INTERVAL,
    ActivitySampler,
    Attributor,
    IdleTrackers,
    NvmlActivitySource,
    ProcReader,
)
from gpuslice.extension.memcap import MemoryCap
from gpuslice.extension.monitor import Monitor, SliceInfo
from gpuslice.idle_policy import IdlePolicy
from tests.fakes.fake_pynvml import FakeNVML


class StubKernels:
    """What the monitor reads from jupyter_server's MappingKernelManager."""

    def __init__(self, kernels: dict[str, int]) -> None:
        started = datetime.now(UTC)
        self._k = {
            kid: SimpleNamespace(
                provisioner=SimpleNamespace(pid=pid),
                execution_state="idle",
                last_activity=started,
                kernel_name="python3",
            )
            for kid, pid in kernels.items()
        }
        self.last_kernel_activity = started

    def list_kernel_ids(self) -> list[str]:
        return list(self._k)

    def get_kernel(self, kid: str) -> SimpleNamespace:
        return self._k[kid]

    def __contains__(self, kid: str) -> bool:
        return kid in self._k


def measure(root: Path, n: int, repeat: int) -> tuple[float, float, float]:
    state, kernels = build(root, n)
    clock = [time.time()]
    reader = ProcReader(str(root), ttl=3600.0)
    sampler = ActivitySampler(
        NvmlActivitySource(nvml=FakeNVML(state)),
        Attributor(reader, server_pid=SERVER, server_uid=1000),
    )
    monitor = Monitor(
        sampler=sampler,
        trackers=IdleTrackers(),
        policy=IdlePolicy(idle_timeout=10**9, warning_lead=60),
        memcap=MemoryCap(10**6),
        kernel_manager=StubKernels(kernels),
        event_logger=SimpleNamespace(emit=lambda **kw: None),
        web_settings={},
        slice_info=SliceInfo(),
        clock=lambda: clock[0],
    )

    async def run() -> tuple[float, float, float]:
        await monitor.tick()  # cold: fills the /proc cache
        times, cpu_times, policy_times = [], [], []
        for _ in range(repeat):
            clock[0] += DEFAULT_SAMPLE_INTERVAL
            t0, c0 = time.perf_counter(), time.process_time()
            await monitor.tick()
            times.append(time.perf_counter() - t0)
            cpu_times.append(time.process_time() - c0)
            # the policy layer alone, on the report just taken
            assert monitor.report is not None
            t0 = time.perf_counter()
            states = monitor.trackers.update(monitor.report, now=clock[0] + 0.1)
            monitor.reclaimer.observe(clock[0] + 0.1, states, {})
            monitor.memcap.observe(clock[0] + 0.1, {k: 0 for k in monitor.report.kernels})
            policy_times.append(time.perf_counter() - t0)
        return (
            statistics.median(times),
            statistics.median(cpu_times),
            statistics.median(policy_times),
        )

    try:
        return asyncio.run(run())
    finally:
        monitor.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10,100,1000")
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    interval = DEFAULT_SAMPLE_INTERVAL
    print(
        f"machine: {cpu_model()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, {platform.platform()}"
    )
    print()
    print(
        "| kernels = GPU processes | full tick (wall) | full tick (CPU) | of which policy "
        "| CPU of one core at 5 s |"
    )
    print("|---:|---:|---:|---:|---:|")
    for n in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as d:
            wall, cpu, policy = measure(Path(d), n, args.repeat)
        print(
            f"| {n} | {wall * 1e3:.2f} ms | {cpu * 1e3:.2f} ms | {policy * 1e3:.2f} ms "
            f"| {cpu / interval * 100:.3f} % |"
        )


if __name__ == "__main__":
    main()
