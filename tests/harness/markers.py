"""Every test that starts a real part carries that part's marker, so that ``-m`` selects
truly (``make test-fast`` runs the tests that start none of them).

Markers come from two places. At collection, from the fixtures a test uses (its whole
closure: a fixture that needs ``slurm_cluster`` makes its tests ``slurm`` ones) and from
the folders and files whose every test needs a part (``BY_PATH``). While a test runs, from
the harness itself: ``start_hub``, the Slurm and PostgreSQL starters and the Chromium launchers call
:func:`require`, which fails a test that starts the part without its marker (a module's
hub fixture calling ``start_hub`` directly is found there, not at collection)."""

from __future__ import annotations

from pathlib import Path

import pytest

# marker -> the harness fixtures whose use means the test needs that part
BY_FIXTURE = {
    "hub": ("hub_factory", "hub"),
    "slurm": ("slurm_cluster", "slurm_nodes_cluster", "slurm_burst_cluster"),
    "postgres": ("postgres_server",),
}
# marker -> the folders and files (under tests/) whose every test needs that part
BY_PATH = {
    "browser": ("browser/",),
    "hub": ("browser/", "e2e_idle/", "hub/"),
    "npm": ("labextension/test_typescript.py", "labextension/test_wheel.py"),
}
_REPO = Path(__file__).resolve().parents[2]
_running: list[pytest.Item] = []


def apply(items: list[pytest.Item]) -> None:
    """Add the markers a test's fixtures and folder call for (collection)."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        path = Path(str(item.fspath)).resolve().relative_to(_REPO / "tests").as_posix()
        for marker, fixtures in BY_FIXTURE.items():
            if used.intersection(fixtures):
                item.add_marker(marker)
        for marker, paths in BY_PATH.items():
            if path.startswith(paths):
                item.add_marker(marker)


def running(item: pytest.Item | None) -> None:
    """The test whose setup and call run now (None between tests)."""
    _running[:] = [item] if item is not None else []


def require(marker: str, what: str) -> None:
    """Fail the running test when it starts ``what`` without carrying ``marker``."""
    if _running and _running[0].get_closest_marker(marker) is None:
        pytest.fail(
            f"{_running[0].nodeid} {what} but is not marked '{marker}': add "
            f"pytest.mark.{marker} (or use the harness fixture that marks it), so that "
            f"-m 'not {marker}' leaves it out"
        )
