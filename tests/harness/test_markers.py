"""The markers that ``-m`` selects by are true, and the tests' map names every test file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.harness import markers

TESTS = Path(__file__).resolve().parents[1]


def test_starting_a_part_without_its_marker_fails_the_test(request: pytest.FixtureRequest):
    # (this test is marked by nothing: the harness's starters would fail it)
    with pytest.raises(pytest.fail.Exception, match=r"is not marked 'hub': add pytest\.mark\.hub"):
        markers.require("hub", "starts a JupyterHub")
    markers.running(None)  # between tests: nothing to check
    markers.require("hub", "starts a JupyterHub")
    markers.running(request.node)


@pytest.mark.slurm
def test_a_marked_test_may_start_its_part():
    markers.require("slurm", "starts a Slurm cluster")


class Collected:
    """What ``markers.apply`` reads of a collected test, and the markers it adds."""

    def __init__(self, path: str, fixtures: tuple[str, ...]) -> None:
        self.fspath, self.fixturenames = TESTS / path, fixtures
        self.added: set[str] = set()

    def add_marker(self, marker: str) -> None:
        self.added.add(marker)


def test_markers_come_from_the_fixtures_and_the_folder():
    items = [
        Collected("jobs/test_x.py", ("tmp_path", "hub_factory")),
        Collected("service/test_x.py", ("slurm_nodes", "slurm_nodes_cluster")),
        Collected("service/test_y.py", ("postgres_url", "postgres_server")),
        Collected("browser/test_x.py", ("tmp_path",)),
        Collected("labextension/test_wheel.py", ()),
        Collected("labextension/test_states.py", ()),
        Collected("placement/test_x.py", ("tmp_path",)),
    ]
    markers.apply(items)  # type: ignore[arg-type]
    assert [i.added for i in items] == [
        {"hub"}, {"slurm"}, {"postgres"}, {"browser", "hub"}, {"npm"}, set(), set(),
    ]  # fmt: skip


def test_every_test_file_is_on_the_map():
    named = set(
        re.findall(r"`([a-z_0-9]+/(?:test_[a-z_0-9]+\.py)?)`", (TESTS / "README.md").read_text())
    )
    missing = [
        p.relative_to(TESTS).as_posix()
        for p in sorted(TESTS.glob("*/test_*.py"))
        if p.relative_to(TESTS).as_posix() not in named and f"{p.parent.name}/" not in named
    ]
    assert not missing, f"tests/README.md does not name {missing}"
