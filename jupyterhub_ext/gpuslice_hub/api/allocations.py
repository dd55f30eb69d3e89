"""Allocations: created by the hub-side spawner for a server it starts; listed, shown and
released by their owner (or an admin)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from gpuslice.jsonclient import JSONError

from ..errors import Refused
from .base import BaseHandler, Identity, RequestError, api_authenticated, id_page, int_arg

_SERVER_NAME = re.compile(r"^[^/?#\s]{0,255}$")
CREATE_FIELDS = {
    "profile",
    "server_name",
    "user",
    "groups",
    "purpose",
    "priority",
    "preemptible",
    "wait_seconds",
    "overcommit",
}


class AllocationsHandler(BaseHandler):
    # set when the caller hangs up before the answer (tornado notices while the handler awaits)
    caller_gone = False

    def on_connection_close(self) -> None:
        self.caller_gone = True
        super().on_connection_close()

    @api_authenticated
    async def get(self) -> None:
        ident = self.identity()
        user = self.listed_user(ident, "allocations")
        state = self.get_argument("state", "active")
        if state not in ("active", "all"):
            raise RequestError(400, "query argument state must be 'active' or 'all'")
        limit = int_arg(self, "limit", 500, 1, 5000)
        before = int_arg(self, "before", 0, 0, 2**62) or None
        await self.write_computed(
            lambda: id_page(
                self.ledger.allocations(
                    user=user,
                    active_only=state == "active",
                    limit=limit + 1,
                    before_id=before,
                    servers=None if ident.sees_all else ident.servers,
                ),
                limit,
                "allocations",
            )
        )

    @api_authenticated
    async def post(self) -> None:
        ident = self.identity()
        body = self.json_body(CREATE_FIELDS)
        profile = body.get("profile")
        if not isinstance(profile, str) or not profile:
            raise RequestError(400, "field 'profile' (a profile name) is required")
        server_name = body.get("server_name", "")
        if not isinstance(server_name, str) or not _SERVER_NAME.match(server_name):
            raise RequestError(
                400, f"field 'server_name' is not a valid server name: {server_name!r}"
            )
        if not ident.is_trusted:
            # A slice is held by a server the hub started, or by a job the scheduler placed;
            # one taken through the API directly would be held by nothing that frees it.
            raise RequestError(
                403,
                "allocations are made by the hub when it starts a server: start a server "
                "from the hub, or submit a batch job",
            )
        purpose = body.get("purpose", "interactive")
        if purpose != "interactive":
            raise RequestError(
                400, "field 'purpose' must be 'interactive': batch slices are the scheduler's"
            )
        priority = body.get("priority", 0)
        if (
            isinstance(priority, bool)
            or not isinstance(priority, int)
            or not -1000 <= priority <= 1000
        ):
            raise RequestError(400, "field 'priority' must be an integer between -1000 and 1000")
        preemptible = body.get("preemptible", False)
        if not isinstance(preemptible, bool):
            raise RequestError(400, "field 'preemptible' must be true or false")
        wait = body.get("wait_seconds")
        if wait is not None and (
            isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait <= 86400
        ):
            raise RequestError(400, "field 'wait_seconds' must be a number of seconds, 0 to 86400")
        overcommit = body.get("overcommit", True)
        if not isinstance(overcommit, bool):
            raise RequestError(400, "field 'overcommit' must be true or false")
        caller = await self.resolve_caller(ident, body, "allocate")
        # On the loop when the ledger call is known to be short, else in a worker thread:
        # placement at hundreds of hosts must not stall the event loop (db/short_writes.py).
        try:
            alloc, created = await self.service.short_writes.run(
                "allocate",
                self.ledger.try_allocate,
                caller,
                profile,
                server_name,
                purpose,
                priority,
                preemptible,
                overcommit=overcommit,
            )
        except Refused as refused:
            # Making room (a preemption asked of the job engine) may wait on the engine:
            # never on the loop.
            await asyncio.to_thread(
                self.ledger.after_refusal,
                refused,
                caller,
                profile,
                server_name,
                wait,
                False,
                purpose,
                overcommit,
            )
        if self.caller_gone and created:
            # The spawner stopped waiting (its timeout, or the connection dropped): nobody
            # will start a server on this slice or release it. Give it back now rather than
            # leave it to the reconciler's grace, blocking the owner's next spawn meanwhile.
            await self.service.short_writes.run(
                "release",
                self.ledger.release,
                alloc["id"],
                ident.name,
                "the hub stopped waiting for this slice before it was granted",
            )
            return
        # What the single-user server needs to apply its idle policy and label the GPUs.
        alloc["idle_timeout"] = self.service.parsed_profiles[profile].idle_timeout
        # the name the spawn form showed, for the lab's status bar
        alloc["display_name"] = self.service.parsed_profiles[profile].display_name
        alloc["simulated"] = bool(self.service.inventory and self.service.inventory.simulated)
        self.write_json(alloc, 201 if created else 200)


class AllocationHandler(BaseHandler):
    @api_authenticated
    async def get(self, alloc_id: str) -> None:
        ident = self.identity()
        await self.write_computed(lambda: self.visible_allocation(ident, alloc_id))

    @api_authenticated
    async def delete(self, alloc_id: str) -> None:
        ident = self.identity()
        reason = self.get_argument("reason", "released by " + ident.name)[:255]
        aid = self.db_id(alloc_id, "allocation")
        if not ident.is_trusted:
            # The hub's spawner releases the slice of a server it stopped, the scheduler a
            # job's. The owner or an admin may only let go of a slice whose holder is gone
            # (a server that failed to release it): one released while its server or job
            # runs would be handed to someone else while still in use, past every quota.
            alloc = await asyncio.to_thread(self.visible_allocation, ident, aid)
            if alloc["state"] == "active":
                await self._holder_gone(ident, alloc)
        # as allocate: on the loop when known to be short, else in a worker thread
        alloc, released = await self.service.short_writes.run(
            "release",
            self.ledger.release,
            aid,
            ident.name,
            reason,
            owner=None if ident.sees_all else ident.name,
            # the hub's spawner releases after a stop, which may be one the service asked for
            server_stopped=ident.is_trusted,
        )
        self.write_json({**alloc, "released_now": released})

    async def _holder_gone(self, ident: Identity, alloc: dict[str, Any]) -> None:
        """Refused (409) while the allocation's server or job exists; 503 when the hub cannot
        say. An engine's hold (``external``) is refused by the ledger itself."""
        aid = alloc["id"]
        if alloc["purpose"] == "batch":
            raise RequestError(
                409,
                f"allocation {aid} is held by a batch job ({alloc['server_name']}): cancel "
                "the job, and its slice is released when it stops",
            )
        if alloc["purpose"] != "interactive":
            return
        whose = f"{alloc['user']}'s server" + (
            f" {alloc['server_name']!r}" if alloc["server_name"] else ""
        )
        hub = self.service.hub_api
        if not hub.configured:
            raise RequestError(
                503, f"the service cannot ask the hub whether {whose} is running: nothing released"
            )
        try:
            running = await hub.server_exists(alloc["user"], alloc["server_name"])
        except JSONError as e:
            # (the hub's error names its internal address: the log has it, the caller not)
            self.service.log.warning("asking the hub whether %s is running: %s", whose, e)
            raise RequestError(
                503,
                f"could not ask the hub whether {whose} is running (status {e.status}): "
                "nothing released; try again shortly",
            ) from None
        if running:
            how = (
                "stop it from the hub's admin page"
                if ident.sees_all
                else "stop the server (the hub's home page, or Save and release GPU in JupyterLab)"
            )
            raise RequestError(
                409,
                f"allocation {aid} is held by {whose}, which is running: {how}, and its "
                "slice is released when it stops",
            )
