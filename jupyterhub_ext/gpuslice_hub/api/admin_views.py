"""The admin panel's read side: the pool right now, and usage over time (admin scope only)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from gpuslice.isotime import iso

from ..admin.accounting import group_usage
from ..admin.overcommit import overcommit_view
from ..admin.overview import overview
from ..admin.quota_suggestions import quota_suggestions
from ..admin.split_pools import pool_standing
from ..admin.usage import series
from ..db.models import utcnow
from .admin import AdminBase
from .base import api_authenticated, int_arg

MAX_DAYS = 90
MAX_POINTS = 2000
DEFAULT_POINTS = 500


class AdminOverviewHandler(AdminBase):
    """``GET api/admin/overview``: hosts, GPUs, slices and their holders, pool totals."""

    @api_authenticated
    async def get(self) -> None:
        self.admin("the admin overview")
        inv = self.service.inventory
        backend = inv.backend if inv else None
        simulated = bool(inv and inv.simulated)
        jobs = self.service.jobs

        def computed() -> dict[str, Any]:
            out = overview(self.ledger, utcnow(), backend, simulated)
            # the job folders' disk, as the last sweep measured it (null: no job scheduler)
            out["jobs_root"] = jobs.disk_standing() if jobs is not None else None
            return out

        # in a worker thread: on a large cluster this takes tens of milliseconds that
        # spawns waiting on the event loop should not
        await self.write_computed(computed)


class AdminUsageHandler(AdminBase):
    """``GET api/admin/usage?days=7&points=500``: the usage samples of the last ``days``
    (averaged down to at most ``points``), and per-group GPU-hours over 7 and 30 days."""

    @api_authenticated
    async def get(self) -> None:
        self.admin("usage figures")
        days = int_arg(self, "days", 7, 1, MAX_DAYS)
        points = int_arg(self, "points", DEFAULT_POINTS, 1, MAX_POINTS)
        now = utcnow()
        since = now - timedelta(days=days)
        # Seconds between two points: the sampling interval, unless averaging made it longer.
        step = max(float(self.service.usage_sample_interval), days * 86400 / points)
        await self.write_computed(
            lambda: {
                "from": iso(since),
                "to": iso(now),
                "interval_seconds": step,
                "series": series(self.ledger, since, now, points),
                "groups": group_usage(self.ledger, now),
            }
        )


class AdminCapacityHandler(AdminBase):
    """``GET api/admin/capacity``: the capacity check (allocation against effective
    utilization and queue against run time over 7 and 30 days, and what they mean)."""

    @api_authenticated
    async def get(self) -> None:
        self.admin("the capacity check")
        cache = self.service.capacity
        assert cache is not None, "the service makes it with the ledger"
        self.write_json(await asyncio.to_thread(cache.get, utcnow()))


class AdminPoolsHandler(AdminBase):
    """``GET api/admin/pools``: the split pools (``JobManager.reserved_pools``), each one's
    GPUs and who holds them, and the borrowing window's state."""

    @api_authenticated
    async def get(self) -> None:
        self.admin("the split pools")
        self.write_json(await asyncio.to_thread(pool_standing, self.ledger, utcnow()))


class AdminOvercommitHandler(AdminBase):
    """``GET api/admin/overcommit``: the settings, each GPU holding an overcommitted share
    (memory promised, charged and in use), the memory-cap warnings and kills of
    overcommitted holders, and who is charged less at their next spawn."""

    @api_authenticated
    async def get(self) -> None:
        self.admin("overcommit")
        self.write_json(await asyncio.to_thread(overcommit_view, self.ledger, utcnow()))


class QuotaSuggestionsHandler(AdminBase):
    """``GET api/admin/quota-suggestions``: per user and group, the most held at once over
    ``quota_suggestion_days``, the quota that would suggest, and the one in force."""

    @api_authenticated
    async def get(self) -> None:
        self.admin("quota suggestions")
        settings = self.service.suggestion_settings

        def compute() -> dict:
            with self.ledger.db.reading() as s:
                effective = self.ledger.effective_quotas(s)
            return quota_suggestions(self.ledger, effective, settings, utcnow())

        self.write_json(await asyncio.to_thread(compute))
