"""Migrations and models agree; a database from the previous release is refused until
``upgrade-db`` brings it forward with its data; quota overrides merge with the config."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text

from gpuslice_hub.db import admin_models, jobs_models  # noqa: F401  (register their tables)
from gpuslice_hub.db.engine import open_database
from gpuslice_hub.db.models import Base
from gpuslice_hub.db.schema import SchemaError, alembic_config, ensure_schema, upgrade
from gpuslice_hub.overrides import apply_overrides
from gpuslice_hub.quotas import Held, Usage, parse_quotas


def assert_models_match(db) -> None:
    with db.read_engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == [], diff


def test_migrations_build_exactly_the_models(db_url: str) -> None:
    db = open_database(db_url)
    try:
        upgrade(db)
        assert_models_match(db)
    finally:
        db.dispose()


def test_every_revision_downgrades_and_upgrades_again(db_url: str) -> None:
    """Downgrades drop columns, which SQLite can only do in Alembic's batch mode."""
    db = open_database(db_url)
    cfg = alembic_config(db)
    try:
        upgrade(db)
        with db.read_engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0001")
        upgrade(db)
        assert_models_match(db)
    finally:
        db.dispose()


def test_a_previous_release_database_is_refused_then_upgraded_keeping_its_data(
    tmp_path: Path,
) -> None:
    db = open_database(f"sqlite:///{tmp_path}/old.sqlite")
    cfg = alembic_config(db)
    with db.read_engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0002")
    with db.read_engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO events (ts, kind, actor, detail) "
                "VALUES ('2026-11-01 10:00:00', 'inventory', 'service', '{}')"
            )
        )
    with pytest.raises(SchemaError, match="upgrade-db"):
        ensure_schema(db, "gpuslice-hub-service upgrade-db")
    upgrade(db)
    ensure_schema(db, "gpuslice-hub-service upgrade-db")  # accepted now
    with db.read_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM events")).scalar() == 1
        assert conn.execute(text("SELECT count(*) FROM quota_overrides")).scalar() == 0
    db.dispose()


def override(subject: str, name: str, slices: float | None, milli: int | None) -> SimpleNamespace:
    return SimpleNamespace(subject=subject, name=name, max_slices=slices, max_milli=milli)


def test_overrides_replace_limits_and_a_group_keeps_its_borrowing() -> None:
    base = parse_quotas(
        {
            "default_user": {"max_slices": 2},
            "users": {"ann": {"max_slices": 1}},
            "groups": {"physics": {"max_milli": 1000, "borrow_from": ["chem"]}, "chem": {}},
        }
    )
    q = apply_overrides(
        base,
        [
            override("user", "ann", 5, None),
            override("user", "bob", None, 500),
            override("group", "physics", 3, None),
            override("default_user", "", None, None),
        ],
    )
    assert q.users["ann"].max_slices == 5 and q.users["bob"].max_milli == 500
    assert q.groups["physics"].max_slices == 3 and q.groups["physics"].max_milli is None
    assert q.groups["physics"].borrow_from == ("chem",)
    assert q.default_user is not None and q.default_user.max_slices is None  # no limit
    # the configured quotas themselves are untouched
    assert base.users["ann"].max_slices == 1 and "bob" not in base.users
    # a "no limit" override limits nobody: the spawn form and overview list no quota for
    # it (they said "Your quota:  in use."), and it describes itself as what it is
    held = Held({}, {})
    assert q.standing("carl", (), held) == []
    assert [x["name"] for x in q.standing("ann", ("physics",), held)] == ["ann", "physics"]
    assert q.default_user.describe(Usage()) == "no limit"


def test_a_quota_override_reaches_every_ledger_on_the_database(make_ledger) -> None:
    from gpuslice_hub.errors import Refused
    from gpuslice_hub.ledger import Caller
    from gpuslice_hub.overrides import AdminSettings

    first, second = make_ledger(), make_ledger()  # two service processes, one database
    ann = Caller("ann", (), "ann")
    second.allocate(ann, "share-250", "a")  # warms second's quota cache
    AdminSettings(first.db).set_quota("user", "ann", 1, None, "admin", "one is enough")
    with pytest.raises(Refused) as refused:
        second.allocate(ann, "share-250", "b")
    assert refused.value.code == "over_quota" and "1 of 1 slice in use" in refused.value.message
    assert AdminSettings(first.db).reset_quota("user", "ann", "admin", "")
    second.allocate(ann, "share-250", "b")
