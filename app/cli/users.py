"""``kip98 users``: the SASL users of ``kip98 serve`` (a SASL_PLAINTEXT listener)."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime

import click

from app.broker import Broker
from app.cli.output import emit, output_option
from app.security.users import MECHANISMS, add_user, delete_user, list_users


@click.group("users")
def users_group() -> None:
    """SASL users: each authenticates to kip98 serve and acts as User:NAME."""


@users_group.command("add")
@click.argument("name")
@click.option("--password", required=True, help="The password (kept only as derived keys).")
@click.option("--mechanism", type=click.Choice(MECHANISMS), default="PLAIN", show_default=True,
              help="The SASL mechanism NAME logs in by.")  # fmt: skip
def add(name: str, password: str, mechanism: str) -> None:
    """Create NAME, or give it a new password."""
    add_user(Broker.connect(), name, password, mechanism)
    click.echo(f"user {name} ({mechanism})")


@users_group.command("delete")
@click.argument("name")
def delete(name: str) -> None:
    """Remove NAME: its connections already open stay authenticated until they close."""
    delete_user(Broker.connect(), name)
    click.echo(f"deleted user {name}")


def iso_time(epoch_ms: int) -> str:
    """An epoch-milliseconds time as ISO-8601 UTC, to the millisecond."""
    moment = datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@users_group.command("list")
@output_option
def list_(output: str) -> None:
    """The users, with their mechanism and when they were created: an ISO-8601 UTC time in
    the table; JSON gives both ``created`` (ISO-8601) and ``created_ms`` (epoch ms)."""
    rows = [{**asdict(u), "created": iso_time(u.created_ms)} for u in list_users(Broker.connect())]
    emit(rows, output, columns=["name", "mechanism", "created"])
