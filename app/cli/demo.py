"""``kip98 demo``: show which database is in use and what it holds."""

from __future__ import annotations

import click
from sqlalchemy import text

from app.cli.db import safe_url
from app.storage.engine import get_engine, resolve_url


@click.command()
def demo() -> None:
    """Run the demonstration against the configured database."""
    url = resolve_url()
    with get_engine(url).connect() as conn:
        tables = conn.execute(
            text(
                "SELECT count(*) FROM information_schema.tables "
                "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
            )
        ).scalar_one()
        versioned = conn.execute(
            text("SELECT to_regclass('alembic_version') IS NOT NULL")
        ).scalar_one()
        revision = (
            conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
            if versioned
            else None
        )
    click.echo(f"database: {safe_url(url)}")
    click.echo(
        f"summary: {tables} tables, schema revision {revision or 'none (run kip98 db migrate)'}"
    )
