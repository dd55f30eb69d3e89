"""The one JSON client: its errors, and retries only where they are safe (real HTTP
servers on localhost)."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from tornado import web
from tornado.httpserver import HTTPServer

from gpuslice.jsonclient import JSONClient, JSONError


class Flaky(web.RequestHandler):
    """Answers 503 to the first ``fail`` requests of each method, then 200."""

    calls: dict[str, int] = {}
    fail = 2

    def _answer(self) -> None:
        n = Flaky.calls[self.request.method] = Flaky.calls.get(self.request.method, 0) + 1
        if n <= Flaky.fail:
            self.set_status(503)
            self.finish(json.dumps({"message": "restarting"}))
        else:
            self.finish(json.dumps({"ok": n, "body": self.request.body.decode() or None}))

    def get(self) -> None:
        self._answer()

    def post(self) -> None:
        self._answer()


class Refuse(web.RequestHandler):
    def get(self) -> None:
        self.set_status(409)
        self.finish(json.dumps({"message": "No share-250 free", "code": "no_capacity"}))


class Hang(web.RequestHandler):
    async def get(self) -> None:
        await asyncio.sleep(5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def server():  # async: it must serve on the test's own event loop
    Flaky.calls = {}
    port = free_port()
    app = web.Application([("/flaky", Flaky), ("/refuse", Refuse), ("/hang", Hang)])
    http = HTTPServer(app)
    http.listen(port, "127.0.0.1")
    yield f"http://127.0.0.1:{port}/"
    http.stop()


async def test_a_get_is_retried_through_a_restart_and_a_post_is_sent_once(server):
    client = JSONClient(server, "t", retry_delay=0.01)
    assert (await client.request("GET", "flaky"))["ok"] == 3
    with pytest.raises(JSONError) as e:
        await client.request("POST", "flaky", {"a": 1})
    assert e.value.status == 503 and e.value.message == "restarting"
    assert Flaky.calls == {"GET": 3, "POST": 1}


async def test_a_refusal_keeps_its_status_message_and_fields(server):
    with pytest.raises(JSONError) as e:
        await JSONClient(server, "t").request("GET", "refuse")
    assert (e.value.status, e.value.message) == (409, "No share-250 free")
    assert e.value.detail["code"] == "no_capacity"
    assert Flaky.calls == {}  # a refusal is not retried


async def test_a_timeout_is_504_and_not_retried(server):
    client = JSONClient(server, "t", timeout=0.3, retry_delay=0.01)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(JSONError) as e:
        await client.request("GET", "hang")
    assert e.value.status == 504 and "did not answer within 0.3 s" in e.value.message
    assert loop.time() - start < 1.5


async def test_nobody_listening_is_503_naming_the_other_side():
    client = JSONClient(f"http://127.0.0.1:{free_port()}/", "t", what="the hub", retry_delay=0.01)
    with pytest.raises(JSONError) as e:
        await client.request("GET", "users")
    assert e.value.status == 503 and e.value.message.startswith("the hub at http://127.0.0.1:")
