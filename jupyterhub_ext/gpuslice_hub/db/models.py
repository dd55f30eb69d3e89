"""SQLAlchemy models of the ledger. Changing them needs an Alembic migration."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    TypeDecorator,
    text,
)
from sqlalchemy.dialects.sqlite import DATETIME as SQLITE_DATETIME
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from .. import clock


def utcnow() -> datetime:
    """Now, from the service's clock (``gpuslice_hub.clock``: a simulator moves it)."""
    return clock.now()


class UTCDateTime(TypeDecorator[datetime]):
    """The one time type of the ledger: a UTC instant, always timezone-aware in Python.

    PostgreSQL keeps the zone; SQLite hands back naive datetimes. Every timestamp gpuslice
    stores is UTC, so a naive one read back is UTC, and nothing above this type ever
    compares naive with aware.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(UTC)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value

    # On SQLite, the two steps above composed with SQLAlchemy's text format in one function
    # each: every job row the scheduler reads holds a dozen timestamps, and the composition
    # (a dict format, ``astimezone`` of an instant already in UTC, ``replace``) cost two to
    # five times these. The same text and the same instants (tests/service/test_utc_datetime.py).
    def bind_processor(self, dialect: Dialect) -> Callable[[Any], Any] | None:
        if dialect.name == "sqlite" and _SQLITE_SAME:
            return _sqlite_text
        return super().bind_processor(dialect)

    def result_processor(self, dialect: Dialect, coltype: Any) -> Callable[[Any], Any] | None:
        if dialect.name == "sqlite" and _SQLITE_SAME:
            return _sqlite_instant
        return super().result_processor(dialect, coltype)


# SQLAlchemy's text for a datetime on SQLite (sqlite.DATETIME's storage format), in the
# positional form of the same format
_SQLITE_FORMAT = (
    "%(year)04d-%(month)02d-%(day)02d %(hour)02d:%(minute)02d:%(second)02d.%(microsecond)06d"
)


# (were SQLAlchemy's format another one day, its own processors are used)
_SQLITE_SAME = str(SQLITE_DATETIME()._storage_format) == _SQLITE_FORMAT


def _sqlite_text(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is not None and value.tzinfo is not UTC:
        value = value.astimezone(UTC)
    # (a positional %-format: an f-string of seven formatted fields costs twice as much)
    return "%04d-%02d-%02d %02d:%02d:%02d.%06d" % (  # noqa: UP031
        value.year,
        value.month,
        value.day,
        value.hour,
        value.minute,
        value.second,
        value.microsecond,
    )


def _sqlite_instant(value: str | None) -> datetime | None:
    # (the text is UTC: the zone is named in the text, which ``fromisoformat`` reads far
    # faster than it replaces a zone afterwards)
    return None if value is None else datetime.fromisoformat(value + "+00:00")


class Base(DeclarativeBase):
    pass


class HostRow(Base):
    __tablename__ = "hosts"
    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    cpu_milli: Mapped[int] = mapped_column(Integer)
    memory_mib: Mapped[int] = mapped_column(Integer)
    # False once discovery no longer reports the host; held slices stay until released.
    present: Mapped[bool] = mapped_column(Boolean, default=True)
    # Why the engine (Slurm) runs no new work here now (drained, down, in a reservation),
    # mirrored every sync pass; None: it does. Its GPUs are then offered to nobody, as a
    # drained GPU is not, and their holders keep them.
    engine_out: Mapped[str | None] = mapped_column(String(255), nullable=True, default=None)


class GPURow(Base):
    __tablename__ = "gpus"
    uuid: Mapped[str] = mapped_column(String(64), primary_key=True)
    host: Mapped[str] = mapped_column(ForeignKey("hosts.name"))
    index: Mapped[int] = mapped_column(Integer)
    model: Mapped[str] = mapped_column(String(255))
    memory_mib: Mapped[int] = mapped_column(Integer)
    mig_mode: Mapped[str] = mapped_column(String(16))
    present: Mapped[bool] = mapped_column(Boolean, default=True)
    drained: Mapped[bool] = mapped_column(Boolean, default=False)
    mig_instances: Mapped[list[MigRow]] = relationship(
        back_populates="gpu", order_by="MigRow.uuid", lazy="selectin"
    )


class MigRow(Base):
    __tablename__ = "mig_instances"
    uuid: Mapped[str] = mapped_column(String(64), primary_key=True)
    gpu_uuid: Mapped[str] = mapped_column(ForeignKey("gpus.uuid"))
    profile: Mapped[str] = mapped_column(String(32))
    memory_mib: Mapped[int] = mapped_column(Integer)
    milli: Mapped[int] = mapped_column(Integer)
    present: Mapped[bool] = mapped_column(Boolean, default=True)
    gpu: Mapped[GPURow] = relationship(back_populates="mig_instances")


class AllocationRow(Base):
    __tablename__ = "allocations"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user: Mapped[str] = mapped_column(String(255), index=True)
    server_name: Mapped[str] = mapped_column(String(255), default="")
    profile: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(16))
    purpose: Mapped[str] = mapped_column(String(16))  # interactive | batch
    priority: Mapped[int] = mapped_column(Integer, default=0)
    preemptible: Mapped[bool] = mapped_column(Boolean, default=False)
    host: Mapped[str] = mapped_column(String(255))
    groups: Mapped[list[str]] = mapped_column(JSON, default=list)
    charged_group: Mapped[str | None] = mapped_column(String(255), nullable=True)
    borrowed: Mapped[bool] = mapped_column(Boolean, default=False)
    quota_weight: Mapped[float] = mapped_column(Float, default=1.0)
    gpu_milli: Mapped[int] = mapped_column(Integer, default=0)
    cpu_milli: Mapped[int] = mapped_column(Integer, default=0)
    memory_mib: Mapped[int] = mapped_column(Integer, default=0)
    active: Mapped[bool] = mapped_column(Boolean, default=True, index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    released_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    release_reason: Mapped[str | None] = mapped_column(String(255), nullable=True)
    claims: Mapped[list[ClaimRow]] = relationship(
        back_populates="allocation", order_by="ClaimRow.id", lazy="selectin"
    )

    __table_args__ = (
        # One live interactive allocation per server: a retried spawn cannot hold two slices.
        Index(
            "uq_active_server",
            "user",
            "server_name",
            unique=True,
            sqlite_where=text("active AND purpose = 'interactive'"),
            postgresql_where=text("active AND purpose = 'interactive'"),
        ),
    )


class ClaimRow(Base):
    """One GPU resource held by an allocation (a whole GPU, a MIG instance or a share)."""

    __tablename__ = "claims"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    allocation_id: Mapped[int] = mapped_column(ForeignKey("allocations.id"), index=True)
    gpu_uuid: Mapped[str] = mapped_column(String(64), index=True)
    mig_uuid: Mapped[str | None] = mapped_column(String(64), nullable=True)
    milli: Mapped[int] = mapped_column(Integer)
    memory_mib: Mapped[int] = mapped_column(Integer)
    # The GPU or MIG uuid for exclusive claims, NULL for shares. The partial unique index
    # makes the database itself refuse a second live holder of an exclusive slice, whatever
    # the interleaving of writers.
    exclusive_key: Mapped[str | None] = mapped_column(String(64), nullable=True)
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    # What an overcommitted share takes of its GPU (less than milli and memory_mib, which
    # stay what the holder was promised: its memory cap); NULL: the nominal figures.
    charged_milli: Mapped[int | None] = mapped_column(Integer, nullable=True)
    charged_memory_mib: Mapped[int | None] = mapped_column(Integer, nullable=True)
    allocation: Mapped[AllocationRow] = relationship(back_populates="claims")

    __table_args__ = (
        Index(
            "uq_active_exclusive",
            "exclusive_key",
            unique=True,
            sqlite_where=text("active AND exclusive_key IS NOT NULL"),
            postgresql_where=text("active AND exclusive_key IS NOT NULL"),
        ),
    )


class EventRow(Base):
    """Audit trail: every allocation, refusal, release, warning, extension and cull."""

    __tablename__ = "events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    ts: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)
    kind: Mapped[str] = mapped_column(String(32), index=True)
    user: Mapped[str | None] = mapped_column(String(255), nullable=True, index=True)
    actor: Mapped[str | None] = mapped_column(String(255), nullable=True)
    # indexed: a release looks up why its server was stopped (the allocation's own events)
    allocation_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    profile: Mapped[str | None] = mapped_column(String(255), nullable=True)
    reason: Mapped[str | None] = mapped_column(String(1024), nullable=True)
    detail: Mapped[dict] = mapped_column(JSON, default=dict)


class LedgerLock(Base):
    """A single row that every allocating transaction locks first (SELECT … FOR UPDATE).

    Placement reads the whole ledger and then writes; two writers must never both read
    the same free capacity. On SQLite ``BEGIN IMMEDIATE`` gives the same exclusion.
    """

    __tablename__ = "ledger_lock"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    generation: Mapped[int] = mapped_column(Integer, default=0)
    # The newest event id pruned by history retention (its counts are in event_totals).
    history_through: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
