"""Idle reclaim, service side: the idle policy a server should apply, and stopping a server
whose slice its extension found idle (or whose owner pressed "release")."""

from __future__ import annotations

import asyncio
from typing import Any

from gpuslice.jsonclient import JSONError

from ..idle import effective_policy, reclaim_record
from .base import BaseHandler, Identity, RequestError, api_authenticated


class IdlePolicyHandler(BaseHandler):
    """``GET api/idle-policy[?allocation_id=N]``: the admin's policy resolved for the caller
    (or the allocation's owner and profile): timeouts, action, and any exemption."""

    @api_authenticated
    async def get(self) -> None:
        ident = self.identity()
        raw = self.get_argument("allocation_id", None)
        user, profile = ident.name, None
        if raw is not None:
            if not (raw.isascii() and raw.isdigit()):
                raise RequestError(400, f"query argument allocation_id must be an integer: {raw!r}")
            # ledger reads (every server asks each policy refresh): in worker threads
            alloc = await asyncio.to_thread(self.visible_allocation, ident, raw)
            user, profile = alloc["user"], alloc["profile"]
        groups = await self._groups(ident, user)
        store = self.service.admin_settings

        def resolved() -> dict[str, Any]:
            policy = effective_policy(
                self.service.idle_policy_config,
                self.service.parsed_profiles,
                user,
                groups,
                profile,
                store.exemption(user) if store is not None else None,
            )
            return {"user": user, "profile": profile, "policy": policy.to_json()}

        await self.write_computed(resolved)

    async def _groups(self, ident: Identity, user: str) -> tuple[str, ...]:
        # A server's token carries no group scope; the service looks the groups up itself.
        if ident.name == user and ident.groups:
            return ident.groups
        if not self.service.hub_api.configured:
            return ()
        return await self.service.hub_api.user_groups(user) or ()


class ReclaimHandler(BaseHandler):
    """``POST api/allocations/<id>/reclaim`` ``{"reason", "idle_seconds", "voluntary"}``:
    stop the allocation's server through the hub (its spawner then releases the slice)
    and record why. Only the holder (the owner's server token, or the owner) may call it."""

    @api_authenticated
    async def post(self, alloc_id: str) -> None:
        ident = self.identity()
        body = self.json_body({"reason", "idle_seconds", "voluntary"})
        reason = body.get("reason", "idle")
        if not isinstance(reason, str) or not reason or len(reason) > 1000:
            raise RequestError(400, "field 'reason' must be a non-empty string (<= 1000 chars)")
        idle = body.get("idle_seconds", 0)
        if isinstance(idle, bool) or not isinstance(idle, int | float) or not 0 <= idle <= 1e9:
            raise RequestError(400, "field 'idle_seconds' must be a number from 0 to 1e9")
        voluntary = body.get("voluntary", False)
        if not isinstance(voluntary, bool):
            raise RequestError(400, "field 'voluntary' must be true or false")

        def record() -> tuple[dict[str, Any], dict[str, Any]]:
            alloc = self.held_allocation(ident, alloc_id)
            # (after the holder check: anyone else is told the slice is not theirs)
            if not self.service.hub_api.configured:
                raise RequestError(503, "the service has no hub API access to stop servers")
            # The server says how long it sat idle; it cannot have been idle for longer
            # than the slice has existed, and what the service counts is bounded by that.
            kind, detail = reclaim_record(alloc, idle, voluntary)
            # once per slice: a server that asks again (its first answer was lost, or the
            # stop did not happen) has the hub asked again, and the cull counted once
            event, _new = self.ledger.record_stop_request(
                kind, alloc["user"], ident.name, reason, detail
            )
            return alloc, event

        # reads and a write: in a worker thread (on SQLite the write may wait for the writer)
        alloc, event = await asyncio.to_thread(record)
        # Answer before stopping: the caller is usually the very server being stopped, and
        # its own reply to the browser must get out before the hub takes it down.
        self.write_json({"allocation_id": alloc["id"], "stopping": True, "event": event}, 202)
        try:
            await self.service.hub_api.stop_server(alloc["user"], alloc["server_name"])
        except JSONError as e:
            if e.status != 404:  # already gone: the slice is being released anyway
                await asyncio.to_thread(self._stop_failed, alloc, ident.name, str(e))

    def _stop_failed(self, alloc: dict[str, Any], actor: str, error: str) -> None:
        self.service.log.error("could not stop %s's server: %s", alloc["user"], error)
        self.ledger.record_event(
            "reclaim-failed",
            alloc["user"],
            actor,
            f"the hub did not stop the server: {error}",
            {"allocation_id": alloc["id"], "profile": alloc["profile"]},
        )
