"""How long the service's event loop was held: the delay every request waiting on it saw.

Everything slow runs in worker threads (placement, passes, counts, subprocesses); this says
whether that holds in production. A timer is due every ``interval`` seconds; how late it
runs is how long the loop was busy with something else, observed into the histogram
``gpuslice_event_loop_lag_seconds`` (``/metrics``).

What holds every thread at once is the garbage collector: a full collection walks every
object the process keeps, with the GIL held. At 200 hosts and 10 000 queued jobs that was
~280 ms each time, most of it the imports' own objects (JupyterHub's dependencies build a
URL grammar of ~70 000 objects at import), and it ran every few seconds under load: the
youngest generation was collected every 700 new objects, so the big short-lived results
of a pass, an overview or a scrape (tens of thousands of objects, alive for a fraction of
a second) were promoted to the oldest generation and soon called for a full collection.
:func:`tune_garbage_collection` freezes what the start built (it lives as long as the
process) out of all collections, and collects the youngest generation every
``YOUNG_THRESHOLD`` objects; each collection's pause is observed into
``gpuslice_gc_pause_seconds`` (:class:`GCPauses`). Measured in docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

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


# New container objects between two collections of the youngest generation (CPython's
# default is 700); the older generations keep their defaults (every 10 of the younger).
YOUNG_THRESHOLD = 10_000


def tune_garbage_collection() -> int:
    """Collect once, then move every object alive now (modules, classes, configuration,
    the imports' tables) out of all later collections, and collect the youngest generation
    less often; how many objects were frozen. Garbage among them was collected first; what
    the service creates afterwards is collected as usual."""
    gc.collect()
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    return gc.get_freeze_count()


class GCPauses:
    """Observes how long each garbage collection held the process, by generation."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.pause = Histogram(
            "gpuslice_gc_pause_seconds",
            "How long each garbage collection held every thread of the service (the GIL is "
            "held throughout), by generation (2: a full collection)",
            labelnames=["generation"],
            buckets=LAG_BUCKETS,
            registry=registry,
        )
        # The series are made here, never in the callback: making one takes the histogram's
        # lock, which a scrape in the same thread may hold when its allocation starts a
        # collection (a lock a thread cannot take twice: it would wait forever).
        self._series = {g: self.pause.labels(str(g)) for g in range(len(gc.get_count()))}
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        # (called by the interpreter in whichever thread collects, with the GIL held: one
        # collection at a time, so one start time is enough)
        if phase == "start":
            self._started = time.perf_counter()
            return
        series = self._series.get(info.get("generation", -1))
        if series is not None:
            series.observe(time.perf_counter() - self._started)

    def start(self) -> None:
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def stop(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)
