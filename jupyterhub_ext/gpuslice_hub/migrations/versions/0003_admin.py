"""Admin panel: usage reports and samples, quota overrides, idle exemptions.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "usage_reports",
        sa.Column(
            "allocation_id", sa.Integer(), sa.ForeignKey("allocations.id"), primary_key=True
        ),
        sa.Column("reported_at", TS, nullable=False),
        sa.Column("utilization", sa.Float(), nullable=True),
        sa.Column("memory_mib", sa.Float(), nullable=True),
        sa.Column("idle_seconds", sa.Float(), nullable=False),
        sa.Column("interval_seconds", sa.Float(), nullable=False),
    )
    op.create_table(
        "usage_samples",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("ts", TS, nullable=False),
        sa.Column("capacity_milli", sa.Integer(), nullable=False),
        sa.Column("allocated_milli", sa.Integer(), nullable=False),
        sa.Column("interactive_milli", sa.Integer(), nullable=False),
        sa.Column("batch_milli", sa.Integer(), nullable=False),
        sa.Column("used_milli", sa.Integer(), nullable=True),
        sa.Column("reported_milli", sa.Integer(), nullable=False),
        sa.Column("fragmented_milli", sa.Integer(), nullable=False),
        sa.Column("queued_jobs", sa.Integer(), nullable=False),
        sa.Column("running_jobs", sa.Integer(), nullable=False),
    )
    op.create_index("ix_usage_samples_ts", "usage_samples", ["ts"])
    op.create_table(
        "quota_overrides",
        sa.Column("subject", sa.String(16), primary_key=True),
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("max_slices", sa.Float(), nullable=True),
        sa.Column("max_milli", sa.Integer(), nullable=True),
        sa.Column("set_by", sa.String(255), nullable=False),
        sa.Column("set_at", TS, nullable=False),
        sa.Column("reason", sa.String(1024), nullable=False),
    )
    op.create_table(
        "idle_exemptions",
        sa.Column("user", sa.String(255), primary_key=True),
        sa.Column("set_by", sa.String(255), nullable=False),
        sa.Column("set_at", TS, nullable=False),
        sa.Column("expires_at", TS, nullable=True),
        sa.Column("reason", sa.String(1024), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("idle_exemptions")
    op.drop_table("quota_overrides")
    op.drop_index("ix_usage_samples_ts", "usage_samples")
    op.drop_table("usage_samples")
    op.drop_table("usage_reports")
