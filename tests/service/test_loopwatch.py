"""The event loop's lag, as /metrics reports it: a held loop shows up in the histogram."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry

from gpuslice_hub.loopwatch import LoopWatch


def _count(registry: CollectorRegistry, le: str | None = None) -> float:
    if le is None:
        return registry.get_sample_value("gpuslice_event_loop_lag_seconds_count") or 0.0
    return registry.get_sample_value("gpuslice_event_loop_lag_seconds_bucket", {"le": le}) or 0.0


def test_a_held_loop_is_observed_as_lag_of_that_length():
    registry = CollectorRegistry()
    watch = LoopWatch(registry, interval=0.02)

    async def main() -> None:
        task = asyncio.ensure_future(watch.run())
        deadline = time.monotonic() + 10
        while _count(registry) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert _count(registry) >= 3
        seen, stalls_before = _count(registry), _count(registry) - _count(registry, "0.25")
        time.sleep(0.3)  # the work under test: a handler that holds the loop for 300 ms
        while _count(registry) == seen and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        task.cancel()
        # the stall lands above 250 ms (300 ms plus the timer's own delay)
        assert _count(registry) - _count(registry, "0.25") > stalls_before

    asyncio.run(main())
