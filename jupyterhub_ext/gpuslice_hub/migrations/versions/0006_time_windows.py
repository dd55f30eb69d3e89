"""Batch time windows: the window a job may run in (JobManager.time_windows).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL for jobs submitted before: they run at any time, as they did
    op.add_column("jobs", sa.Column("time_window", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("time_window")
