"""The initial ledger: inventory, allocations, claims, events and the ledger lock.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

ACTIVE_SERVER = sa.text("active AND purpose = 'interactive'")
ACTIVE_EXCLUSIVE = sa.text("active AND exclusive_key IS NOT NULL")


def upgrade() -> None:
    op.create_table(
        "hosts",
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("cpu_milli", sa.Integer(), nullable=False),
        sa.Column("memory_mib", sa.Integer(), nullable=False),
        sa.Column("present", sa.Boolean(), nullable=False),
    )
    op.create_table(
        "gpus",
        sa.Column("uuid", sa.String(64), primary_key=True),
        sa.Column("host", sa.String(255), sa.ForeignKey("hosts.name"), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("memory_mib", sa.Integer(), nullable=False),
        sa.Column("mig_mode", sa.String(16), nullable=False),
        sa.Column("present", sa.Boolean(), nullable=False),
        sa.Column("drained", sa.Boolean(), nullable=False),
    )
    op.create_table(
        "mig_instances",
        sa.Column("uuid", sa.String(64), primary_key=True),
        sa.Column("gpu_uuid", sa.String(64), sa.ForeignKey("gpus.uuid"), nullable=False),
        sa.Column("profile", sa.String(32), nullable=False),
        sa.Column("memory_mib", sa.Integer(), nullable=False),
        sa.Column("milli", sa.Integer(), nullable=False),
        sa.Column("present", sa.Boolean(), nullable=False),
    )
    op.create_table(
        "allocations",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("server_name", sa.String(255), nullable=False),
        sa.Column("profile", sa.String(255), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("purpose", sa.String(16), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("preemptible", sa.Boolean(), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("groups", sa.JSON(), nullable=False),
        sa.Column("charged_group", sa.String(255), nullable=True),
        sa.Column("borrowed", sa.Boolean(), nullable=False),
        sa.Column("quota_weight", sa.Float(), nullable=False),
        sa.Column("gpu_milli", sa.Integer(), nullable=False),
        sa.Column("cpu_milli", sa.Integer(), nullable=False),
        sa.Column("memory_mib", sa.Integer(), nullable=False),
        sa.Column("active", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("released_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("release_reason", sa.String(255), nullable=True),
    )
    op.create_index("ix_allocations_user", "allocations", ["user"])
    op.create_index("ix_allocations_active", "allocations", ["active"])
    op.create_index(
        "uq_active_server",
        "allocations",
        ["user", "server_name"],
        unique=True,
        sqlite_where=ACTIVE_SERVER,
        postgresql_where=ACTIVE_SERVER,
    )
    op.create_table(
        "claims",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("allocation_id", sa.Integer(), sa.ForeignKey("allocations.id"), nullable=False),
        sa.Column("gpu_uuid", sa.String(64), nullable=False),
        sa.Column("mig_uuid", sa.String(64), nullable=True),
        sa.Column("milli", sa.Integer(), nullable=False),
        sa.Column("memory_mib", sa.Integer(), nullable=False),
        sa.Column("exclusive_key", sa.String(64), nullable=True),
        sa.Column("active", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_claims_allocation_id", "claims", ["allocation_id"])
    op.create_index("ix_claims_gpu_uuid", "claims", ["gpu_uuid"])
    op.create_index(
        "uq_active_exclusive",
        "claims",
        ["exclusive_key"],
        unique=True,
        sqlite_where=ACTIVE_EXCLUSIVE,
        postgresql_where=ACTIVE_EXCLUSIVE,
    )
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("user", sa.String(255), nullable=True),
        sa.Column("actor", sa.String(255), nullable=True),
        sa.Column("allocation_id", sa.Integer(), nullable=True),
        sa.Column("profile", sa.String(255), nullable=True),
        sa.Column("reason", sa.String(1024), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=False),
    )
    op.create_index("ix_events_ts", "events", ["ts"])
    op.create_index("ix_events_kind", "events", ["kind"])
    op.create_index("ix_events_user", "events", ["user"])
    lock = op.create_table(
        "ledger_lock",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("generation", sa.Integer(), nullable=False),
    )
    # The one row every allocating transaction locks (see gpuslice_hub.db.engine).
    op.bulk_insert(lock, [{"id": 1, "generation": 0}])


def downgrade() -> None:
    for table in ("ledger_lock", "events", "claims", "allocations", "mig_instances", "gpus", "hosts"):
        op.drop_table(table)
