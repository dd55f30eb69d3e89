"""The service's one clock: every timestamp the ledger and the job service write, and
every "now" their decisions are made at, comes from :func:`now`.

The running service reads the system clock. A simulator (``benchmarks/sim``) or a test
installs a :class:`ManualClock` with :func:`installed` and moves time itself, so the
ledger, quotas, placement and the job scheduler run unchanged on virtual time: a month of
a cluster replayed in minutes, or a grace period that ends without waiting for it.

Loops that *wait* (``asyncio.sleep``) keep waiting on real time: a simulator calls the
decision code (``Scheduler.tick(now)``) itself rather than running those loops.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The current instant, timezone-aware UTC."""


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class ManualClock:
    """Time that moves only when told to (never backwards)."""

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("a ManualClock starts at a timezone-aware instant")
        self._now = start.astimezone(UTC)

    def now(self) -> datetime:
        return self._now

    def set(self, when: datetime) -> None:
        if when < self._now:
            raise ValueError(f"time cannot go back from {self._now} to {when}")
        self._now = when

    def advance(self, seconds: float) -> datetime:
        self.set(self._now + timedelta(seconds=seconds))
        return self._now


SYSTEM = SystemClock()
_clock: Clock = SYSTEM


def now() -> datetime:
    return _clock.now()


def timestamp() -> float:
    """:func:`now` as POSIX seconds."""
    return _clock.now().timestamp()


@contextmanager
def installed(clock: Clock) -> Iterator[Clock]:
    """Run the block with ``clock`` as the service's clock (one at a time per process)."""
    global _clock
    previous, _clock = _clock, clock
    try:
        yield clock
    finally:
        _clock = previous
