"""Job folders are removed when no longer needed (jobs/folders.py): when the owner's server
copied an ended job's outputs, and when the service removed its folder.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    # (the folders of jobs from before are on disk: null, as for a job that just ended)
    op.add_column("jobs", sa.Column("outputs_collected_at", TS, nullable=True))
    op.add_column("jobs", sa.Column("folder_removed_at", TS, nullable=True))
    op.create_index("ix_jobs_folder_removed_at_state", "jobs", ["folder_removed_at", "state"])


def downgrade() -> None:
    op.drop_index("ix_jobs_folder_removed_at_state", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("folder_removed_at")
        batch.drop_column("outputs_collected_at")
