"""Batch jobs and their state transitions.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("groups", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("profile", sa.String(255), nullable=False),
        sa.Column("slices", sa.Integer(), nullable=False),
        sa.Column("priority_class", sa.String(16), nullable=False),
        sa.Column("checkpoint_interval", sa.Float(), nullable=False),
        sa.Column("max_runtime", sa.Float(), nullable=False),
        sa.Column("parameters", sa.JSON(), nullable=False),
        sa.Column("notebook_path", sa.String(1024), nullable=False),
        sa.Column("job_dir", sa.String(1024), nullable=False),
        sa.Column("backend", sa.String(32), nullable=False),
        sa.Column("backend_ref", sa.JSON(), nullable=False),
        sa.Column("allocation_ids", sa.JSON(), nullable=False),
        sa.Column("restarts", sa.Integer(), nullable=False),
        sa.Column("preemptions", sa.Integer(), nullable=False),
        sa.Column("lost_work_seconds", sa.Float(), nullable=False),
        sa.Column("run_seconds", sa.Float(), nullable=False),
        sa.Column("cells_done", sa.Integer(), nullable=False),
        sa.Column("cells_total", sa.Integer(), nullable=False),
        sa.Column("last_checkpoint_at", TS, nullable=True),
        sa.Column("submitted_at", TS, nullable=False),
        sa.Column("started_at", TS, nullable=True),
        sa.Column("attempt_started_at", TS, nullable=True),
        sa.Column("finished_at", TS, nullable=True),
        sa.Column("not_before", TS, nullable=True),
        sa.Column("preempt_deadline", TS, nullable=True),
        sa.Column("waiting_reason", sa.String(1024), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
    )
    op.create_index("ix_jobs_user", "jobs", ["user"])
    op.create_index("ix_jobs_state", "jobs", ["state"])
    op.create_table(
        "job_transitions",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("from_state", sa.String(16), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("at", TS, nullable=False),
        sa.Column("reason", sa.String(1024), nullable=False),
    )
    op.create_index("ix_job_transitions_job_id", "job_transitions", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_job_transitions_job_id", "job_transitions")
    op.drop_table("job_transitions")
    op.drop_index("ix_jobs_state", "jobs")
    op.drop_index("ix_jobs_user", "jobs")
    op.drop_table("jobs")
