"""Burst: jobs that may run in a second Slurm partition, and what they ran there
(JobManager.burst_partition).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # jobs submitted before never burst
    op.add_column(
        "jobs", sa.Column("burstable", sa.Boolean(), nullable=False, server_default=sa.false())
    )
    op.add_column("jobs", sa.Column("bursts", sa.Integer(), nullable=False, server_default="0"))
    op.add_column(
        "jobs", sa.Column("burst_gpu_seconds", sa.Float(), nullable=False, server_default="0")
    )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("burst_gpu_seconds")
        batch.drop_column("bursts")
        batch.drop_column("burstable")
