"""Calls from the single-user server to the gpuslice service, with the server's own token
(``access:services!service=gpuslice``): the idle policy, events, usage reports, and
reclaiming the slice."""

from __future__ import annotations

import contextlib
import json
from typing import Any
from urllib.parse import urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from .decisions import SERVICE_KIND, Decision
from .events import iso
from .policy import IdlePolicy


class ServiceError(RuntimeError):
    pass


class ServiceClient:
    def __init__(
        self, url: str, token: str, allocation_id: int | None, user: str, timeout: float = 15.0
    ) -> None:
        self.url = url.rstrip("/") + "/" if url else ""
        self.token = token
        self.allocation_id = allocation_id
        self.user = user
        self.timeout = timeout

    @property
    def configured(self) -> bool:
        return bool(self.url and self.token)

    async def _call(self, method: str, path: str, body: Any = None) -> Any:
        req = HTTPRequest(
            self.url + path,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
            body=None if body is None else json.dumps(body),
            request_timeout=self.timeout,
            follow_redirects=False,
        )
        try:
            resp = await AsyncHTTPClient().fetch(req)
        except HTTPClientError as e:
            message = str(e)
            if e.response is not None and e.response.body:
                with contextlib.suppress(ValueError, AttributeError):
                    message = json.loads(e.response.body).get("message", message)
            raise ServiceError(f"{method} {path}: {message}") from e
        except OSError as e:
            raise ServiceError(f"{method} {path}: {e}") from e
        return json.loads(resp.body) if resp.body else None

    async def idle_policy(self) -> IdlePolicy:
        query = {"allocation_id": self.allocation_id} if self.allocation_id else {}
        reply = await self._call("GET", "api/idle-policy?" + urlencode(query))
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
            raise ServiceError("this server has no gpuslice allocation to release")
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
            raise ServiceError("this server has no gpuslice allocation to report usage for")
        body = {
            "utilization": utilization,
            "memory_mib": memory_mib,
            "idle_seconds": idle_seconds,
            "interval_seconds": interval_seconds,
        }
        reply = await self._call("POST", f"api/allocations/{self.allocation_id}/usage", body)
        return dict(reply or {})
