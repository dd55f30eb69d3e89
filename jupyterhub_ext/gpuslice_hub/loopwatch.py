"""How long the service's event loop was held: the delay every request waiting on it saw.

Everything slow runs in worker threads (placement, passes, counts, subprocesses); this says
whether that holds in production. A timer is due every ``interval`` seconds; how late it
runs is how long the loop was busy with something else, observed into the histogram
``gpuslice_event_loop_lag_seconds`` (``/metrics``).
"""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, Histogram

# Seconds: a stall under 5 ms is no stall; the aim is none above 50 ms.
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class LoopWatch:
    def __init__(self, registry: CollectorRegistry, interval: float = 0.1) -> None:
        self.interval = interval
        self.lag = Histogram(
            "gpuslice_event_loop_lag_seconds",
            f"How late a timer due every {interval:g} s ran on the service's event loop: how "
            "long the loop was held by other work",
            buckets=LAG_BUCKETS,
            registry=registry,
        )

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.interval
            await asyncio.sleep(self.interval)
            self.lag.observe(max(0.0, loop.time() - due))
