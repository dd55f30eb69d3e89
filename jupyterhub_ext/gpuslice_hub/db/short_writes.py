"""Ledger calls that the API makes on the event loop's thread when they are known to be short.

Every ledger write the API makes (an allocation, a release) used to go to a worker thread,
so that placement at hundreds of hosts never holds up the event loop. The hop is not free:
on a 2-vCPU machine it cost about 0.3 ms of the service's CPU per allocate + release cycle,
and running the SQL in the worker (each SQLite call lets go of the GIL and takes it back)
as much again: together about a quarter of the cycle at 64 GPUs (docs/benchmarks.md).

So a call runs on the loop's thread when all of these hold, and in a worker thread otherwise:

- the ledger is SQLite (a PostgreSQL call waits on the network);
- no other thread of this process is writing (``Database.writer`` is free; taking it
  without waiting means the call never queues behind another writer on the loop). Calls
  made while one of them is in a thread wait for it on the loop, not in threads of their
  own, and then run on the loop in the order they came;
- its last run took under ``budget`` seconds: by the clock on the loop, in CPU time in a
  thread (what it would have cost the loop). The first run of each call is in a thread; a
  run in a thread over the budget sends the next one there too, and a run on the loop
  over it sends the next ``AWAY_AFTER_SLOW``.

On the loop the call may not wait for a cache that another thread holds, nor rebuild one
(db/loopguard.py): where it would, it rolls back and is made again in a thread. At 200
hosts placement from the kept arrays is quick enough that spawns' calls run on the loop
there too (docs/benchmarks.md). What no check sees beforehand, because it comes after the
policy has learned the request (a call given way then would be learned twice): the rare
rebuild of a learning policy's typical requests, and FGD's first scoring of a request
shape it has not seen. The budget sends the calls after such a run to threads.

The service is the ledger's only writer (db/owner.py), so SQLite's own lock is normally
free when this process's writer lock is. Another process writing anyway (an admin's
``sqlite3`` shell left in a write transaction) would have the loop wait out SQLite's busy
timeout (30 s): on the loop a write asks SQLite not to wait at all (db/engine.py), and a
ledger that is locked gives way to a thread, which waits.
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
from collections.abc import Callable
from typing import Any, TypeVar

from .engine import Database
from .loopguard import WouldWait, set_short_write

T = TypeVar("T")

# A call that took under this the last time may run on the loop: the loop's own handling of
# a request costs about 0.5 ms, and its stall aim is 50 ms (docs/benchmarks.md).
BUDGET_SECONDS = 0.002
# After a run on the loop over the budget, this many runs of the call are made in threads.
AWAY_AFTER_SLOW = 16


class ShortWrites:
    def __init__(self, db: Database, budget: float = BUDGET_SECONDS) -> None:
        self.db = db
        self.budget = budget
        self._last: dict[str, float] = {}  # call name -> seconds its last run took
        self._away: dict[str, int] = {}  # call name -> runs still to make in a thread
        self.on_loop = 0  # runs made on the loop's thread, and in workers (for tests)
        self.in_thread = 0
        self.gave_way = 0  # runs on the loop that gave way to a thread (WouldWait)
        # While one of these calls runs in a thread, the others wait their turn here, on the
        # loop, rather than each in a thread of its own waiting for the writer: a queue of
        # threads keeps the writer always taken, so every call after them would find it busy
        # and go to a thread too (at 50 clients back to back, all of them did). Not an
        # ``asyncio.Lock``: under a steady load its queue never drains (a call arriving
        # while any waits queues behind it, and each waiter is woken a loop turn later),
        # so every call on the loop waited in it, one loop turn each; here a call waits
        # only while a call of ours is in a thread.
        self._call_in_thread = False
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()

    async def run(self, name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)``, on this thread when it is known to be short (above),
        else in a worker thread; ``name`` identifies the call whose duration is kept."""
        if not self.db.is_sqlite:
            self.in_thread += 1
            return await asyncio.to_thread(fn, *args, **kwargs)
        while self._call_in_thread:
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            await waiter
        if (
            self._last.get(name, math.inf) < self.budget
            and not self._away.get(name)
            and self.db.writer.acquire(blocking=False)
        ):
            try:
                self.on_loop += 1
                return self._on_loop(name, fn, args, kwargs)
            except WouldWait:
                # it would have waited for a cache another thread holds, or rebuilt one:
                # rolled back, and made again in a thread (db/loopguard.py)
                self.gave_way += 1
            finally:
                self.db.writer.release()
        elif self._away.get(name):
            self._away[name] -= 1
        self.in_thread += 1
        self._call_in_thread = True
        try:
            return await asyncio.to_thread(self._in_worker, name, fn, args, kwargs)
        finally:
            self._call_in_thread = False
            # in the order they came: the first may send its call to a thread again, and
            # the rest then wait for that one
            waiting, self._waiting = self._waiting, collections.deque()
            for waiter in waiting:
                if not waiter.done():
                    waiter.set_result(None)

    def _in_worker(self, name: str, fn: Callable[..., T], args: Any, kwargs: Any) -> T:
        # Measured as the thread's CPU time, once the writer is held: neither the wait for
        # another writer nor the waits for the GIL while the loop serves other requests are
        # the call's cost (timed by the clock, a busy loop made every call look slow and
        # kept them all in threads just when the hop costs most).
        with self.db.writer:
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self._last[name] = time.thread_time() - start

    def _on_loop(self, name: str, fn: Callable[..., T], args: Any, kwargs: Any) -> T:
        # By the clock: how long the loop was held, waits on the disk included.
        start = time.perf_counter()
        set_short_write(True)
        try:
            return fn(*args, **kwargs)
        finally:
            set_short_write(False)
            took = self._last[name] = time.perf_counter() - start
            if took >= self.budget:
                # Not just the next run: a run that was slow on the loop (the GIL taken by
                # a busy scheduler pass at each of its SQL statements) would be quick again
                # in a thread, and every other run would hold the loop up.
                self._away[name] = AWAY_AFTER_SLOW
