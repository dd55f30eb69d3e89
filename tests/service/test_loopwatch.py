"""The event loop's lag, as /metrics reports it: a held loop shows up in the histogram."""

from __future__ import annotations

import asyncio
import gc
import time

from prometheus_client import CollectorRegistry

from gpuslice_hub.loopwatch import (
    YOUNG_THRESHOLD,
    GCPauses,
    LoopWatch,
    tune_garbage_collection,
)


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


def test_each_garbage_collection_is_observed_by_generation():
    registry = CollectorRegistry()
    pauses = GCPauses(registry)

    def full() -> float:
        return (
            registry.get_sample_value("gpuslice_gc_pause_seconds_count", {"generation": "2"}) or 0.0
        )

    pauses.start()
    try:
        gc.collect()
        gc.collect(1)
        assert full() == 1
        assert (
            registry.get_sample_value("gpuslice_gc_pause_seconds_count", {"generation": "1"}) == 1
        )
        assert (registry.get_sample_value("gpuslice_gc_pause_seconds_sum", {"generation": "2"})) > 0
    finally:
        pauses.stop()
    gc.collect()
    assert full() == 1  # stopped: no longer observed


def test_a_collection_during_a_scrape_of_the_pauses_does_not_hang():
    """A scrape holds the histogram's lock while it copies its series; a collection that
    its allocation starts runs the callback in the same thread, which must not need that
    lock (a thread cannot take it twice)."""
    import threading

    registry = CollectorRegistry()
    pauses = GCPauses(registry)
    pauses.start()
    done = threading.Event()

    def scrape_then_collect() -> None:
        with pauses.pause._lock:  # where the scrape is when the collection starts
            gc.collect()
        done.set()

    try:
        worker = threading.Thread(target=scrape_then_collect, daemon=True)
        worker.start()
        assert done.wait(10), "the collection's callback waited for the scrape's lock"
    finally:
        pauses.stop()


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_frozen_startup_objects_leave_later_garbage_collectable():
    import weakref

    before, thresholds = _Cycle(), gc.get_threshold()
    try:
        frozen = tune_garbage_collection()
        assert gc.get_threshold() == (YOUNG_THRESHOLD, *thresholds[1:])
        assert frozen == gc.get_freeze_count() > 0
        tracked = gc.get_objects()
        # what the start built is out of the collections' walk...
        assert len(tracked) < frozen and not any(o is before for o in tracked)
        del tracked
        after = _Cycle()
        gone = weakref.ref(after)
        del after
        gc.collect()
        # ...and a cycle made afterwards is still collected
        assert gone() is None
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        del before


def test_a_big_answer_is_written_in_pieces_as_the_same_text(monkeypatch):
    """The C JSON encoder holds the GIL for its whole call: an answer as big as the admin
    overview at 200 hosts is written an item at a time, byte for byte what one call writes."""
    import json

    from gpuslice_hub.api import base

    hosts = [
        {
            "name": f"n{i:03d}",
            "util": [0.5, float("nan") if i == 7 else 1.0],
            "ids": list(range(40)),
        }
        for i in range(200)
    ]
    cases = [
        {"generated_at": "now", "hosts": hosts, "totals": {"gpus": 1600}, "few": [1, 2]},
        hosts,
        {1: hosts[:50], "x": None},  # a key that is not a string: written in one call
        "text",
    ]
    real = json.dumps
    sizes: list[int] = []

    def counting(value, **kw):
        out = real(value, **kw)
        sizes.append(len(out))
        return out

    for data in cases:
        sizes.clear()
        monkeypatch.setattr(base.json, "dumps", counting)
        text = base.dumps(data)
        monkeypatch.setattr(base.json, "dumps", real)
        assert text == real(base._finite(data), allow_nan=False)
        if isinstance(data, list) or "hosts" in data:
            # no single call wrote more than a host's worth (the whole is 200 of them)
            assert max(sizes) < len(text) / 100
