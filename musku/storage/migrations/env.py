"""Alembic environment of the results database.

musku runs alembic in-process (``musku.storage.migrate``) with a ``Config`` built in code and
an open connection passed in ``config.attributes["connection"]``; no alembic.ini is needed.
For hand use from a source checkout::

    python -m musku.storage.migrate upgrade --db URL
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from musku.storage.models import metadata

config = context.config


def _run(connection: object) -> None:
    context.configure(
        connection=connection,  # type: ignore[arg-type]
        target_metadata=metadata,
        compare_type=True,
        render_as_batch=True,  # SQLite cannot ALTER most things: batch mode copies tables
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=metadata,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(str(config.get_main_option("sqlalchemy.url")))
    try:
        with engine.connect() as conn:
            _run(conn)
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
