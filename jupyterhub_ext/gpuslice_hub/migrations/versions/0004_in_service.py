"""Usage samples record the capacity in service (drained GPUs left out).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL for samples taken before: the plot falls back to the whole capacity for them.
    op.add_column("usage_samples", sa.Column("in_service_milli", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usage_samples") as batch:
        batch.drop_column("in_service_milli")
