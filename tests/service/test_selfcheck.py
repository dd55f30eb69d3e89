"""The service says, at start, which of the hub scopes it needs its token lacks."""

from __future__ import annotations

import logging

import pytest

from gpuslice_hub.scopes import SERVICE_SCOPES
from gpuslice_hub.selfcheck import check_own_scopes, missing_scopes

NEEDED = [s.format(name="gpuslice") for s in SERVICE_SCOPES]


class Hub:
    def __init__(self, scopes: list[str]) -> None:
        self.scopes = scopes

    async def whoami(self) -> dict:
        return {"kind": "service", "name": "gpuslice", "scopes": self.scopes}


def test_missing_scopes_keep_the_order_they_are_needed_in():
    granted = [s for s in NEEDED if s not in ("servers", "list:users")] + ["read:hub"]
    assert missing_scopes(granted, NEEDED) == ["list:users", "servers"]
    assert missing_scopes(NEEDED, NEEDED) == []


async def test_a_dropped_role_is_said_at_start(caplog: pytest.LogCaptureFixture):
    log = logging.getLogger("gpuslice.test")
    with caplog.at_level(logging.WARNING, "gpuslice.test"):
        assert await check_own_scopes(Hub(["read:hub"]), NEEDED, log) == NEEDED  # type: ignore[arg-type]
    assert "configure_jupyterhub's role for it was dropped" in caplog.text
    assert "servers" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, "gpuslice.test"):
        assert await check_own_scopes(Hub(NEEDED), NEEDED, log) == []  # type: ignore[arg-type]
    assert caplog.text == ""
