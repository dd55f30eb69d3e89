"""What usage reporting adds to one tick of the gpuslice server extension.

Each tick, the extension folds its report into the usage interval (the whole server's
utilization across kernels and devices, its memory): ``UsageReporter.observe``. This
measures that step alone, on the report of a real ``Monitor.tick()`` over the same fake
NVML and fake /proc as ``idle_monitor_tick.py`` (N kernels, one GPU process each, on 8
GPUs), with reporting on but no report due (as on every tick but one per interval).

Run:  .venv/bin/python benchmarks/usage_accounting.py [--sizes 10,100,1000] [--repeat 200]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from idle_monitor_tick import StubKernels
from sampling_tick import SERVER, build, cpu_model

from gpuslice.activity import (
    ActivitySampler,
    Attributor,
    IdleTrackers,
    NvmlActivitySource,
    ProcReader,
)
from gpuslice.extension.memcap import MemoryCap
from gpuslice.extension.monitor import Monitor, SliceInfo
from gpuslice.extension.service import ServiceClient
from gpuslice.extension.usage_reporter import UsageReporter
from gpuslice.idle_policy import IdlePolicy
from tests.fakes.fake_pynvml import FakeNVML


def measure(root: Path, n: int, repeat: int) -> tuple[float, float]:
    """(median observe, median full tick) in seconds."""
    state, kernels = build(root, n)
    clock = [time.time()]
    sampler = ActivitySampler(
        NvmlActivitySource(nvml=FakeNVML(state)),
        Attributor(ProcReader(str(root), ttl=3600.0), server_pid=SERVER, server_uid=1000),
    )
    monitor = Monitor(
        sampler=sampler,
        trackers=IdleTrackers(),
        policy=IdlePolicy(idle_timeout=10**9, warning_lead=60),
        memcap=MemoryCap(0),
        kernel_manager=StubKernels(kernels),
        event_logger=SimpleNamespace(emit=lambda **kw: None),
        web_settings={},
        slice_info=SliceInfo(),
        # enabled (a service and an allocation), but the interval never ends here
        service=ServiceClient("http://127.0.0.1:9/", "t", 1, "ann"),
        usage_interval=10**9,
        clock=lambda: clock[0],
    )

    async def run() -> tuple[float, float]:
        await monitor.tick()  # cold: fills the /proc cache
        ticks = []
        for _ in range(repeat):
            clock[0] += 5
            t0 = time.perf_counter()
            await monitor.tick()
            ticks.append(time.perf_counter() - t0)
        assert monitor.report is not None and monitor.usage.enabled
        reporter = UsageReporter(monitor.service, 10**9, logging.getLogger("bench"))
        observes = []
        for _ in range(repeat):
            clock[0] += 5
            t0 = time.perf_counter()
            reporter.observe(clock[0], monitor.report, monitor.states)
            observes.append(time.perf_counter() - t0)
        assert reporter.window.ticks == repeat and reporter.in_flight is None
        return statistics.median(observes), statistics.median(ticks)

    try:
        return asyncio.run(run())
    finally:
        monitor.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10,100,1000")
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    print(
        f"machine: {cpu_model()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, {platform.platform()}"
    )
    print()
    print("| kernels = GPU processes | usage accounting per tick | full tick (wall) | share |")
    print("|---:|---:|---:|---:|")
    for n in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as d:
            observe, tick = measure(Path(d), n, args.repeat)
        print(
            f"| {n} | {observe * 1e6:.1f} µs | {tick * 1e3:.2f} ms | {observe / tick * 100:.1f} % |"
        )


if __name__ == "__main__":
    main()
