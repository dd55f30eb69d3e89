"""``POST api/allocations/<id>/usage``: a server's measured GPU use, for the admin panel's
utilization figures. Sent by the owner's server extension every ``usage_report_interval``."""

from __future__ import annotations

from typing import Any

from gpuslice.isotime import iso

from .base import BaseHandler, RequestError, api_authenticated


def _number(body: dict[str, Any], key: str, hi: float, nullable: bool) -> float | None:
    value = body.get(key)
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= hi:
        allowed = " or null" if nullable else ""
        raise RequestError(400, f"field {key!r} must be a number from 0 to {hi:g}{allowed}")
    return float(value)


class UsageReportHandler(BaseHandler):
    @api_authenticated
    async def post(self, alloc_id: str) -> None:
        ident = self.identity()
        body = self.json_body({"utilization", "memory_mib", "idle_seconds", "interval_seconds"})
        if "utilization" not in body:
            raise RequestError(400, "field 'utilization' is required (null when unknown)")
        utilization = _number(body, "utilization", 100, nullable=True)
        memory = _number(body, "memory_mib", 1e9, nullable=True)
        body.setdefault("idle_seconds", 0)
        body.setdefault("interval_seconds", 0)
        idle = _number(body, "idle_seconds", 1e9, nullable=False) or 0.0
        interval = _number(body, "interval_seconds", 1e7, nullable=False) or 0.0

        def record() -> dict[str, Any]:
            alloc = self.held_allocation(ident, alloc_id)
            at = self.ledger.record_usage(alloc["id"], utilization, memory, idle, interval)
            return {"allocation_id": alloc["id"], "recorded_at": iso(at)}

        # in a worker thread: 500 servers report every minute, and on SQLite a write waits
        # for the one writer (a spawn, the scheduler), which must not stall the event loop;
        # the reports' own threads, so that a burst of them never leaves a spawn waiting
        await self.write_computed(record, pool=self.service.report_pool)
