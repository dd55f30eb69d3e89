"""What the ledger records besides allocations' state: reading allocations and events,
recording a client's event, and the latest usage each holder reported."""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterable
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, bindparam, case, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from ..db.admin_models import UsageReportRow
from ..db.lean import Lean
from ..db.models import (
    AllocationRow,
    EventRow,
    utcnow,
)
from ..serialize import allocation_json, event_json
from ..snapshot import (
    load_allocation,
)
from .base import (
    RECLAIM_KINDS,
    LedgerBase,
    stops_a_server,
)

_EVENT = Lean(select(EventRow.__table__).where(EventRow.id == bindparam("id")), named=True)
# The events that may be the request to stop an allocation's server (an idle cull, its
# owner's release, a silent server's reclaim), oldest first: ``stops_a_server`` tells a
# server's from a kernel's cull (a kernel's scope is in the detail, and an allocation
# has few of them). At most one stop request is recorded per slice.
_RECLAIM_EVENTS = Lean(
    select(EventRow.__table__)
    .where(EventRow.allocation_id == bindparam("b_id"), EventRow.kind.in_(RECLAIM_KINDS))
    .order_by(EventRow.id),
    named=True,
)


class RecordsMixin(LedgerBase):
    def get(self, alloc_id: int) -> dict[str, Any] | None:
        with self.db.reading() as s:
            view = load_allocation(s, alloc_id)
            return allocation_json(view, self._gpus(s)) if view else None

    def allocations(
        self,
        user: str | None = None,
        active_only: bool = True,
        limit: int = 500,
        before_id: int | None = None,
        servers: Collection[str] | None = None,
    ) -> list[dict[str, Any]]:
        """Newest first; ``before_id``: the page after the one that ended there.
        ``servers``: only the slices of these servers (of ``user``), as a server's token sees
        them."""
        with self.db.reading() as s:
            q = select(AllocationRow).order_by(AllocationRow.id.desc()).limit(limit)
            if before_id is not None:
                q = q.where(AllocationRow.id < before_id)
            if user is not None:
                q = q.where(AllocationRow.user == user)
            if servers is not None:
                q = q.where(
                    AllocationRow.purpose == "interactive",
                    AllocationRow.server_name.in_(sorted(servers)),
                )
            if active_only:
                q = q.where(AllocationRow.active)
            gpus = self._gpus(s)
            return [allocation_json(r, gpus) for r in s.scalars(q)]

    def events(
        self,
        user: str | None = None,
        since_id: int | None = None,
        limit: int = 200,
        kinds: Iterable[str] | None = None,
        before_id: int | None = None,
    ) -> list[dict[str, Any]]:
        """Newest first; with ``since_id`` the oldest after it first, so that a reader
        following the log page by page (the last id as the next ``since_id``) misses none."""
        with self.db.reading() as s:
            q = select(EventRow).limit(limit)
            if since_id is None:
                q = q.order_by(EventRow.id.desc())
            else:
                q = q.where(EventRow.id > since_id).order_by(EventRow.id.asc())
            if before_id is not None:
                q = q.where(EventRow.id < before_id)
            if user is not None:
                q = q.where(EventRow.user == user)
            if kinds is not None:
                q = q.where(EventRow.kind.in_(list(kinds)))
            return [event_json(e) for e in s.scalars(q)]

    def record_event(
        self, kind: str, user: str | None, actor: str, reason: str | None, detail: dict[str, Any]
    ) -> dict[str, Any]:
        with self.db.writing() as s:
            event_id = self._event(
                s,
                kind,
                user,
                actor,
                detail.get("allocation_id"),
                detail.get("profile"),
                reason,
                detail,
            )
            # as stored (its detail's JSON, its time's precision), in a statement, not
            # the ORM's ``get``: every idle cull a server reports records one
            row = _EVENT.execute(s.connection(), {"id": event_id}).one()
            return event_json(row)

    def record_stop_request(
        self, kind: str, user: str, actor: str, reason: str, detail: dict[str, Any]
    ) -> tuple[dict[str, Any], bool]:
        """Record that the server holding ``detail["allocation_id"]`` is to be stopped
        (``kind``: one of ``RECLAIM_KINDS``), once per slice: the event recorded, and whether
        it is new. Asked again (the server's retry of a cull whose answer it never got, or
        after a stop that did not happen), the first request stands: a cull, and its
        reclaimed GPU-hours, are counted once."""
        assert kind in RECLAIM_KINDS, kind
        with self.db.writing() as s:
            events = _RECLAIM_EVENTS.execute(s.connection(), {"b_id": detail["allocation_id"]})
            row = next((r for r in events if stops_a_server(r.kind, r.detail)), None)
            if row is not None:
                return event_json(row), False
            event_id = self._event(
                s, kind, user, actor, detail["allocation_id"], detail.get("profile"), reason, detail
            )
            return event_json(_EVENT.execute(s.connection(), {"id": event_id}).one()), True

    def pending_stops(self, requested_before: datetime) -> list[tuple[int, str, str]]:
        """(allocation id, user, server name) of the interactive slices still held whose
        server's stop was requested before ``requested_before``: the hub was never asked
        (the service stopped in between) or its stop did not happen. A kernel's cull is no
        such request: its server keeps running, and keeps its slice."""
        q = (
            select(
                AllocationRow.id,
                AllocationRow.user,
                AllocationRow.server_name,
                EventRow.kind,
                EventRow.detail,
            )
            .join(EventRow, EventRow.allocation_id == AllocationRow.id)
            .where(
                AllocationRow.active,
                AllocationRow.purpose == "interactive",
                EventRow.kind.in_(RECLAIM_KINDS),
                EventRow.ts < requested_before,
            )
            .order_by(AllocationRow.id)
        )
        with self.db.reading() as s:
            rows = s.execute(q).all()
        found: dict[int, tuple[int, str, str]] = {}
        for alloc_id, user, server, kind, detail in rows:
            if stops_a_server(kind, detail):
                found.setdefault(int(alloc_id), (int(alloc_id), str(user), str(server)))
        return list(found.values())

    def record_usage(
        self,
        alloc_id: int,
        utilization: float | None,
        memory_mib: float | None,
        idle_seconds: float,
        interval_seconds: float,
    ) -> datetime:
        """Keep the latest utilization the holder of an active allocation measured."""
        now = utcnow()
        values = {
            "b_allocation_id": alloc_id,
            "b_reported_at": now,
            "b_utilization": utilization,
            "b_memory_mib": memory_mib,
            "b_idle_seconds": idle_seconds,
            "b_interval_seconds": interval_seconds,
        }
        with self.db.writing(lock=False) as s:
            s.connection().execute(_usage_upsert(self.db.is_sqlite), values)
        return now


USAGE_FIELDS = ("reported_at", "utilization", "memory_mib", "idle_seconds", "interval_seconds")


@functools.cache
def _usage_upsert(sqlite: bool) -> Any:
    """The usage report's upsert, built once: building it per report (a SQLAlchemy
    statement, its case expression, its cache key) cost more than running it on SQLite,
    and every holder reports once a minute."""
    reports = cast(Table, UsageReportRow.__table__)
    upsert = sqlite_insert if sqlite else pg_insert
    fields = {name: bindparam(f"b_{name}", type_=reports.c[name].type) for name in USAGE_FIELDS}
    stmt = upsert(reports).values(
        allocation_id=bindparam("b_allocation_id", type_=reports.c.allocation_id.type),
        # (the report's memory again: a first report's memory is its peak)
        peak_memory_mib=bindparam("b_memory_mib", type_=reports.c.memory_mib.type),
        **fields,
    )
    # The most memory the holder ever reported, for overcommit's history: the greater of
    # the kept peak and this report's (a report without memory keeps the peak).
    kept = reports.c.peak_memory_mib
    peak = case(
        (stmt.excluded.memory_mib > func.coalesce(kept, -1.0), stmt.excluded.memory_mib),
        else_=kept,
    )
    # One statement, safe without the ledger lock: 500 servers reporting every minute do
    # not queue behind spawns.
    return stmt.on_conflict_do_update(
        index_elements=[reports.c.allocation_id],
        set_={**{name: stmt.excluded[name] for name in USAGE_FIELDS}, "peak_memory_mib": peak},
    )
