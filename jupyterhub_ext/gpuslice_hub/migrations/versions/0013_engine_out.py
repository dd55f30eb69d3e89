"""Hosts record why their engine runs no new work there (Slurm: drained, down, in a
reservation): ``hosts.engine_out``, mirrored by the service's Slurm sync pass, so a node
the engine will not run on is never offered.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # (null: every host is usable until the next pass says otherwise, as before)
    op.add_column("hosts", sa.Column("engine_out", sa.String(255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.drop_column("engine_out")
