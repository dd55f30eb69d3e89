"""An index on ``events.allocation_id``: every release of a server the hub stopped looks up
the service's own request to stop it (``_why_stopped``), which without it read every event
of the reclaim kinds ever recorded, a cost that grew with each cull.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_events_allocation_id", "events", ["allocation_id"])


def downgrade() -> None:
    op.drop_index("ix_events_allocation_id", table_name="events")
