"""What a short write on the event loop's thread may not do: wait, or start a long rebuild.

A ledger call that ``ShortWrites`` runs on the loop (db/short_writes.py) shares the ledger's
caches with the worker threads (the scheduler's pass, the spawn form's counts, ``/metrics``),
which hold their locks for as long as a count over 200 hosts takes; and now and then a call
finds a cache to rebuild (a new inventory generation, thousands of events to follow). On the
loop neither is allowed: such a call raises ``WouldWait`` where it would wait or rebuild, its
transaction rolls back, and ``ShortWrites`` makes it again in a worker thread, where it waits
and rebuilds as any call there does.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any

from gpuslice.errors import GPUSliceError

_here = threading.local()


class WouldWait(GPUSliceError):
    """Raised inside a short write on the loop where it would wait or rebuild."""


def in_short_write() -> bool:
    return getattr(_here, "short", False)


def set_short_write(value: bool) -> None:
    _here.short = value


def not_on_loop(what: str) -> None:
    """Called before long work (``what``: a cache rebuild): refused inside a short write."""
    if getattr(_here, "short", False):
        raise WouldWait(what)


class hold:  # (lower case: used where ``with lock:`` was)
    """``with hold(lock):`` is ``with lock:``, except inside a short write, where a lock that
    another thread holds raises ``WouldWait`` instead of being waited for."""

    __slots__ = ("lock",)

    def __init__(self, lock: Any) -> None:
        self.lock = lock

    def __enter__(self) -> None:
        if getattr(_here, "short", False):
            if not self.lock.acquire(blocking=False):
                raise WouldWait("a ledger cache is in use by another thread")
        else:
            self.lock.acquire()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.lock.release()
