"""Alembic environment for dstune's tables (``dstune_*``), kept apart from Optuna's tables in the same database.

The URL comes from, first to last: a connection handed over by ``Store.upgrade`` (``config.attributes["connection"]``),
``-x url=...``, the URL of ``Store.alembic_config`` (``sqlalchemy.url``; alembic.ini names none), then as every
command resolves it (:func:`tuner.env.storage_url`): the ``DSTUNE_STORAGE`` environment variable, else
``sqlite:///dstune.db``.
"""

from __future__ import annotations

from logging.config import fileConfig
from typing import Any

from alembic import context
from sqlalchemy import Connection, create_engine, pool

from tuner import env as dstune_env
from tuner.storage.tables import TABLE_PREFIX, VERSION_TABLE, Base

config = context.config
if config.config_file_name is not None and config.attributes.get("connection") is None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata
# Any number: serialises concurrent migrations of one PostgreSQL database (two processes opening a fresh store).
PG_LOCK_ID = 0x647374756E65  # "dstune"


def include_name(name: str | None, type_: str, parent_names: object) -> bool:
    """Autogenerate looks at our tables only: Optuna's (studies, trials, alembic_version, ...) are not ours to drop."""
    if type_ == "table":
        return bool(name and name.startswith(TABLE_PREFIX))
    return True


def _url() -> str:
    """``-x url=...`` or the URL a ``Store``'s Alembic config names, as a flag: :func:`tuner.env.storage_url`."""
    given = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    return dstune_env.storage_url(given)


def _configure(**kwargs: Any) -> None:
    context.configure(
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        include_name=include_name,
        compare_type=True,
        **kwargs,
    )


def run_migrations_offline() -> None:
    """``alembic upgrade head --sql``: print the SQL."""
    url = _url()
    _configure(url=url, literal_binds=True, render_as_batch=url.startswith("sqlite"))
    with context.begin_transaction():
        context.run_migrations()


def _run(connection: Connection) -> None:
    _configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({PG_LOCK_ID})")
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(_url(), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            _run(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
