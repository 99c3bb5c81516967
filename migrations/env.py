"""Alembic environment: migrates the database the rest of kip98 would use."""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy import create_engine, pool

from app.storage.engine import resolve_url
from app.storage.schema import metadata
from app.storage.views import VIEW_NAMES

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logging", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def include_object(obj, name, type_, reflected, compare_to):  # type: ignore[no-untyped-def]
    # Views are created by migrations from app.storage.views, not by metadata; staging
    # tables of a Spark materialisation run are transient.
    if type_ != "table":
        return True
    return name not in VIEW_NAMES and not name.startswith("rc_staging_")


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(
            connection=connection, target_metadata=metadata, include_object=include_object
        )
        with context.begin_transaction():
            context.run_migrations()
        return
    url = config.get_main_option("sqlalchemy.url") or resolve_url()
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=metadata, include_object=include_object)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    context.configure(url=resolve_url(), target_metadata=metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
