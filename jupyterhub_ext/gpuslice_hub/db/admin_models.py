"""What the admin panel adds to the ledger (migration 0003): usage reports from servers and
jobs, periodic usage samples for the utilization-vs-allocation plot, and the quota overrides
and idle exemptions admins set at runtime."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Float, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from .models import Base, UTCDateTime, utcnow


class UsageReportRow(Base):
    """The latest utilization an allocation's holder measured (one row per allocation)."""

    __tablename__ = "usage_reports"
    allocation_id: Mapped[int] = mapped_column(ForeignKey("allocations.id"), primary_key=True)
    reported_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # percent of the busiest device the holder's processes use, as NVML reports it
    utilization: Mapped[float | None] = mapped_column(Float, nullable=True)
    memory_mib: Mapped[float | None] = mapped_column(Float, nullable=True)
    # the most memory any report of this allocation gave (overcommit's history)
    peak_memory_mib: Mapped[float | None] = mapped_column(Float, nullable=True)
    idle_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    interval_seconds: Mapped[float] = mapped_column(Float, default=0.0)


class UsageSampleRow(Base):
    """The whole pool at one instant, taken every ``usage_sample_interval`` seconds."""

    __tablename__ = "usage_samples"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    ts: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)
    capacity_milli: Mapped[int] = mapped_column(Integer)
    # capacity_milli without the drained GPUs; NULL in samples older than revision 0004
    in_service_milli: Mapped[int | None] = mapped_column(Integer, nullable=True)
    allocated_milli: Mapped[int] = mapped_column(Integer)
    interactive_milli: Mapped[int] = mapped_column(Integer)
    batch_milli: Mapped[int] = mapped_column(Integer)
    # utilization of the allocations with a fresh report, in milli-GPU; NULL: no report at all
    used_milli: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # how much of allocated_milli those fresh reports cover
    reported_milli: Mapped[int] = mapped_column(Integer, default=0)
    fragmented_milli: Mapped[int] = mapped_column(Integer, default=0)
    queued_jobs: Mapped[int] = mapped_column(Integer, default=0)
    running_jobs: Mapped[int] = mapped_column(Integer, default=0)


class QuotaOverrideRow(Base):
    """An admin's runtime change of a quota; it replaces the configured limit until removed.

    ``subject``: ``user``, ``group`` or ``default_user`` (then ``name`` is empty).
    """

    __tablename__ = "quota_overrides"
    subject: Mapped[str] = mapped_column(String(16), primary_key=True)
    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    max_slices: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_milli: Mapped[int | None] = mapped_column(Integer, nullable=True)
    set_by: Mapped[str] = mapped_column(String(255))
    set_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    reason: Mapped[str] = mapped_column(String(1024), default="")


class IdleExemptionRow(Base):
    """A user whose sessions are never culled for idleness, until ``expires_at`` if set."""

    __tablename__ = "idle_exemptions"
    user: Mapped[str] = mapped_column(String(255), primary_key=True)
    set_by: Mapped[str] = mapped_column(String(255))
    set_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    reason: Mapped[str] = mapped_column(String(1024), default="")


class EventTotalRow(Base):
    """What the idle-reclaim events pruned by ``history_retention_days`` counted (migration
    0005): the metrics' counters and the all-time reclaimed GPU-hours stay whole after the
    events themselves are gone. The ledger lock row's ``history_through`` is the newest
    event id folded in here."""

    __tablename__ = "event_totals"
    kind: Mapped[str] = mapped_column(String(32), primary_key=True)
    profile: Mapped[str] = mapped_column(String(255), primary_key=True)
    scope: Mapped[str] = mapped_column(String(16), primary_key=True)
    count: Mapped[int] = mapped_column(Integer, default=0)
    reclaimed_gpu_hours: Mapped[float] = mapped_column(Float, default=0.0)
