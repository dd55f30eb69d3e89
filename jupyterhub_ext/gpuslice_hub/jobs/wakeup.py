"""Waking the scheduler, from the event loop or from the worker thread its passes run in."""

from __future__ import annotations

import asyncio
import contextlib


class Wakeup:
    """An event the scheduler sleeps on between passes.

    Submissions and preemptions set it on the event loop; the pass itself runs in a worker
    thread (``asyncio.to_thread``) and sets it there when a run finishes. An
    ``asyncio.Event`` may only be touched from its loop, so a set from another thread is
    handed to the loop.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def set(self) -> None:
        loop = self._loop
        if loop is None or _running_loop() is loop:
            self._event.set()
        elif not loop.is_closed():
            loop.call_soon_threadsafe(self._event.set)

    async def wait(self, timeout: float) -> None:
        """Until set or ``timeout`` seconds; cleared again for the next wait."""
        self._loop = asyncio.get_running_loop()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)
        self._event.clear()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
