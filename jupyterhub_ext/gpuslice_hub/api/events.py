"""``api/events``: the audit trail, and the idle-reclaim observations a server reports.

A server may report only about the allocation it holds; the service looks that allocation up
and writes every figure it stores itself, so a client can neither charge another user nor
inflate what the admin panel counts (reclaimed GPU-hours come from the reclaim endpoint, on
the service's own terms).
"""

from __future__ import annotations

from typing import Any

from gpuslice.vocab import IDLE_EVENT_KINDS

from ..idle import allocation_age
from .base import BaseHandler, RequestError, api_authenticated, id_page, int_arg

# The kinds a server extension reports (gpuslice.extension.decisions.SERVICE_KIND).
EVENT_KINDS = tuple(IDLE_EVENT_KINDS.values())
SCOPES = ("server", "kernel")
MAX_SECONDS = 1e9
MAX_MEMORY_MIB = 1e9


class EventsHandler(BaseHandler):
    @api_authenticated
    async def get(self) -> None:
        ident = self.identity()
        user = self.listed_user(ident, "events")
        given = self.get_argument("since", None) is not None
        since = int_arg(self, "since", 0, 0, 2**62) if given else None
        before = int_arg(self, "before", 0, 0, 2**62) or None
        if since is not None and before:
            raise RequestError(400, "give since (oldest first) or before (newest first), not both")
        limit = int_arg(self, "limit", 200, 1, 5000)
        await self.write_computed(
            lambda: id_page(
                self.ledger.events(user=user, since_id=since, limit=limit + 1, before_id=before),
                limit,
                "events",
            )
        )

    @api_authenticated
    async def post(self) -> None:
        """An idle or memory-cap decision of the holder's server extension, with its reason."""
        ident = self.identity()
        body = self.json_body({"kind", "user", "reason", "detail"})
        kind = body.get("kind")
        if not isinstance(kind, str) or kind not in EVENT_KINDS:
            raise RequestError(400, f"field 'kind' must be one of {list(EVENT_KINDS)}")
        reason = body.get("reason")
        if reason is not None and (not isinstance(reason, str) or len(reason) > 1000):
            raise RequestError(400, "field 'reason' must be a string (1000 characters at most)")
        raw = body.get("detail", {})
        if not isinstance(raw, dict):
            raise RequestError(400, "field 'detail' must be an object")
        alloc_id = raw.get("allocation_id")
        if isinstance(alloc_id, bool) or not isinstance(alloc_id, int):
            raise RequestError(400, "detail.allocation_id (the allocation reported on) is required")

        def record() -> dict[str, Any]:
            alloc = self.held_allocation(ident, alloc_id)
            user = body.get("user", alloc["user"])
            if user != alloc["user"]:
                raise RequestError(403, "an event is about the allocation's holder only")
            detail = _detail(raw, alloc)
            if kind == IDLE_EVENT_KINDS["culled"] and detail["scope"] == "server":
                # a server's cull is a request to stop it: only the reclaim endpoint makes
                # one (and counts what it reclaims); an event can say a kernel was culled
                raise RequestError(
                    400,
                    "a server's idle cull is asked of api/allocations/<id>/reclaim; "
                    "an idle-culled event is about a kernel (detail.scope 'kernel')",
                )
            return self.ledger.record_event(kind, alloc["user"], ident.name, reason, detail)

        # a write: on SQLite it may wait for the one writer, never on the event loop
        await self.write_computed(record, 201)


def _detail(raw: dict[str, Any], alloc: dict[str, Any]) -> dict[str, Any]:
    """What is stored: the allocation's own fields from the ledger, and the few observations
    a server can make, each checked. Idle time cannot exceed the allocation's age."""
    detail: dict[str, Any] = {
        "allocation_id": alloc["id"],
        "profile": alloc["profile"],
        "server_name": alloc["server_name"],
        "gpu_milli": alloc["gpu_milli"],
    }
    scope = raw.get("scope", "server" if raw.get("kernel_id") is None else "kernel")
    if scope not in SCOPES:
        raise RequestError(400, f"detail.scope must be one of {list(SCOPES)}")
    detail["scope"] = scope
    for key, limit in (("kernel_id", 128), ("deadline", 64)):
        value = raw.get(key)
        if value is not None and (not isinstance(value, str) or len(value) > limit):
            raise RequestError(400, f"detail.{key} must be a string ({limit} characters at most)")
        detail[key] = value
    for key, hi in (("idle_seconds", MAX_SECONDS), ("memory_mib", MAX_MEMORY_MIB)):
        value = raw.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= hi:
            raise RequestError(400, f"detail.{key} must be a number from 0 to {hi:g}")
        detail[key] = float(value)
    if "idle_seconds" in detail:
        detail["idle_seconds"] = min(detail["idle_seconds"], allocation_age(alloc))
    # A kernel cull keeps the slice; only the reclaim endpoint frees one and counts hours.
    detail["reclaimed_gpu_hours"] = 0.0
    return detail
