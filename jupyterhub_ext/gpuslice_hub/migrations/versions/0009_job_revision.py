"""A revision number on each job, moved by every UPDATE of it (the model's ``onupdate``, in
SQL): the scheduler's pass reads again only the rows that changed since its last pass
(jobs/row_cache.py).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("revision", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("revision")
