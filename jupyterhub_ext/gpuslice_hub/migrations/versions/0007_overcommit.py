"""Overcommit from history: each allocation's peak memory, and what a share's claim takes of
its GPU when that is less than its nominal share (GPUSliceService.share_overcommit_ratio).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL for reports written before: their allocations have no observed peak
    op.add_column("usage_reports", sa.Column("peak_memory_mib", sa.Float(), nullable=True))
    # NULL: the claim takes its nominal milli and memory (every claim written before)
    op.add_column("claims", sa.Column("charged_milli", sa.Integer(), nullable=True))
    op.add_column("claims", sa.Column("charged_memory_mib", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("claims") as batch:
        batch.drop_column("charged_memory_mib")
        batch.drop_column("charged_milli")
    with op.batch_alter_table("usage_reports") as batch:
        batch.drop_column("peak_memory_mib")
