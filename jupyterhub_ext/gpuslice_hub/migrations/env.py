"""Alembic environment: run migrations on the connection the service hands over.

``render_as_batch``: SQLite cannot drop or alter a column in place; Alembic's batch mode
copies the table instead (and does plain ALTERs on PostgreSQL), so every revision, and its
downgrade, runs on both.
"""

from alembic import context
from sqlalchemy import create_engine

from gpuslice_hub.db import admin_models, jobs_models  # noqa: F401  (their tables)
from gpuslice_hub.db.models import Base

config = context.config
target_metadata = Base.metadata

connection = config.attributes.get("connection")
if connection is not None:
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    engine = create_engine(config.get_main_option("sqlalchemy.url") or "")
    with engine.begin() as conn:
        context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
