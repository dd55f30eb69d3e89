"""Usage reports to the gpuslice service: every ``interval`` seconds of ticks, the mean GPU
utilization, the peak memory and the idle time of the whole server, for the admin panel.

Reporting is a bystander: it never raises into the sampling loop, never waits for the
service, and a service that is slow or down costs one request in flight, not a pile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from ..activity import ActivityReport, IdleState
from ..activity.usage import UsageWindow, total_memory, total_utilization
from .service import ServiceClient


class UsageReporter:
    def __init__(
        self,
        service: ServiceClient | None,
        interval: float,
        logger: logging.Logger | logging.LoggerAdapter[logging.Logger],
    ) -> None:
        self.service = service
        self.interval = interval
        self.log = logger
        self.window = UsageWindow()
        self.in_flight: asyncio.Task[Any] | None = None
        self.failing = False
        self.sent = 0

    @property
    def enabled(self) -> bool:
        s = self.service
        return self.interval > 0 and s is not None and s.configured and bool(s.allocation_id)

    def observe(self, now: float, report: ActivityReport, states: Mapping[str, IdleState]) -> None:
        """Account one tick; start a report in the background when one is due."""
        if not self.enabled:
            return
        owners = [report.server, *report.kernels.values()]
        self.window.add(now, total_utilization(owners), total_memory(owners))
        if self.in_flight is not None and not self.in_flight.done():
            # The previous report is still on its way: keep accumulating, so the next
            # one covers the longer interval instead of a second request queueing up.
            return
        if self.window.elapsed(now) < self.interval:
            return
        usage = self.window.take(now)
        # Idle only when everything is: the least idle owner decides (0 when one is busy).
        idle = min((s.idle_seconds for s in states.values()), default=0.0)
        self.in_flight = asyncio.ensure_future(
            self._send(usage.utilization, usage.memory_mib, idle, usage.interval_seconds)
        )

    async def _send(
        self,
        utilization: float | None,
        memory_mib: float | None,
        idle_seconds: float,
        interval_seconds: float,
    ) -> None:
        assert self.service is not None
        try:
            await self.service.usage(utilization, memory_mib, idle_seconds, interval_seconds)
        except Exception as e:
            # A hub without the endpoint yet answers 404 every time: say so once.
            if not self.failing:
                self.log.warning(
                    "gpuslice: usage report not accepted by the service (%s); "
                    "will keep trying quietly every %gs",
                    e,
                    self.interval,
                )
            else:
                self.log.debug("gpuslice: usage report failed again: %s", e)
            self.failing = True
            return
        if self.failing:
            self.log.info("gpuslice: usage reports reach the service again")
        self.failing = False
        self.sent += 1

    async def drain(self) -> None:
        if self.in_flight is not None:
            await asyncio.gather(self.in_flight, return_exceptions=True)
