"""Async client of the gpuslice service, for hub-side code (the spawner)."""

from __future__ import annotations

from typing import Any

from gpuslice.jsonclient import JSONClient, JSONError

# The service refused or failed; ``message`` is meant for the researcher.
ServiceError = JSONError


class ServiceClient(JSONClient):
    """The gpuslice service, called with its own token (the spawner allocates for users)."""

    async def profiles(
        self, user: str, overcommit: bool = True, wait_seconds: float | None = None
    ) -> dict[str, Any]:
        """``{"user", "simulated", "profiles": [...]}`` with live availability for ``user``
        (``overcommit=False``: counted as allocations that are never overcommitted;
        ``wait_seconds``: how long a spawn waits for a batch job to give a slice up)."""
        query = {"user": user}
        if not overcommit:
            query["overcommit"] = "false"
        if wait_seconds is not None:
            query["wait_seconds"] = f"{wait_seconds:g}"
        return await self.request("GET", "api/profiles", query=query)

    async def allocate(self, **body: Any) -> dict[str, Any]:
        return await self.request("POST", "api/allocations", body)

    async def release(self, alloc_id: int, reason: str) -> dict[str, Any] | None:
        try:
            return await self.request(
                "DELETE", f"api/allocations/{alloc_id}", query={"reason": reason}
            )
        except ServiceError as e:
            if e.status == 404:  # already gone from the ledger: nothing to release
                return None
            raise

    async def server_allocations(self, user: str, server_name: str) -> list[dict[str, Any]]:
        """The active slices the ledger has for one of ``user``'s servers."""
        reply = await self.request("GET", "api/allocations", query={"user": user})
        return [
            a
            for a in reply.get("allocations", [])
            if a.get("purpose") == "interactive" and a.get("server_name") == server_name
        ]

    async def allocation(self, alloc_id: int) -> dict[str, Any]:
        return await self.request("GET", f"api/allocations/{alloc_id}")
