"""Reclaiming slices whose server stopped reporting.

Idle reclaim runs inside each user's server. A server that never reports (its extension
disabled, crashed, or replaced by the user's own code) would otherwise keep its slice for
ever. The service sees that from its own records: an interactive allocation under an idle
policy whose holder has sent no usage report for longer than its idle timeout plus
``GPUSliceService.reclaim_silent_after`` has its server stopped through the hub, and the
event says why. The time comes in as a parameter, like every core decision.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select

from gpuslice.idle_policy import IdlePolicy

from .db.admin_models import UsageReportRow
from .ledger import Ledger
from .snapshot import AllocationView, load_active

SILENT_KIND = "reclaim-silent"


@dataclass(frozen=True)
class Silent:
    allocation: AllocationView
    silent_seconds: float
    idle_timeout: float


def find_silent(
    ledger: Ledger,
    policy_for: Callable[[AllocationView], IdlePolicy],
    is_exempt: Callable[[str], bool],
    grace: float,
    now: datetime,
    min_age: float = 0.0,
) -> list[Silent]:
    """Interactive allocations under an idle policy whose holder has been silent (no usage
    report, or none since it was made) for longer than its idle timeout plus ``grace``.
    One younger than ``min_age`` seconds is left alone: its server may still be starting."""
    with ledger.db.reading() as s:
        active = [a for a in load_active(s) if a.purpose == "interactive"]
        rows = s.execute(select(UsageReportRow.allocation_id, UsageReportRow.reported_at))
        reported = {alloc_id: at for alloc_id, at in rows}
    out = []
    for a in active:
        policy = policy_for(a)
        if policy.exempt or policy.idle_timeout <= 0 or is_exempt(a.user):
            continue
        last = a.created_at
        if (now - last).total_seconds() < min_age:
            continue
        if a.id in reported:
            last = max(last, reported[a.id])
        silent = (now - last).total_seconds()
        if silent > policy.idle_timeout + grace:
            out.append(Silent(a, silent, policy.idle_timeout))
    return out


def silent_detail(item: Silent) -> dict[str, Any]:
    a = item.allocation
    return {
        "allocation_id": a.id,
        "profile": a.profile,
        "server_name": a.server_name,
        "scope": "server",
        "silent_seconds": round(item.silent_seconds, 1),
        "idle_timeout": item.idle_timeout,
        # Nobody measured it idle: the slice is freed, but not counted as reclaimed idle time.
        "reclaimed_gpu_hours": 0.0,
    }
