"""Which hub a managed service shares its life with (gpuslice_hub/hubparent.py); the
service stopping with a killed hub is tested against a real hub in tests/hub."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
from collections.abc import Iterator

import pytest
from traitlets.config import Config

from gpuslice_hub import hubparent
from gpuslice_hub.hubconfig import configure_jupyterhub
from gpuslice_hub.hubparent import HUB_PID_ENV, hub_parent, is_jupyterhub_command
from tests.harness.hub import wait_for

SERVICE_ENV = {"JUPYTERHUB_SERVICE_NAME": "gpuslice"}


@pytest.mark.parametrize(
    ("argv", "hub"),
    [
        ([b"jupyterhub", b"-f", b"/etc/jupyterhub/jupyterhub_config.py"], True),
        ([b"/opt/venv/bin/python3", b"/opt/venv/bin/jupyterhub"], True),
        ([b"/usr/bin/python3", b"-m", b"jupyterhub", b"--debug"], True),
        ([b"python3", b"-m", b"jupyterhub.app", b"-f", b"c.py"], True),
        ([b"python3", b"launch.py", b"-f", b"jupyterhub_config.py"], False),
        ([b"/usr/bin/sudo", b"-u", b"gpuslice", b"python3", b"-m", b"gpuslice_hub.app"], False),
        ([b"-m"], False),
        ([b"systemd"], False),
    ],
)
def test_a_jupyterhub_command_is_told_from_others(argv, hub):
    assert is_jupyterhub_command(argv) is hub


def _process(argv0: str) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(["bash", "-c", f"exec -a {argv0} sleep 60"])
    try:
        # (the process's command line as /proc shows it, once bash has exec'd)
        wait_for(lambda: hubparent.is_hub(proc.pid) == (argv0 == "jupyterhub"), 10, "exec")
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def a_hub() -> Iterator[subprocess.Popen]:
    yield from _process("jupyterhub")


@pytest.fixture
def not_a_hub() -> Iterator[subprocess.Popen]:
    yield from _process("supervisord")


def test_the_hub_is_the_parent_when_it_is_a_jupyterhub_command(a_hub, not_a_hub):
    assert hub_parent(a_hub.pid, SERVICE_ENV) == a_hub.pid
    assert hub_parent(not_a_hub.pid, SERVICE_ENV) is None  # by a supervisor, say
    assert hub_parent(1, SERVICE_ENV) is None  # orphaned already, or by init
    assert hub_parent(a_hub.pid, {}) is None  # not as a hub service at all


def test_the_hub_the_config_ran_in_is_named_to_the_service(not_a_hub):
    c = Config()
    configure_jupyterhub(c, config_file="/etc/gpuslice/gpuslice_config.py", environment={"A": "1"})
    (service,) = c.JupyterHub.services
    # read by the hub process that starts the service: here, the test's own
    assert service["environment"] == {"A": "1", HUB_PID_ENV: str(os.getpid())}
    env = {**SERVICE_ENV, HUB_PID_ENV: "4242"}
    # whatever the parent is (a wrapper such as sudo): the hub named is watched
    assert hub_parent(not_a_hub.pid, env) == 4242


async def _stops(pid: int) -> bool:
    stopped = asyncio.Event()
    watch = asyncio.ensure_future(hubparent.watch_hub(pid, stopped.set, logging.getLogger("test")))
    try:
        await asyncio.wait_for(stopped.wait(), 5)
        return True
    finally:
        watch.cancel()


async def test_the_watch_stops_the_service_when_the_hub_goes(a_hub, monkeypatch):
    monkeypatch.setattr(hubparent, "CHECK_SECONDS", 0.05)
    stopped = asyncio.Event()
    watch = asyncio.ensure_future(
        hubparent.watch_hub(a_hub.pid, stopped.set, logging.getLogger("test"))
    )
    await asyncio.sleep(0.3)
    assert not stopped.is_set()  # the hub runs: nothing stops
    a_hub.kill()
    await asyncio.wait_for(stopped.wait(), 5)
    assert watch.done()


async def test_a_hub_gone_before_the_watch_began_stops_the_service_at_once(a_hub):
    a_hub.kill()
    a_hub.wait()
    assert await _stops(a_hub.pid)


async def test_a_hub_named_by_the_environment_is_followed_whatever_its_command(
    not_a_hub, monkeypatch
):
    """Found by a review: a hub started by a launcher the service does not recognise as
    ``jupyterhub`` (the config named it all the same) had the service stop at once, and
    JupyterHub restart it, again and again."""
    monkeypatch.setattr(hubparent, "CHECK_SECONDS", 0.05)
    stopped = asyncio.Event()
    watch = asyncio.ensure_future(
        hubparent.watch_hub(not_a_hub.pid, stopped.set, logging.getLogger("test"))
    )
    await asyncio.sleep(0.3)
    assert not stopped.is_set()
    not_a_hub.kill()
    await asyncio.wait_for(stopped.wait(), 5)
    assert watch.done()
