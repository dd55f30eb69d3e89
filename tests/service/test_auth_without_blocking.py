"""The service checks a request's hub token without blocking its event loop.

JupyterHub's ``current_user`` calls ``HubAuth.get_user`` synchronously, which runs the check
on a thread of its own and holds the event loop until it is done (on a cache miss, a round
trip to the hub's API). The API's handlers await it instead (``BaseHandler.resolve_user``).
Checked on a real tornado server with a stand-in HubAuth whose synchronous path fails the
request, and whose asynchronous one answers only after another request was served
meanwhile: a token check in flight must not hold up the loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from gpuslice_hub.api.base import BaseHandler, api_authenticated
from gpuslice_hub.api.pages import PageHandler

MODELS = {
    "t-ann": {"kind": "user", "name": "ann", "scopes": ["access:services"], "groups": []},
    "t-bob": {"kind": "user", "name": "bob", "scopes": [], "groups": []},  # no access
}


class StandInHubAuth:
    """What the handlers use of JupyterHub's HubAuth; the hub's answer for ``t-ann`` waits
    until a request to ``/ping`` was served (the loop went on meanwhile)."""

    access_scopes = {"access:services"}
    login_url = "/hub/login"

    def __init__(self) -> None:
        self.pinged: asyncio.Event | None = None
        self.blocking_calls = 0

    def get_user(self, handler: Any, *, sync: bool = True) -> Any:
        if sync:
            self.blocking_calls += 1
            raise AssertionError("the token was checked on the event loop, blocking it")
        return self._user(handler)

    async def _user(self, handler: Any) -> dict[str, Any] | None:
        token = handler.request.headers.get("Authorization", "").removeprefix("token ")
        if token == "t-ann":
            assert self.pinged is not None
            await asyncio.wait_for(self.pinged.wait(), 10)
        model = MODELS.get(token)
        return dict(model) if model else None

    def check_scopes(self, required: set[str], model: dict[str, Any]) -> set[str]:
        return required & set(model.get("scopes") or ())

    def _persist_url_token_if_set(self, handler: Any) -> None:
        pass


AUTH = StandInHubAuth()


class Probe(BaseHandler):
    hub_auth = AUTH  # type: ignore[assignment]

    @api_authenticated
    async def get(self) -> None:
        self.finish({"name": self.current_user["name"], "kind": self.current_user["kind"]})


class PageProbe(PageHandler):
    """A service page: logged in through the hub's cookie or token, else sent to log in."""

    hub_auth = AUTH  # type: ignore[assignment]

    @web.authenticated
    async def get(self) -> None:
        self.finish({"name": self.current_user["name"], "page": True})


class Ping(web.RequestHandler):
    def get(self) -> None:
        assert AUTH.pinged is not None
        AUTH.pinged.set()
        self.finish("pong")


@pytest.fixture
def server() -> Iterator[str]:
    sockets = bind_sockets(0, "127.0.0.1")
    port = sockets[0].getsockname()[1]
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        AUTH.pinged = asyncio.Event()
        app = web.Application([(r"/probe", Probe), (r"/page", PageProbe), (r"/ping", Ping)])
        HTTPServer(app).add_sockets(sockets)
        loop.call_soon(ready.set)
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ready.wait(10)
    yield f"http://127.0.0.1:{port}"
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


@pytest.mark.parametrize("path", ["/probe", "/page"])
def test_a_token_check_in_flight_does_not_hold_up_other_requests(server: str, path: str):
    """An API route and a page (the overview, the admin panel) alike."""
    answers: dict[str, Any] = {}

    def probe() -> None:
        answers["probe"] = requests.get(
            f"{server}{path}", headers={"Authorization": "token t-ann"}, timeout=15
        )

    asking = threading.Thread(target=probe)
    asking.start()
    # the check of ann's token waits for this request: served only if the loop is free
    assert requests.get(f"{server}/ping", timeout=15).text == "pong"
    asking.join(15)
    r = answers["probe"]
    assert r.status_code == 200, r.text
    assert r.json()["name"] == "ann"
    assert AUTH.blocking_calls == 0


def test_a_page_without_a_good_token_sends_to_the_hub_login(server: str):
    for headers in ({}, {"Authorization": "token nope"}):
        r = requests.get(f"{server}/page", headers=headers, allow_redirects=False, timeout=15)
        assert r.status_code == 302, (headers, r.text)
        assert r.headers["Location"].startswith("/hub/login?next="), r.headers
    assert AUTH.blocking_calls == 0


def test_a_page_for_a_user_without_the_scope_is_refused_not_sent_to_log_in_again(server: str):
    """Sending a logged-in user without the scope to the login would loop: the hub logs
    them in at once and sends them back."""
    r = requests.get(
        f"{server}/page",
        headers={"Authorization": "token t-bob"},
        allow_redirects=False,
        timeout=15,
    )
    assert r.status_code == 403, r.text
    assert "bob is not allowed" in r.text
    assert AUTH.blocking_calls == 0


def test_no_token_or_one_without_the_scope_gets_a_json_403(server: str):
    for headers in ({}, {"Authorization": "token t-bob"}, {"Authorization": "token nope"}):
        r = requests.get(f"{server}/probe", headers=headers, timeout=15)
        assert r.status_code == 403, (headers, r.text)
        assert "authentication required" in r.json()["message"]
    assert AUTH.blocking_calls == 0
