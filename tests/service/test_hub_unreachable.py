"""A request the service cannot complete because its own call to the hub's API failed
(the hub restarting, say): the caller gets a JSON 503/502 that says so, not a bare 500, and
not the hub's internal address. (Found by an attack: an allocation made without stating
the user's groups, while the hub was killed, got a 500.)"""

from __future__ import annotations

import logging
import socket
from types import SimpleNamespace

import pytest
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from tornado.httpserver import HTTPServer

from gpuslice.jsonclient import JSONError
from gpuslice_hub.api.base import BaseHandler
from gpuslice_hub.hubapi import HubAPI


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


HUB = f"http://127.0.0.1:{free_port()}/hub/api"  # nobody listens there


class LooksUpGroups(BaseHandler):
    async def get(self) -> None:
        # what resolve_caller does for a request that states no groups
        await HubAPI(HUB, "token").user_groups("ann")


class HubRefuses(BaseHandler):
    async def get(self) -> None:
        raise JSONError(403, "the hub answered 403: missing scope read:users:groups")


@pytest.fixture
async def service_url():
    port = free_port()
    service = SimpleNamespace(log=logging.getLogger("test.gpuslice"))
    app = web.Application([("/groups", LooksUpGroups), ("/refused", HubRefuses)], gpuslice=service)
    http = HTTPServer(app)
    http.listen(port, "127.0.0.1")
    yield f"http://127.0.0.1:{port}"
    http.stop()


async def _answer(url: str) -> tuple[int, str]:
    with pytest.raises(HTTPClientError) as e:
        await AsyncHTTPClient().fetch(url)
    assert e.value.response is not None
    assert e.value.response.headers["Content-Type"] == "application/json"
    return e.value.code, e.value.response.body.decode()


async def test_a_hub_that_does_not_answer_is_a_503_that_says_so(service_url, caplog):
    code, body = await _answer(f"{service_url}/groups")
    assert code == 503
    assert "the hub did not answer the gpuslice service; try again in a moment" in body
    assert HUB not in body  # its address is in the log, for the admin
    assert HUB in caplog.text


async def test_a_hub_that_refuses_the_service_is_a_502_naming_its_answer(service_url):
    code, body = await _answer(f"{service_url}/refused")
    assert code == 502
    assert "the hub refused a request of the gpuslice service" in body
    assert "missing scope read:users:groups" in body
