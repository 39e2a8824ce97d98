"""Alembic environment for the planner schema (used by planner_service.storage.db.upgrade)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from planner_service.storage.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():  # `alembic upgrade --sql`
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
    else:  # plain `alembic -x ...` use with sqlalchemy.url set
        engine = create_engine(config.get_main_option("sqlalchemy.url"))
        with engine.connect() as conn:
            _run(conn)
            conn.commit()
