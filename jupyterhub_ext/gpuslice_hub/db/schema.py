"""Schema versions: a new database is created at the newest revision; an old one is refused
with the command that upgrades it (the service never migrates behind an admin's back)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

from gpuslice.errors import GPUSliceError

from .engine import Database

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


class SchemaError(GPUSliceError, RuntimeError):
    pass


def alembic_config(db: Database) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", db.url.replace("%", "%%"))
    return cfg


def head_revision() -> str:
    head = ScriptDirectory(str(MIGRATIONS)).get_current_head()
    assert head is not None
    return head


def current_revision(db: Database) -> str | None:
    with db.read_engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(db: Database) -> None:
    cfg = alembic_config(db)
    with db.read_engine.connect() as conn:
        db.begin(conn)  # (on SQLite a migration is one transaction too)
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
        conn.commit()


def ensure_schema(db: Database, upgrade_command: str) -> None:
    """Create a fresh database, accept a current one, refuse an outdated or unknown one."""
    current = current_revision(db)
    head = head_revision()
    if current == head:
        return
    if current is None:
        tables = set(inspect(db.read_engine).get_table_names())
        if tables & {"allocations", "claims"}:
            raise SchemaError(
                f"The database at {safe_url(db.url)} has gpuslice tables but no schema version. "
                "Restore it from a backup or point db_url at a new database."
            )
        upgrade(db)
        return
    known = {s.revision for s in ScriptDirectory(str(MIGRATIONS)).walk_revisions()}
    if current not in known:
        raise SchemaError(
            f"The database at {safe_url(db.url)} is at schema revision {current}, which this "
            f"version of gpuslice does not know (newest it knows: {head}). Upgrade gpuslice."
        )
    raise SchemaError(
        f"The database at {safe_url(db.url)} is at schema revision {current}; this gpuslice "
        f"needs {head}. Back up the database, then run:\n    {upgrade_command}"
    )


def safe_url(url: str) -> str:
    """The URL without its password, for messages."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"
