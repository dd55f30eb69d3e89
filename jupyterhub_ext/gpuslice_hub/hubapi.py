"""The few JupyterHub REST calls the service makes with its own token."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import quote

from gpuslice.errors import GPUSliceError
from gpuslice.jsonclient import JSONClient, JSONError

PAGINATED = "application/jupyterhub-pagination+json"
# What we ask for per page; the hub cuts it to its own api_page_max_limit.
PAGE = 200


class IncompleteListing(GPUSliceError):
    """The hub's answer could not be read to its end: nothing may be concluded from it."""


# What the hub says of one server (HubAPI.server_status)
RUNNING = "running"  # running, or starting, stopping, being checked: it has its slice
STOPPED = "stopped"  # the hub has the user, and the server is none of those
NO_USER = "no user"  # the hub has no such user
UNKNOWN = "unknown"  # the hub's answer has no servers (the token cannot read them)


def _active(server: dict[str, Any]) -> bool:
    return bool(server.get("ready") or server.get("pending") or server.get("started"))


class HubAPI:
    """Errors are ``JSONError`` (the hub's status; 503 when it cannot be reached)."""

    def __init__(self, api_url: str | None = None, token: str | None = None) -> None:
        self.api_url = (api_url or os.environ.get("JUPYTERHUB_API_URL", "")).rstrip("/")
        self.http = JSONClient(
            self.api_url, token or os.environ.get("JUPYTERHUB_API_TOKEN", ""), what="the hub"
        )

    @property
    def configured(self) -> bool:
        return self.http.configured

    async def _request(
        self, method: str, path: str, body: Any = None, accept: str = "application/json"
    ) -> Any:
        return await self.http.request(method, path, body, accept=accept)

    async def existing_servers(self) -> set[tuple[str, str]]:
        """(user, server name) of every server that is running or starting.

        Walks JupyterHub's paginated listing of the users with an active server, page by
        page as the hub cuts them (its ``api_page_max_limit`` decides, not us), following
        ``next`` to the end. Raises :class:`IncompleteListing` rather than return part of
        the answer: a server missing from it would have its slice given away.
        """
        existing: set[tuple[str, str]] = set()
        offset, limit = 0, PAGE
        while True:
            page = await self._request(
                "GET", f"/users?state=active&offset={offset}&limit={limit}", accept=PAGINATED
            )
            if not isinstance(page, dict) or not isinstance(page.get("items"), list):
                raise IncompleteListing("the hub answered the user list without pagination")
            for user in page["items"]:
                for name, server in (user.get("servers") or {}).items():
                    if _active(server):
                        existing.add((user["name"], name))
            following = (page.get("_pagination") or {}).get("next")
            if not following:
                return existing
            if int(following["offset"]) <= offset:
                raise IncompleteListing(f"the hub's next page goes back to {following}")
            offset, limit = int(following["offset"]), int(following["limit"])

    async def server_exists(self, user: str, server_name: str) -> bool:
        """Whether the hub has ``user``'s server ``server_name`` running or starting, asked
        about that one user (a paged listing can miss a user who moved between pages)."""
        return await self.server_status(user, server_name) == RUNNING

    async def server_status(self, user: str, server_name: str) -> str:
        """What the hub says of ``user``'s server ``server_name``, asked about that one user:
        RUNNING (ready, or pending a spawn, a stop or the hub's check), STOPPED (the hub has
        the user and its model of them lists no such server: the hub lists every server it
        has that is any of those, a spawn from before its spawner asks for a slice), NO_USER
        or UNKNOWN (a model without servers: nothing can be concluded from it)."""
        model = await self._user(user)
        if model is None:
            return NO_USER
        servers = model.get("servers")
        if not isinstance(servers, dict):
            return UNKNOWN
        server = servers.get(server_name)
        return RUNNING if isinstance(server, dict) and _active(server) else STOPPED

    async def whoami(self) -> dict[str, Any]:
        """The hub's model of this token's owner (the service), with its ``scopes``."""
        return dict(await self._request("GET", "/user") or {})

    async def user_groups(self, name: str) -> tuple[str, ...] | None:
        model = await self._user(name)
        return None if model is None else tuple(model.get("groups") or ())

    async def _user(self, name: str) -> dict[str, Any] | None:
        """The hub's model of user ``name`` (active servers only), None if there is none."""
        try:
            return await self._request("GET", f"/users/{quote(name, safe='')}")
        except JSONError as e:
            if e.status == 404:
                return None
            raise

    async def group_exists(self, name: str) -> bool:
        try:
            await self._request("GET", f"/groups/{quote(name, safe='')}")
        except JSONError as e:
            if e.status == 404:
                return False
            raise
        return True

    async def stop_server(self, user: str, server_name: str) -> None:
        path = f"/users/{quote(user, safe='')}/server"
        if server_name:
            path = f"/users/{quote(user, safe='')}/servers/{quote(server_name, safe='')}"
        await self._request("DELETE", path)
