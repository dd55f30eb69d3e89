"""Ledgers over real databases: SQLite in a temp dir, and PostgreSQL from the harness."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuslice.gpu import discover
from gpuslice_hub.db.engine import open_database
from gpuslice_hub.db.schema import ensure_schema
from gpuslice_hub.ledger import Ledger
from gpuslice_hub.placement import get_policy
from gpuslice_hub.profiles import parse_profiles
from gpuslice_hub.quotas import parse_quotas
from tests.harness.hub import SIM_HOSTS, SIM_PROFILES
from tests.harness.postgres import DATABASES


def build_ledger(
    url: str,
    profiles: list[dict] | None = None,
    quotas: dict | None = None,
    hosts: list[dict] | None = None,
    policy: str = "best-fit",
) -> Ledger:
    db = open_database(url)
    ensure_schema(db, "gpuslice-hub-service upgrade-db")
    ledger = Ledger(
        db,
        parse_profiles(profiles if profiles is not None else SIM_PROFILES),
        parse_quotas(quotas or {}),
        get_policy(policy),
    )
    ledger.sync_inventory(discover("simulated", hosts or SIM_HOSTS))
    return ledger


@pytest.fixture(params=DATABASES)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/ledger.sqlite"
    return request.getfixturevalue("postgres_db")


@pytest.fixture
def make_ledger(db_url: str) -> Callable[..., Ledger]:
    ledgers: list[Ledger] = []

    def make(**kw: Any) -> Ledger:
        ledger = build_ledger(db_url, **kw)
        ledgers.append(ledger)
        return ledger

    yield make  # type: ignore[misc]
    for ledger in ledgers:
        ledger.db.dispose()
