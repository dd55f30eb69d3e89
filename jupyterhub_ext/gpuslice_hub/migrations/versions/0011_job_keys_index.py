"""The jobs' state index also holds each row's id and revision, so the scheduler's most
frequent query (the (id, revision) pairs of the active jobs, ``jobs/row_cache.py``, every
pass) is answered from the index alone instead of a row lookup per job. It replaces the
index on the state alone, which is its first column.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_state_id_revision", "jobs", ["state", "id", "revision"])
    op.drop_index("ix_jobs_state", table_name="jobs")


def downgrade() -> None:
    op.create_index("ix_jobs_state", "jobs", ["state"])
    op.drop_index("ix_jobs_state_id_revision", table_name="jobs")
