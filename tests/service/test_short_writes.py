"""Short ledger calls on the event loop's thread (db/short_writes.py), and SQLite's
write-ahead log copied back off the write path (``Database.checkpoint``)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sqlite3
import threading
import time

import pytest
from sqlalchemy import text

from gpuslice_hub.db import engine
from gpuslice_hub.db.engine import CHECKPOINT_EVERY, open_database
from gpuslice_hub.db.loopguard import WouldWait, hold, in_short_write, set_short_write
from gpuslice_hub.db.short_writes import AWAY_AFTER_SLOW, ShortWrites
from gpuslice_hub.errors import Refused
from gpuslice_hub.ledger import Caller
from gpuslice_hub.snapshot import ActiveCache

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
        for _ in range(AWAY_AFTER_SLOW + 1):
            await writes.run("x", fn)  # so the next ones in threads, then on the loop
        await writes.run("y", fn)  # another call has its own measure: first in a thread

    asyncio.run(main())
    assert calls == ["worker", "loop"] + ["worker"] * AWAY_AFTER_SLOW + ["loop", "worker"]


def test_a_call_slow_in_a_thread_stays_there_until_one_is_quick(tmp_path):
    db = open_database(f"sqlite:///{tmp_path}/l.sqlite")
    writes = ShortWrites(db, budget=0.05)
    calls: list[str] = []

    def spin(seconds: float) -> None:  # CPU time, which is what a run in a thread counts
        calls.append("loop" if threading.current_thread() is threading.main_thread() else "worker")
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    async def main() -> None:
        await writes.run("x", spin, 0.1)
        await writes.run("x", spin, 0.0)
        await writes.run("x", spin, 0.0)

    asyncio.run(main())
    assert calls == ["worker", "worker", "loop"]


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
        deadline = time.monotonic() + 240
        while db._commits < 40 * CHECKPOINT_EVERY and time.monotonic() < deadline:
            with db.writing() as s:
                s.execute(text("INSERT INTO t (v) VALUES (:v)"), {"v": "y" * 3000})
    finally:
        stop.set()
        for t in others:
            t.join(30)
    with db.reading() as s:
        rows = s.execute(text("SELECT count(*) FROM t")).scalar_one()
    assert rows == db._commits - 1 >= 40 * CHECKPOINT_EVERY - 1  # (and the CREATE TABLE)
    # Each row fills a page of its own: a log never started over would hold one frame per
    # row (8 MB here); started over after each checkpoint, a few checkpoints' worth.
    wal = os.path.getsize(f"{tmp_path}/l.sqlite-wal")
    assert wal < 10 * CHECKPOINT_EVERY * 4096 * 2, wal
    db.dispose()


def test_a_checkpoint_whose_thread_never_gets_the_writer_is_made_by_a_writer(tmp_path):
    db = open_database(f"sqlite:///{tmp_path}/l.sqlite")
    db._checkpoint_soon = lambda: None  # type: ignore[method-assign]  # its thread starved
    with db.writing() as s:
        s.execute(text("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)"))
    for _ in range(20 * CHECKPOINT_EVERY):
        with db.writing() as s:
            s.execute(text("INSERT INTO t (v) VALUES (:v)"), {"v": "x" * 3000})
    # one frame per row at least: never started over, the log held 12 MB here
    wal = os.path.getsize(f"{tmp_path}/l.sqlite-wal")
    assert wal < 3 * CHECKPOINT_EVERY * 4096 * 2, wal
    db.dispose()


def _warm(ledger, writes: ShortWrites, seen: list[str]):  # type: ignore[no-untyped-def]
    """An ``allocate`` that notes where each attempt ran, made once (in a thread) so that
    the next is made on the loop."""

    def allocate(server: str):  # type: ignore[no-untyped-def]
        seen.append("loop" if threading.current_thread() is threading.main_thread() else "worker")
        return ledger.try_allocate(ALICE, "share-250", server)

    return allocate


def test_a_call_gives_way_to_a_thread_when_another_thread_holds_a_cache(tmp_path):
    # (a policy that learns the request mix: the request given way is learned once)
    ledger = build_ledger(f"sqlite:///{tmp_path}/l.sqlite", policy="fgd")
    writes = ShortWrites(ledger.db, budget=1.0)
    seen: list[str] = []
    allocate = _warm(ledger, writes, seen)
    held, loop_turned = threading.Event(), threading.Event()

    def counting_placement() -> None:  # as the spawn form's counts hold the arrays
        with ledger.cluster_cache._lock:
            held.set()
            loop_turned.wait(30)

    async def main() -> dict:
        await writes.run("allocate", allocate, "first")
        assert ledger.policy.online.seen == 1
        threading.Thread(target=counting_placement, daemon=True).start()
        assert await asyncio.to_thread(held.wait, 30)
        asyncio.get_running_loop().call_soon(loop_turned.set)
        alloc, created = await writes.run("allocate", allocate, "second")
        assert created
        return alloc

    alloc = asyncio.run(main())
    # tried on the loop, given way, made in a thread once the arrays were free
    assert seen == ["worker", "loop", "worker"]
    assert writes.gave_way == 1
    assert ledger.policy.online.seen == 2
    held_now = ledger.allocations(active_only=True)
    assert sorted(a["server_name"] for a in held_now) == ["first", "second"]
    assert alloc["id"] in {a["id"] for a in held_now}


def test_a_new_inventory_is_read_in_a_thread_not_on_the_loop(tmp_path):
    ledger = build_ledger(f"sqlite:///{tmp_path}/l.sqlite")
    writes = ShortWrites(ledger.db, budget=1.0)
    seen: list[str] = []
    allocate = _warm(ledger, writes, seen)
    gpu = "GPU-sim-node-a-2"  # (SIM_HOSTS: a whole GPU of node-a)

    async def main() -> None:
        await writes.run("allocate", allocate, "a")
        await writes.run("allocate", allocate, "b")  # on the loop: nothing to rebuild
        ledger.set_drained(gpu, True, "admin", "maintenance")  # a new generation
        await writes.run("allocate", allocate, "c")  # gives way: the inventory is read
        await writes.run("allocate", allocate, "d")  # on the loop again

    asyncio.run(main())
    assert seen == ["worker", "loop", "loop", "worker", "loop"]
    assert writes.gave_way == 1
    assert len(ledger.allocations(active_only=True)) == 4


def test_a_busy_cache_after_a_commit_on_the_loop_is_left_to_read_the_change_back(tmp_path):
    ledger = build_ledger(f"sqlite:///{tmp_path}/l.sqlite")
    first, _ = ledger.allocate(ALICE, "share-250", "a")
    cache = ledger.active_cache
    held, done = threading.Event(), threading.Event()

    def reader() -> None:
        with cache._lock:
            held.set()
            done.wait(30)

    threading.Thread(target=reader, daemon=True).start()
    assert held.wait(30)
    set_short_write(True)
    try:
        with pytest.raises(WouldWait), hold(cache._lock):
            pass
        # the release commits; following it in the cache gives way (nothing raised)
        _, released = ledger.release(first["id"], "hub", "done")
        assert cache._lock.locked()  # made while the reader still held it: never waited
    finally:
        set_short_write(False)
        done.set()
    assert released
    assert ledger.allocations(active_only=True) == []
    with ledger.db.reading() as s:
        assert first["id"] not in {v.id for v in cache.get(s)}


def test_many_changes_made_in_threads_are_followed_in_a_thread(tmp_path, monkeypatch):
    # The burst's commits would set the write-ahead log's checkpoint going in its thread,
    # holding the writer: a call that finds it held goes to a thread without trying the loop
    # (right, but not what this test is about, and timed by the machine's load).
    monkeypatch.setattr(engine, "CHECKPOINT_EVERY", 10**9)
    ledger = build_ledger(f"sqlite:///{tmp_path}/l.sqlite")
    writes = ShortWrites(ledger.db, budget=1.0)
    seen: list[str] = []
    allocate = _warm(ledger, writes, seen)
    many = ActiveCache.LOOP_FOLLOWS + 1
    # room for them all: shares of a hundredth of a GPU
    tiny = dataclasses.replace(ledger.profiles["share-250"], gpu_milli=10, gpu_memory_mib=10)
    ledger.profiles["share-250"] = tiny

    async def main() -> None:
        await writes.run("allocate", allocate, "a")
        await writes.run("allocate", allocate, "b")  # on the loop
        burst = [ledger.allocate(ALICE, "share-250", f"x{i}")[0] for i in range(many)]
        for alloc in burst:  # released elsewhere (a reconcile): the arrays did not follow
            ledger.release(alloc["id"], "hub", "gone")
        await writes.run("allocate", allocate, "c")  # too much to follow on the loop
        await writes.run("allocate", allocate, "d")

    asyncio.run(main())
    # "c": tried on the loop, given way before anything was learned, made in a thread
    assert seen == ["worker", "loop", "loop", "worker", "loop"]
    assert writes.gave_way == 1


def test_a_refusal_on_the_loop_leaves_the_loop_as_it_was(tmp_path):
    ledger = build_ledger(f"sqlite:///{tmp_path}/l.sqlite")
    writes = ShortWrites(ledger.db, budget=1.0)

    async def main() -> None:
        await writes.run("allocate", ledger.try_allocate, ALICE, "gpu-1", "a")
        await writes.run("allocate", ledger.try_allocate, ALICE, "gpu-1", "b")
        with pytest.raises(Refused):  # node-a has two whole GPUs
            await writes.run("allocate", ledger.try_allocate, ALICE, "gpu-1", "c")

    asyncio.run(main())
    assert writes.on_loop == 2 and writes.in_thread == 1
    assert not in_short_write()  # the flag was put back though the call raised
    assert ledger.db.writer.acquire(blocking=False)  # and the writer let go
    ledger.db.writer.release()


def test_another_process_writing_sends_the_call_to_a_thread_and_the_loop_keeps_turning(
    tmp_path,
):
    path = tmp_path / "l.sqlite"
    ledger = build_ledger(f"sqlite:///{path}")
    writes = ShortWrites(ledger.db, budget=1.0)
    # A write transaction of another process's (an admin's sqlite3 shell, say): SQLite's
    # lock, which this process's writer lock knows nothing of.
    foreign = sqlite3.connect(path, isolation_level=None)
    loop_turns = 0

    async def turning() -> None:
        nonlocal loop_turns
        while True:
            loop_turns += 1
            await asyncio.sleep(0.01)

    async def main() -> int:
        first, _ = await writes.run("allocate", ledger.try_allocate, ALICE, "share-250", "s0")
        assert writes.in_thread == 1  # measured quick: the next run would be on the loop
        ticker = asyncio.ensure_future(turning())
        foreign.execute("BEGIN IMMEDIATE")
        call = asyncio.ensure_future(
            writes.run("allocate", ledger.try_allocate, ALICE, "share-250", "s1")
        )
        deadline = time.monotonic() + 20
        while writes.gave_way < 1:  # tried on the loop, gave way to a thread
            assert time.monotonic() < deadline and not call.done()
            await asyncio.sleep(0.01)
        turns = loop_turns
        while loop_turns < turns + 5:  # the loop turns while the thread waits
            assert time.monotonic() < deadline and not call.done()
            await asyncio.sleep(0.01)
        foreign.execute("COMMIT")
        second, created = await call
        ticker.cancel()
        assert created and second["id"] != first["id"]
        return writes.on_loop

    assert asyncio.run(main()) == 1
    assert writes.in_thread == 2
    foreign.close()
    # a write off the loop waits for another process as before (SQLite's busy timeout)
    with ledger.db.writing() as s:
        assert s.connection().exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000


def test_calls_made_while_one_is_in_a_thread_wait_for_it_then_run_on_the_loop_in_order(
    tmp_path,
):
    """Only while a call is in a thread do the others wait (on the loop, not each in a
    thread of its own queued on the writer); then they run on the loop, in the order they
    came. With nothing in a thread a call runs at once: no queue to join (an asyncio.Lock
    kept one under a steady load, every call waiting in it a turn of the loop)."""
    db = open_database(f"sqlite:///{tmp_path}/l.sqlite")
    writes = ShortWrites(db)
    order: list[tuple[int, str]] = []

    def call(i: int) -> None:
        order.append(
            (i, "loop" if threading.current_thread() is threading.main_thread() else "worker")
        )

    held, release = threading.Event(), threading.Event()

    def other_writer() -> None:
        with db.writer:
            held.set()
            release.wait(30)

    async def main() -> None:
        await writes.run("x", call, -1)  # the first run of a call is in a thread
        threading.Thread(target=other_writer, daemon=True).start()
        assert await asyncio.to_thread(held.wait, 30)
        first = asyncio.ensure_future(writes.run("x", call, 0))  # to a thread: writer busy
        await asyncio.sleep(0)
        rest = [asyncio.ensure_future(writes.run("x", call, i)) for i in range(1, 5)]
        for _ in range(3):
            await asyncio.sleep(0)
        assert order == [(-1, "worker")]  # all wait for the one in the thread
        release.set()
        await asyncio.gather(first, *rest)
        await writes.run("x", call, 5)  # nothing in a thread: at once, on the loop

    asyncio.run(main())
    assert order == [(-1, "worker"), (0, "worker"), *((i, "loop") for i in range(1, 6))]
    db.dispose()
