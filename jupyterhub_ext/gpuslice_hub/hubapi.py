"""The few JupyterHub REST calls the service makes with its own token."""

from __future__ import annotations

import json
import os
from typing import Any
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest


class HubAPI:
    def __init__(self, api_url: str | None = None, token: str | None = None) -> None:
        self.api_url = (api_url or os.environ.get("JUPYTERHUB_API_URL", "")).rstrip("/")
        self.token = token or os.environ.get("JUPYTERHUB_API_TOKEN", "")

    @property
    def configured(self) -> bool:
        return bool(self.api_url and self.token)

    async def _request(self, method: str, path: str, body: Any = None) -> Any:
        req = HTTPRequest(
            self.api_url + path,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
            body=None if body is None else json.dumps(body),
            allow_nonstandard_methods=True,
            request_timeout=30,
        )
        resp = await AsyncHTTPClient().fetch(req)
        return json.loads(resp.body) if resp.body else None

    async def existing_servers(self) -> set[tuple[str, str]]:
        """(user, server name) of every server that is running or starting."""
        existing: set[tuple[str, str]] = set()
        offset = 0
        while True:
            users = await self._request(
                "GET", f"/users?include_stopped_servers=0&offset={offset}&limit=200"
            )
            if isinstance(users, dict):  # paginated reply (Accept: jupyterhub-pagination)
                users = users.get("items", [])
            for user in users:
                for name, server in (user.get("servers") or {}).items():
                    if server.get("ready") or server.get("pending") or server.get("started"):
                        existing.add((user["name"], name))
            if len(users) < 200:
                return existing
            offset += len(users)

    async def user_groups(self, name: str) -> tuple[str, ...] | None:
        try:
            user = await self._request("GET", f"/users/{quote(name, safe='')}")
        except HTTPClientError as e:
            if e.code == 404:
                return None
            raise
        return tuple(user.get("groups") or ())

    async def group_exists(self, name: str) -> bool:
        try:
            await self._request("GET", f"/groups/{quote(name, safe='')}")
        except HTTPClientError as e:
            if e.code == 404:
                return False
            raise
        return True

    async def stop_server(self, user: str, server_name: str) -> None:
        path = f"/users/{quote(user, safe='')}/server"
        if server_name:
            path = f"/users/{quote(user, safe='')}/servers/{quote(server_name, safe='')}"
        await self._request("DELETE", path)
