"""Fixtures shared by the whole suite live in tests/harness/; this file only wires them in.

Every process the tests start gets tests/fakes/site on its PYTHONPATH: its
``sitecustomize`` puts the fake NVML driver in place of ``pynvml`` where a test sets
$GPUSLICE_FAKE_NVML (gpuslice itself has no such switch, and ships no test code)."""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parents[1]
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(_REPO / "tests" / "fakes" / "site"), str(_REPO)]
    + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
)

# Every statement the ledger runs on SQLite's cursor (gpuslice_hub/db/lean.py) is checked
# against SQLAlchemy's own execution: the same SQL and parameters, the same rows.
os.environ["GPUSLICE_LEAN_CHECK"] = "1"

pytest_plugins = [
    "tests.harness.postgres",
    "tests.harness.hub",
    "tests.harness.slurm",
    "tests.harness.slurm_nodes",
    "tests.harness.accounts",
]

# The slowest files first. `make test` runs several workers, each taking a whole file at a
# time (--dist loadfile) in collection order as it frees up: the files that drive Chromium or
# start real hubs and Slurm (a minute or more each) came last in alphabetical order, and left
# one worker alone for minutes at the end. A stable sort: within each group, as before. The
# markers say which files those are (tests/harness/markers.py adds them first).


def pytest_collection_modifyitems(session, config, items):  # type: ignore[no-untyped-def]
    from tests.harness import markers

    markers.apply(items)  # (first: the order below reads them)

    def weight(item) -> int:  # type: ignore[no-untyped-def]
        if item.get_closest_marker("browser"):
            return 0
        return 1 if item.get_closest_marker("hub") or item.get_closest_marker("slurm") else 2

    by_file: dict[str, int] = {}
    for item in items:
        key = str(item.fspath)
        by_file[key] = min(by_file.get(key, 2), weight(item))
    items.sort(key=lambda item: by_file[str(item.fspath)])


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem) -> Iterator[None]:  # type: ignore[no-untyped-def]
    # (the harness's starters check the running test's markers: tests/harness/markers.py)
    from tests.harness import markers

    markers.running(item)
    try:
        return (yield)
    finally:
        markers.running(None)
