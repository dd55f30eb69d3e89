"""The test hub: its service checks its lean statements as the suite does, except where a
benchmark asks it to run as a site runs it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.hub import start_hub

pytestmark = pytest.mark.hub


@pytest.mark.parametrize("check", [True, False])
def test_the_service_checks_its_statements_unless_a_benchmark_measures_it(
    tmp_path: Path, check: bool
):
    hub = start_hub(tmp_path / "hub", lean_check=check)
    try:
        environ = Path(f"/proc/{hub.service_pid()}/environ").read_bytes().split(b"\0")
        assert (b"GPUSLICE_LEAN_CHECK=1" in environ) is check
        # and it serves either way
        assert hub.api("GET", "/api/profiles", hub.service_token).status_code == 200
    finally:
        hub.stop()
