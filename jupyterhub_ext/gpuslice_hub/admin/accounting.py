"""GPU-hours per group over the last 7 and 30 days, and the GPU-hours idle culls gave back."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Table, func, or_, select

from ..db.models import AllocationRow, EventRow
from ..ledger import Ledger
from ..ledger.external import EXTERNAL
from .history import pruned_totals, reclaimed_hours
from .sqltime import epoch

WEEK = timedelta(days=7)
MONTH = timedelta(days=30)
NO_GROUP = "(no group)"
ALLOCATIONS = cast(Table, AllocationRow.__table__)


def counted_group() -> Any:
    """Whom an allocation counts for, as a SQL expression: the group its quota was charged
    to, else the user's first group (the ledger stores them sorted, so this is stable),
    else NO_GROUP. The database works it out: parsing 10,000s of JSON lists in Python took
    most of the time of the views that need it."""
    cols = ALLOCATIONS.c
    return func.coalesce(cols.charged_group, cols.groups[0].as_string(), NO_GROUP)


def reclaimed(ledger: Ledger, now: datetime) -> dict[str, float]:
    """GPU-hours given back by idle culls: all time (pruned history included, through its
    totals), and over the last 7 and 30 days."""
    with ledger.history_lock, ledger.db.reading() as s:
        pruned = pruned_totals(s)
        rows = s.execute(
            select(EventRow.ts, EventRow.detail).where(
                EventRow.kind == "idle-culled", EventRow.id > pruned.through
            )
        ).all()
    total = sum(pruned.hours_by_profile().values())
    week = month = 0.0
    for ts, detail in rows:
        gained = reclaimed_hours(detail)
        age = now - ts
        total += gained
        month += gained if age <= MONTH else 0.0
        week += gained if age <= WEEK else 0.0
    return {"total": round(total, 6), "last_7d": round(week, 6), "last_30d": round(month, 6)}


def group_usage(ledger: Ledger, now: datetime) -> list[dict[str, Any]]:
    """Per group: allocated GPU-hours (the part of each allocation's life inside the window
    times its GPU share), split by purpose, and the GPU-hours its culled sessions gave back.
    Busiest group first. What jobs and pods outside gpuslice hold (the Slurm and Kubernetes
    mirrors' external allocations) is no group's use of gpuslice: left out."""
    since_month = now - MONTH
    end, week, month = now.timestamp(), (now - WEEK).timestamp(), since_month.timestamp()
    cols = ALLOCATIONS.c
    group = counted_group()
    with ledger.db.reading() as s:
        allocs = s.execute(
            select(
                cols.id,
                cols.purpose,
                group,
                cols.gpu_milli,
                epoch(cols.created_at),
                epoch(cols.released_at),
            ).where(
                cols.created_at < now,
                or_(cols.released_at.is_(None), cols.released_at > since_month),
                cols.purpose != EXTERNAL,
            )
        ).all()
        culls = s.execute(
            select(EventRow.allocation_id, EventRow.detail).where(
                EventRow.kind == "idle-culled", EventRow.ts > since_month, EventRow.ts <= now
            )
        ).all()
        group_by_alloc = {a[0]: a[2] for a in allocs}
        missing = {c.allocation_id for c in culls} - set(group_by_alloc) - {None}
        if missing:
            found = s.execute(select(cols.id, group).where(cols.id.in_(missing)))
            group_by_alloc.update({alloc_id: name for alloc_id, name in found})
    out: dict[str, dict[str, Any]] = defaultdict(
        lambda: {
            "gpu_hours_7d": 0.0,
            "gpu_hours_30d": 0.0,
            "interactive_gpu_hours_30d": 0.0,
            "batch_gpu_hours_30d": 0.0,
            "allocations_30d": 0,
            "reclaimed_gpu_hours_30d": 0.0,
        }
    )
    for _, purpose, name, gpu_milli, created, released in allocs:
        start, stop = float(created), end if released is None else float(released)
        gpus = gpu_milli / 1000 / 3600
        entry = out[name]
        in_month = max(min(stop, end) - max(start, month), 0.0) * gpus
        entry["gpu_hours_30d"] += in_month
        entry["gpu_hours_7d"] += max(min(stop, end) - max(start, week), 0.0) * gpus
        entry["batch_gpu_hours_30d" if purpose == "batch" else "interactive_gpu_hours_30d"] += (
            in_month
        )
        entry["allocations_30d"] += 1
    for c in culls:
        group = group_by_alloc.get(c.allocation_id, NO_GROUP)
        out[group]["reclaimed_gpu_hours_30d"] += reclaimed_hours(c.detail)
    rows = [
        {"group": name, **{k: round(v, 6) if isinstance(v, float) else v for k, v in e.items()}}
        for name, e in out.items()
    ]
    return sorted(rows, key=lambda r: (-r["gpu_hours_30d"], r["group"]))
