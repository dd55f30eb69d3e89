"""Usage samples: the whole pool every few minutes, for the utilization-vs-allocation plot.

When allocation is high and utilization low, a long queue is a scheduling problem (slices
held idle), not a capacity problem; the samples show which one an admin is looking at.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy import Connection, Table, case, delete, func, insert, select

from gpuslice.isotime import iso

from ..db.admin_models import UsageSampleRow
from ..ledger import Ledger
from .pool import read_pool, totals
from .sqltime import epoch, floor_div

SAMPLES = cast(Table, UsageSampleRow.__table__)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# What a sample stores besides its timestamp, in the order the series lists them.
FIELDS = (
    "capacity_milli",
    "in_service_milli",
    "allocated_milli",
    "interactive_milli",
    "batch_milli",
    "used_milli",
    "reported_milli",
    "fragmented_milli",
    "queued_jobs",
    "running_jobs",
)


def take_sample(ledger: Ledger, now: datetime) -> dict[str, Any]:
    """Measure the pool and store one sample; returns it as the series lists it."""
    figures = totals(read_pool(ledger), now)
    return store_sample(ledger, now, {k: figures[k] for k in FIELDS})


def store_sample(ledger: Ledger, now: datetime, values: dict[str, Any]) -> dict[str, Any]:
    """Store one sample of the ``FIELDS`` (the simulator stores its own figures of use)."""
    # a single row every few minutes: nothing to serialize with allocations
    with ledger.db.writing(lock=False) as s:
        s.connection().execute(insert(SAMPLES).values(ts=now, **values))
    return {"ts": iso(now), **values}


def prune(ledger: Ledger, before: datetime) -> int:
    """Delete the samples older than ``before``; returns how many went."""
    with ledger.db.writing() as s:
        result = s.connection().execute(delete(SAMPLES).where(SAMPLES.c.ts < before))
        return int(result.rowcount or 0)


def series(
    ledger: Ledger, since: datetime, until: datetime, max_points: int
) -> list[dict[str, Any]]:
    """The samples in [since, until], oldest first, averaged into at most ``max_points``
    equal time buckets when there are more (a 90-day plot needs no 25,000 points)."""
    window = (SAMPLES.c.ts >= since, SAMPLES.c.ts <= until)
    with ledger.db.reading() as s:
        conn = s.connection()
        count = conn.execute(select(func.count()).select_from(SAMPLES).where(*window)).scalar()
        if (count or 0) <= max_points:
            rows = conn.execute(
                select(SAMPLES).where(*window).order_by(SAMPLES.c.ts, SAMPLES.c.id)
            ).all()
            return [{"ts": iso(r.ts), **{k: getattr(r, k) for k in FIELDS}} for r in rows]
        return _averaged(conn, window, since, until, max_points)


def _averaged(
    conn: Connection, window: tuple[Any, ...], since: datetime, until: datetime, buckets: int
) -> list[dict[str, Any]]:
    span = (until - since).total_seconds()
    offset = epoch(SAMPLES.c.ts) - since.timestamp()
    # a sample exactly at ``until`` belongs to the last bucket, not to one past it
    bucket = case((offset >= span, buckets - 1), else_=floor_div(offset, span / buckets))
    ts = epoch(SAMPLES.c.ts)
    # AVG skips NULLs: used_milli is averaged over the samples that knew it
    averages = [func.avg(SAMPLES.c[k]) for k in FIELDS]
    rows = conn.execute(
        select(func.min(ts), func.max(ts), *averages)
        .where(*window)
        .group_by(bucket)
        .order_by(bucket)
    ).all()
    out = []
    for first, last, *values in rows:
        # each point sits in the middle of the samples it stands for
        # to the millisecond: SQLite's julianday() keeps no more
        middle = EPOCH + timedelta(milliseconds=round((float(first) + float(last)) * 500))
        point: dict[str, Any] = {"ts": iso(middle)}
        for k, v in zip(FIELDS, values, strict=True):
            point[k] = None if v is None else round(float(v))
        out.append(point)
    return out
