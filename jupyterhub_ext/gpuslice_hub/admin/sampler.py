"""The usage sampler: a sample when the service starts, then one every interval.

A failed sample (database away, a bug in one figure) is logged and retried; it must never
take the service down, which also allocates and releases slices.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta

from ..db.models import utcnow
from ..ledger import Ledger
from .usage import prune, take_sample

PRUNE_EVERY = 24 * 3600.0
RETRY_AFTER = 60.0


async def run_sampler(
    ledger: Ledger, interval: float, retention_days: float, log: logging.Logger
) -> None:
    next_prune = time.monotonic()
    while True:
        delay = interval
        try:
            now = utcnow()
            # off the event loop: on a large cluster a sample takes tens of milliseconds
            await asyncio.to_thread(take_sample, ledger, now)
            if time.monotonic() >= next_prune:
                removed = await asyncio.to_thread(
                    prune, ledger, now - timedelta(days=retention_days)
                )
                next_prune = time.monotonic() + PRUNE_EVERY
                if removed:
                    log.info("pruned %d usage samples older than %g days", removed, retention_days)
        except Exception:
            delay = min(interval, RETRY_AFTER)
            log.exception("taking a usage sample failed; retrying in %gs", delay)
        await asyncio.sleep(delay)


def start_sampler(
    ledger: Ledger, interval: float, retention_days: float, log: logging.Logger
) -> asyncio.Future | None:
    """Start sampling in the background (None when ``interval`` is 0: sampling is off)."""
    if interval <= 0:
        return None
    return asyncio.ensure_future(run_sampler(ledger, interval, retention_days, log))
