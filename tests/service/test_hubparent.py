"""Which parent a managed service shares its life with (gpuslice_hub/hubparent.py); the
service stopping with a killed hub is tested against a real hub in tests/hub."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from gpuslice_hub.hubparent import hub_parent, is_jupyterhub_command
from tests.harness.hub import wait_for

SERVICE_ENV = {"JUPYTERHUB_SERVICE_NAME": "gpuslice"}


@pytest.mark.parametrize(
    ("argv", "hub"),
    [
        ([b"jupyterhub", b"-f", b"/etc/jupyterhub/jupyterhub_config.py"], True),
        ([b"/opt/venv/bin/python3", b"/opt/venv/bin/jupyterhub"], True),
        ([b"/usr/bin/python3", b"-m", b"jupyterhub", b"--debug"], True),
        ([b"python3", b"launch.py", b"-f", b"jupyterhub_config.py"], False),
        ([b"/usr/bin/sudo", b"-u", b"gpuslice", b"python3", b"-m", b"gpuslice_hub.app"], False),
        ([b"-m"], False),
        ([b"systemd"], False),
    ],
)
def test_a_jupyterhub_command_is_told_from_others(argv, hub):
    assert is_jupyterhub_command(argv) is hub


def _process(argv0: str) -> Iterator[int]:
    proc = subprocess.Popen(["bash", "-c", f"exec -a {argv0} sleep 60"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def a_hub() -> Iterator[int]:
    yield from _process("jupyterhub")


@pytest.fixture
def not_a_hub() -> Iterator[int]:
    yield from _process("supervisord")


def test_a_service_started_by_a_hub_watches_it(a_hub):
    # (the process's command line as /proc shows it, once bash has exec'd)
    def found() -> int | None:
        return hub_parent(a_hub, SERVICE_ENV)

    assert wait_for(found, 10, "the process to show its new name") == a_hub


def test_a_service_started_otherwise_is_left_alone(a_hub, not_a_hub):
    assert hub_parent(not_a_hub, SERVICE_ENV) is None  # by a supervisor, say
    assert hub_parent(1, SERVICE_ENV) is None  # orphaned already, or by init
    assert hub_parent(a_hub, {}) is None  # not as a hub service at all
    assert hub_parent(2**22 + 1, SERVICE_ENV) is None  # no such process
