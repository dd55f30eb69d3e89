"""Batch jobs and their recorded state transitions (migration 0002)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    literal_column,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from .models import Base, UTCDateTime, utcnow


class JobRow(Base):
    __tablename__ = "jobs"
    # the state with each row's id and revision: the (id, revision) pairs of the active
    # jobs, which the scheduler asks for every pass (row_cache.py), come from the index alone
    __table_args__ = (
        Index("ix_jobs_state_id_revision", "state", "id", "revision"),
        # the ended jobs whose folders are still on disk, which the folder sweep reads
        # (jobs/folders.py): from the index, however many jobs ended long ago
        Index("ix_jobs_folder_removed_at_state", "folder_removed_at", "state"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(100))
    user: Mapped[str] = mapped_column(String(255), index=True)
    groups: Mapped[list[str]] = mapped_column(JSON, default=list)
    state: Mapped[str] = mapped_column(String(16))
    profile: Mapped[str] = mapped_column(String(255))
    slices: Mapped[int] = mapped_column(Integer, default=1)
    priority_class: Mapped[str] = mapped_column(String(16))
    checkpoint_interval: Mapped[float] = mapped_column(Float)
    max_runtime: Mapped[float] = mapped_column(Float)
    parameters: Mapped[dict] = mapped_column(JSON, default=dict)
    notebook_path: Mapped[str] = mapped_column(String(1024), default="")
    job_dir: Mapped[str] = mapped_column(String(1024), default="")
    backend: Mapped[str] = mapped_column(String(32))
    # pid and start time (local), Slurm job id, pod name: whatever the backend needs to
    # find the run again after a service restart
    backend_ref: Mapped[dict] = mapped_column(JSON, default=dict)
    allocation_ids: Mapped[list[int]] = mapped_column(JSON, default=list)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    preemptions: Mapped[int] = mapped_column(Integer, default=0)
    lost_work_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    run_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    cells_done: Mapped[int] = mapped_column(Integer, default=0)
    cells_total: Mapped[int] = mapped_column(Integer, default=0)
    last_checkpoint_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    submitted_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    attempt_started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    not_before: Mapped[datetime | None] = mapped_column(UTCDateTime())
    preempt_deadline: Mapped[datetime | None] = mapped_column(UTCDateTime())
    waiting_reason: Mapped[str | None] = mapped_column(String(1024))
    error: Mapped[str | None] = mapped_column(Text)
    # the JobManager.time_windows name the job may run in (None: any time)
    time_window: Mapped[str | None] = mapped_column(String(64))
    # may be sent to the burst partition when it waits too long (JobManager.burst_partition);
    # how many times it was, and the GPU-seconds it ran there (capacity bought)
    burstable: Mapped[bool] = mapped_column(Boolean, default=False)
    bursts: Mapped[int] = mapped_column(Integer, default=0)
    burst_gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    # when the owner's server said it had copied the ended job's outputs into their
    # gpu-jobs folder (POST api/jobs/<id>/collected), and when the service removed the job's
    # folder (jobs/folders.py); None: not yet
    outputs_collected_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    folder_removed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # moved by every UPDATE of the row, ORM or Core, in SQL (``revision + 1`` where the
    # statement does not set it): the scheduler's pass reads again only the rows whose
    # revision moved (row_cache.py). Counted by the database, not from the value a session
    # loaded: two writers of one row (a waiting reason written without the ledger lock) on
    # PostgreSQL would otherwise both write the same next revision.
    revision: Mapped[int] = mapped_column(
        Integer, default=0, onupdate=literal_column("revision + 1")
    )
    # Loaded when read (a page of jobs loads them with ``selectinload``): the scheduler's
    # pass reads and writes hundreds of rows and never needs their history.
    transitions: Mapped[list[JobTransitionRow]] = relationship(
        back_populates="job", order_by="JobTransitionRow.id", lazy="select"
    )


class JobTransitionRow(Base):
    __tablename__ = "job_transitions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), index=True)
    from_state: Mapped[str | None] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16))
    at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    reason: Mapped[str] = mapped_column(String(1024), default="")
    job: Mapped[JobRow] = relationship(back_populates="transitions")
