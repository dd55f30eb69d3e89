"""Async client of the gpuslice service, for hub-side code (the spawner)."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest


class ServiceError(Exception):
    """The service refused or failed; ``message`` is meant for the researcher."""

    def __init__(self, status: int, message: str, detail: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.detail = detail or {}


class ServiceClient:
    def __init__(self, base_url: str, token: str, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/") + "/"
        self.token = token
        self.timeout = timeout

    async def request(
        self, method: str, path: str, body: Any = None, query: dict[str, str] | None = None
    ) -> Any:
        url = self.base_url + path.lstrip("/")
        if query:
            url += "?" + urlencode(query)
        req = HTTPRequest(
            url,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
            body=None if body is None else json.dumps(body),
            allow_nonstandard_methods=True,
            request_timeout=self.timeout,
        )
        try:
            resp = await AsyncHTTPClient().fetch(req)
        except HTTPClientError as e:
            detail: dict[str, Any] = {}
            message = f"gpuslice service answered {e.code}"
            if e.response is not None and e.response.body:
                try:
                    detail = json.loads(e.response.body)
                    message = detail.get("message", message)
                except ValueError:
                    pass
            raise ServiceError(e.code, message, detail) from None
        except OSError as e:
            raise ServiceError(
                503, f"the gpuslice service at {self.base_url} cannot be reached ({e})"
            ) from None
        return json.loads(resp.body) if resp.body else None

    async def profiles(self, user: str) -> dict[str, Any]:
        """``{"user", "simulated", "profiles": [...]}`` with live availability for ``user``."""
        return await self.request("GET", "api/profiles", query={"user": user})

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

    async def allocation(self, alloc_id: int) -> dict[str, Any]:
        return await self.request("GET", f"api/allocations/{alloc_id}")
