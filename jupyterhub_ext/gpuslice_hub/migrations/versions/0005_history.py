"""History retention: totals of pruned idle-reclaim events, and how far pruning went.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "event_totals",
        sa.Column("kind", sa.String(32), primary_key=True),
        sa.Column("profile", sa.String(255), primary_key=True),
        sa.Column("scope", sa.String(16), primary_key=True),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("reclaimed_gpu_hours", sa.Float(), nullable=False),
    )
    op.add_column(
        "ledger_lock",
        sa.Column("history_through", sa.Integer(), nullable=False, server_default="0"),
    )


def downgrade() -> None:
    with op.batch_alter_table("ledger_lock") as batch:
        batch.drop_column("history_through")
    op.drop_table("event_totals")
