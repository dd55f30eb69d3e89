"""Short ledger calls on the event loop's thread (db/short_writes.py), and SQLite's
write-ahead log copied back off the write path (``Database.checkpoint``)."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest
from sqlalchemy import text

from gpuslice_hub.db.engine import CHECKPOINT_EVERY, open_database
from gpuslice_hub.db.short_writes import ShortWrites
from gpuslice_hub.errors import Refused
from gpuslice_hub.ledger import Caller

from .conftest import build_ledger

ALICE = Caller("alice", (), "hub")


def where(calls: list[str]):  # type: ignore[no-untyped-def]
    """A ledger-like call that notes which thread ran it."""

    def fn(seconds: float = 0.0) -> str:
        calls.append("loop" if threading.current_thread() is threading.main_thread() else "worker")
        if seconds:
            time.sleep(seconds)  # a slow call, as placement at hundreds of hosts would be
        return "done"

    return fn


def test_a_quick_call_runs_on_the_loop_after_its_first_run_in_a_thread(tmp_path):
    ledger = build_ledger(f"sqlite:///{tmp_path}/l.sqlite")
    # (a budget no run comes near on a slow machine: this is about where runs go, and that
    # a real allocation and release made on the loop are made as in a thread)
    writes = ShortWrites(ledger.db, budget=1.0)
    seen: list[str] = []

    def allocate(server: str):  # type: ignore[no-untyped-def]
        seen.append("loop" if threading.current_thread() is threading.main_thread() else "worker")
        return ledger.try_allocate(ALICE, "share-250", server)

    async def main() -> list[int]:
        ids = []
        for i in range(4):
            alloc, created = await writes.run("allocate", allocate, f"s{i}")
            assert created
            ids.append(alloc["id"])
        for alloc_id in ids:
            _, released = await writes.run("release", ledger.release, alloc_id, "hub", "done")
            assert released
        return ids

    ids = asyncio.run(main())
    assert seen == ["worker", "loop", "loop", "loop"]
    assert (writes.in_thread, writes.on_loop) == (2, 6)  # the first release in a thread too
    assert len(set(ids)) == 4
    assert ledger.allocations(active_only=True) == []


def test_a_call_over_the_budget_sends_the_next_one_to_a_thread(tmp_path):
    db = open_database(f"sqlite:///{tmp_path}/l.sqlite")
    writes = ShortWrites(db, budget=0.05)
    calls: list[str] = []
    fn = where(calls)

    async def main() -> None:
        await writes.run("x", fn)  # first: in a thread, measured quick
        await writes.run("x", fn, 0.1)  # on the loop, over the budget
        await writes.run("x", fn)  # so in a thread, quick again
        await writes.run("x", fn)  # back on the loop
        await writes.run("y", fn)  # another call has its own measure: first in a thread

    asyncio.run(main())
    assert calls == ["worker", "loop", "worker", "loop", "worker"]


def test_a_busy_writer_sends_the_call_to_a_thread_and_the_loop_keeps_turning(tmp_path):
    db = open_database(f"sqlite:///{tmp_path}/l.sqlite")
    writes = ShortWrites(db)
    calls: list[str] = []
    fn = where(calls)
    held, loop_turned, done = threading.Event(), threading.Event(), threading.Event()

    def other_writer() -> None:
        with db.writer:
            held.set()
            # released only once the loop has run something while the writer was held: a
            # call that waited for the writer on the loop would never let it
            loop_turned.wait(30)
        done.set()

    async def main() -> None:
        await writes.run("x", fn)  # measured quick: the next run would be on the loop
        threading.Thread(target=other_writer, daemon=True).start()
        assert await asyncio.to_thread(held.wait, 30)
        asyncio.get_running_loop().call_soon(loop_turned.set)
        assert await writes.run("x", fn) == "done"

    asyncio.run(main())
    assert loop_turned.is_set() and done.wait(30)
    assert calls == ["worker", "worker"]


def test_postgresql_calls_always_run_in_a_thread():
    # (no connection is made: the engine connects on first use, and the call uses none)
    db = open_database("postgresql://nobody@127.0.0.1:9/none")
    writes = ShortWrites(db)
    calls: list[str] = []
    fn = where(calls)

    async def main() -> None:
        for _ in range(3):
            await writes.run("x", fn)

    asyncio.run(main())
    assert calls == ["worker"] * 3


def test_a_refused_attempt_records_nothing_until_after_refusal(tmp_path):
    ledger = build_ledger(
        f"sqlite:///{tmp_path}/l.sqlite",
        profiles=[{"name": "gpu-1", "kind": "gpu", "count": 1}],
        hosts=[
            {
                "name": "h",
                "cpu_milli": 8000,
                "memory_mib": 64000,
                "gpus": [{"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "count": 1}],
            }
        ],
    )
    ledger.try_allocate(ALICE, "gpu-1", "a")

    def refusals() -> int:
        return sum(1 for e in ledger.events(limit=100) if e["kind"] == "refused")

    with pytest.raises(Refused) as refused:
        ledger.try_allocate(ALICE, "gpu-1", "b")
    assert refused.value.code == "no_capacity"
    assert refusals() == 0
    with pytest.raises(Refused) as told:
        ledger.after_refusal(refused.value, ALICE, "gpu-1", "b")
    assert told.value is refused.value
    assert refusals() == 1


def test_the_write_ahead_log_starts_over_though_writes_never_stop(tmp_path):
    db = open_database(f"sqlite:///{tmp_path}/l.sqlite")
    with db.writing() as s:
        s.execute(text("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)"))
    stop = threading.Event()

    def write_on() -> None:
        while not stop.is_set():
            with db.writing() as s:
                s.execute(text("INSERT INTO t (v) VALUES (:v)"), {"v": "x" * 3000})

    others = [threading.Thread(target=write_on) for _ in range(2)]
    for t in others:
        t.start()
    try:
        deadline = time.monotonic() + 60
        while db._commits < 40 * CHECKPOINT_EVERY and time.monotonic() < deadline:
            with db.writing() as s:
                s.execute(text("INSERT INTO t (v) VALUES (:v)"), {"v": "y" * 3000})
    finally:
        stop.set()
        for t in others:
            t.join(30)
    with db.reading() as s:
        rows = s.execute(text("SELECT count(*) FROM t")).scalar_one()
    assert rows >= 40 * CHECKPOINT_EVERY
    # Each row fills a page of its own: a log never started over would hold one frame per
    # row (8 MB here); started over after each checkpoint, a few checkpoints' worth.
    wal = os.path.getsize(f"{tmp_path}/l.sqlite-wal")
    assert wal < 10 * CHECKPOINT_EVERY * 4096 * 2, wal
    db.dispose()
