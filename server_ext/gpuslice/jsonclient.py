"""The one JSON-over-HTTP client of gpuslice: the spawner and the service calling the hub's
REST API, the spawner calling the service, the single-user server calling the service (idle
reports, usage, its jobs). A token, JSON in and out, one error type with the status and the
answer's own message, and retries where they are safe.

Retries: a GET or a DELETE (idempotent) that found nobody listening or got 502/503 (a
restarting service, a proxy in front of one) is tried again after 0.5 s, then 1 s. One that
timed out is not: a service that hangs would make every caller wait three times as long. A
POST is sent once: whether it took effect is the caller's to find out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any
from urllib.parse import urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.simple_httpclient import HTTPTimeoutError

from .errors import GPUSliceError

RETRY_STATUSES = frozenset({502, 503})
IDEMPOTENT = frozenset({"GET", "HEAD", "DELETE"})


class JSONError(GPUSliceError):
    """A call that did not succeed: ``status`` is the HTTP status (503 when nothing
    answered, 504 when the answer did not come in time), ``message`` the answer's own
    ``message`` where it had one, ``detail`` the rest of its JSON body."""

    def __init__(self, status: int, message: str, detail: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.detail = detail or {}


class JSONClient:
    def __init__(
        self,
        base_url: str,
        token: str,
        timeout: float = 30.0,
        what: str = "the gpuslice service",
        retries: int = 2,
        retry_delay: float = 0.5,
    ) -> None:
        self.base_url = base_url.rstrip("/") + "/" if base_url else ""
        self.token = token
        self.timeout = timeout
        self.what = what  # how errors name the other side
        self.retries = retries
        self.retry_delay = retry_delay

    @property
    def configured(self) -> bool:
        return bool(self.base_url and self.token)

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        raw: bool = False,
        accept: str = "application/json",
    ) -> Any:
        """The answer's JSON (None for an empty body; bytes with ``raw``); raises JSONError.
        ``accept``: a JSON media type of the server's own (JupyterHub's paginated lists)."""
        url = self.base_url + path.lstrip("/")
        if query:
            url += ("&" if "?" in url else "?") + urlencode(query)
        attempts = 1 + (self.retries if method in IDEMPOTENT else 0)
        for attempt in range(attempts):
            try:
                resp = await AsyncHTTPClient().fetch(self._request(method, url, body, accept))
            except HTTPClientError as e:
                error = self._error(e)
            except OSError as e:
                error = JSONError(503, f"{self.what} at {self.base_url} cannot be reached ({e})")
            else:
                if raw:
                    return resp.body
                return json.loads(resp.body) if resp.body else None
            if error.status not in RETRY_STATUSES or attempt == attempts - 1:
                raise error
            await asyncio.sleep(self.retry_delay * 2**attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _request(self, method: str, url: str, body: Any, accept: str) -> HTTPRequest:
        return HTTPRequest(
            url,
            method=method,
            headers={
                "Authorization": f"token {self.token}",
                "Content-Type": "application/json",
                "Accept": accept,
            },
            body=None if body is None else json.dumps(body),
            allow_nonstandard_methods=True,
            follow_redirects=False,
            request_timeout=self.timeout,
        )

    def _error(self, e: HTTPClientError) -> JSONError:
        # curl_httpclient (JupyterHub uses it where pycurl is installed) says "Timeout"
        if isinstance(e, HTTPTimeoutError) or (e.code == 599 and "timeout" in str(e).lower()):
            return JSONError(504, f"{self.what} did not answer within {self.timeout:g} s")
        if e.code == 599:  # tornado's code for no answer at all: the connection closed
            return JSONError(503, f"{self.what} closed the connection without answering")
        message = f"{self.what} answered {e.code}"
        detail: dict[str, Any] = {}
        if e.response is not None and e.response.body:
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                parsed = json.loads(e.response.body)
                if isinstance(parsed, dict):
                    detail = parsed
                    message = str(parsed.get("message") or message)
        return JSONError(e.code, message, detail)
