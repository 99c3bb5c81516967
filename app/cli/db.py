"""``kip98 db``: the embedded PostgreSQL's life cycle, migrations and projection rebuilds.

``start``/``stop``/``status`` manage the embedded server under ``KIP98_HOME``; ``url``,
``migrate`` and ``rebuild`` act on whatever database kip98 would use (``KIP98_DATABASE_URL``
when set, else the embedded server, started on demand).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import click
from sqlalchemy.engine import make_url

from app.cli.errors import CliError
from app.cli.output import emit, output_option, stderr_console
from app.storage.embedded import EmbeddedPostgres, ServerStatus
from app.storage.engine import get_engine, resolve_url


def safe_url(url: str) -> str:
    """The URL with any password masked, for printing."""
    return make_url(url).render_as_string(hide_password=True)


def _status_record(status: ServerStatus) -> dict[str, Any]:
    explicit = os.environ.get("KIP98_DATABASE_URL")
    return {
        "running": status.running,
        "pid": status.pid,
        "port": status.port,
        "data_dir": str(status.data_dir),
        "url": status.url,
        "database_url": safe_url(explicit) if explicit else status.url,
    }


@click.group()
def db() -> None:
    """The database: embedded server, migrations, rebuilds."""


@db.command()
def start() -> None:
    """Start the embedded PostgreSQL (nothing happens if it already runs)."""
    status = EmbeddedPostgres().start()
    click.echo(f"PostgreSQL running (pid {status.pid}, port {status.port}): {status.url}")


@db.command()
def stop() -> None:
    """Stop the embedded PostgreSQL."""
    if EmbeddedPostgres().stop():
        click.echo("PostgreSQL stopped")
    else:
        click.echo("PostgreSQL was not running")


@db.command()
@output_option
def status(output: str) -> None:
    """Show whether the embedded PostgreSQL runs, and where."""
    emit(_status_record(EmbeddedPostgres().status()), output)


@db.command()
def url() -> None:
    """Print the SQLAlchemy URL kip98 uses (starting the embedded server if needed)."""
    click.echo(resolve_url())


@db.command()
def migrate() -> None:
    """Upgrade the schema to the newest revision."""
    from alembic.script import ScriptDirectory

    from app.storage.migrate import alembic_config, upgrade_to_head

    target = resolve_url()
    with stderr_console().status(f"migrating {safe_url(target)}"):
        upgrade_to_head(target)
    head = ScriptDirectory.from_config(alembic_config(target)).get_current_head()
    click.echo(f"schema at revision {head}: {safe_url(target)}")


@db.command()
def rebuild() -> None:
    """Recompute every projection from its event log."""
    try:
        from app.broker.rebuild import rebuild_all  # type: ignore[import-not-found, unused-ignore]
    except ImportError as exc:
        raise CliError(f"rebuild is not available: {exc}") from exc
    result = rebuild_all(get_engine())
    if isinstance(result, Mapping):
        for name, count in result.items():
            click.echo(f"{name}: {count}")
    click.echo("projections rebuilt")
