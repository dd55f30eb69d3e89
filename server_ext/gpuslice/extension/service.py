"""Calls from the single-user server to the gpuslice service, with the server's own token
(``access:services!service=gpuslice``): the idle policy, events, usage reports, and
reclaiming the slice."""

from __future__ import annotations

from typing import Any

from ..idle_policy import IdlePolicy
from ..isotime import iso
from ..jsonclient import JSONClient, JSONError
from .decisions import SERVICE_KIND, Decision


class ServiceError(JSONError):
    """A call to the service that did not succeed; the message says which call and why."""


class ServiceClient:
    def __init__(
        self, url: str, token: str, allocation_id: int | None, user: str, timeout: float = 15.0
    ) -> None:
        self.http = JSONClient(url, token, timeout)
        self.allocation_id = allocation_id
        self.user = user

    @property
    def configured(self) -> bool:
        return self.http.configured

    async def _call(self, method: str, path: str, body: Any = None, **query: Any) -> Any:
        try:
            return await self.http.request(method, path, body, query or None)
        except JSONError as e:
            raise ServiceError(e.status, f"{method} {path}: {e.message}", e.detail) from e

    async def idle_policy(self) -> IdlePolicy:
        query = {"allocation_id": self.allocation_id} if self.allocation_id else {}
        reply = await self._call("GET", "api/idle-policy", **query)
        return IdlePolicy.from_json(reply.get("policy", reply))

    async def report(self, decision: Decision, detail: dict[str, Any]) -> None:
        body: dict[str, Any] = {
            "kind": SERVICE_KIND[decision.action],
            "reason": decision.reason,
            "detail": {
                **detail,
                "allocation_id": self.allocation_id,
                "kernel_id": decision.kernel_id,
                "deadline": iso(decision.deadline),
                "idle_seconds": decision.idle_seconds,
                "scope": "server" if decision.kernel_id is None else "kernel",
            },
        }
        if decision.memory_bytes is not None:
            body["detail"]["memory_mib"] = decision.memory_bytes // (1024 * 1024)
        await self._call("POST", "api/events", body)

    async def reclaim(
        self, reason: str, idle_seconds: float | None = None, voluntary: bool = False
    ) -> dict[str, Any]:
        if not self.allocation_id:
            raise ServiceError(409, "this server has no gpuslice allocation to release")
        body: dict[str, Any] = {"reason": reason, "voluntary": voluntary}
        if idle_seconds is not None:
            body["idle_seconds"] = idle_seconds
        reply = await self._call("POST", f"api/allocations/{self.allocation_id}/reclaim", body)
        return dict(reply or {})

    async def usage(
        self,
        utilization: float | None,
        memory_mib: float | None,
        idle_seconds: float,
        interval_seconds: float,
    ) -> dict[str, Any]:
        """One usage report for the admin panel's utilization-against-allocation view."""
        if not self.allocation_id:
            raise ServiceError(409, "this server has no gpuslice allocation to report usage for")
        body = {
            "utilization": utilization,
            "memory_mib": memory_mib,
            "idle_seconds": idle_seconds,
            "interval_seconds": interval_seconds,
        }
        reply = await self._call("POST", f"api/allocations/{self.allocation_id}/usage", body)
        return dict(reply or {})
