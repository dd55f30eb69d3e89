"""What overcommit did and what it cost (``GET api/admin/overcommit``, the admin panel's
*Overcommit* section; the policy itself is ``gpuslice_hub/overcommit.py``).

* each GPU that holds an overcommitted share: its memory, what its shares' caps promise,
  what they are charged, and what their holders last reported using — the margin left
  before the promises collide;
* the memory-cap warnings and kills of overcommitted holders over the history window
  (the cost: a holder that reaches its cap on an overcommitted GPU is the case overcommit
  bets against);
* who is charged less at their next spawn, and by how much, from their history.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select

from ..db.admin_models import UsageReportRow
from ..db.models import AllocationRow, ClaimRow, EventRow
from ..ledger import Ledger
from ..overcommit import Key, Observed, charge_factor
from ..snapshot import taken

MEMORY_KINDS = ("memory-warning", "memory-culled")
MAX_HOLDERS_LISTED = 500


def overcommit_view(ledger: Ledger, now: datetime) -> dict[str, Any]:
    settings = ledger.overcommit.settings
    _, gpus, active = ledger.snapshot()
    on_gpu: dict[str, list[tuple[Any, Any]]] = {}
    for a in active:
        if a.kind == "share":
            for c in a.claims:
                if c.active:
                    on_gpu.setdefault(c.gpu_uuid, []).append((a, c))
    crowded = {
        uuid: held
        for uuid, held in on_gpu.items()
        if any(c.charged_milli is not None for _, c in held)
    }
    since = now - timedelta(days=settings.days)
    ids = [a.id for held in crowded.values() for a, _ in held]
    with ledger.db.reading() as s:
        reports = {
            r.allocation_id: r
            for r in s.execute(
                select(
                    UsageReportRow.allocation_id,
                    UsageReportRow.memory_mib,
                    UsageReportRow.peak_memory_mib,
                ).where(UsageReportRow.allocation_id.in_(ids))
            )
        }
        overcommitted = select(ClaimRow.allocation_id).where(ClaimRow.charged_milli.is_not(None))
        cost = Counter(
            dict(
                s.execute(
                    select(EventRow.kind, func.count())
                    .where(
                        EventRow.kind.in_(MEMORY_KINDS),
                        EventRow.ts >= since,
                        EventRow.allocation_id.in_(overcommitted),
                    )
                    .group_by(EventRow.kind)
                ).all()
            )
        )
        charged_since = s.execute(
            select(func.count(func.distinct(ClaimRow.allocation_id)))
            .join(AllocationRow, AllocationRow.id == ClaimRow.allocation_id)
            .where(ClaimRow.charged_milli.is_not(None), AllocationRow.created_at >= since)
        ).scalar_one()
        seen = ledger.overcommit.observed(s) if settings.on else {}
    by_uuid = {g.uuid: g for g in gpus}
    gpu_rows = []
    for uuid, held in sorted(crowded.items(), key=lambda kv: (by_uuid[kv[0]].host, kv[0])):
        g = by_uuid[uuid]
        in_use = [reports[a.id].memory_mib for a, _ in held if a.id in reports]
        gpu_rows.append(
            {
                "host": g.host,
                "gpu_uuid": uuid,
                "gpu_index": g.index,
                "gpu_model": g.model,
                "memory_mib": g.memory_mib,
                "promised_memory_mib": sum(c.memory_mib for _, c in held),
                "charged_memory_mib": sum(taken(c)[1] for _, c in held),
                "promised_milli": sum(c.milli for _, c in held),
                "charged_milli": sum(taken(c)[0] for _, c in held),
                # null when no holder has reported: the margin is unknown, not zero
                "in_use_memory_mib": sum(m for m in in_use if m is not None)
                if any(m is not None for m in in_use)
                else None,
                "holders": [_holder(a, c, reports.get(a.id)) for a, c in held],
            }
        )
    return {
        "settings": settings.json(),
        "gpus": gpu_rows,
        "totals": {
            "overcommitted_shares": sum(
                1 for held in crowded.values() for _, c in held if c.charged_milli is not None
            ),
            "gpus": len(crowded),
            "promised_beyond_memory_mib": sum(
                max(0, r["promised_memory_mib"] - r["memory_mib"]) for r in gpu_rows
            ),
        },
        "cost": {
            "days": settings.days,
            "overcommitted_allocations": charged_since,
            "memory_warnings": cost.get("memory-warning", 0),
            "memory_culled": cost.get("memory-culled", 0),
        },
        "next_charges": _next_charges(ledger, seen),
    }


def _holder(a: Any, c: Any, report: Any) -> dict[str, Any]:
    return {
        "allocation_id": a.id,
        "user": a.user,
        "profile": a.profile,
        "purpose": a.purpose,
        "cap_memory_mib": c.memory_mib,
        "charged_memory_mib": c.charged_memory_mib,
        "charged_milli": c.charged_milli,
        "memory_mib": report.memory_mib if report is not None else None,
        "peak_memory_mib": report.peak_memory_mib if report is not None else None,
    }


def _next_charges(ledger: Ledger, seen: dict[Key, Observed]) -> list[dict[str, Any]]:
    """Who is charged less than their share at their next server or batch job of a
    profile: lowest charge first."""
    settings = ledger.overcommit.settings
    rows = []
    for (user, name, purpose), observed in seen.items():
        profile = ledger.profiles.get(name)
        if profile is None:
            continue
        factor = charge_factor(profile, observed, settings)
        if factor < 1.0:
            rows.append(
                {
                    "user": user,
                    "profile": name,
                    "purpose": purpose,
                    "cap_memory_mib": profile.gpu_memory_mib,
                    "peak_memory_mib": observed.peak_mib,
                    "hours": round(observed.hours, 1),
                    "charge": round(factor, 3),
                }
            )
    rows.sort(key=lambda r: (r["charge"], r["user"], r["profile"]))
    return rows[:MAX_HOLDERS_LISTED]
