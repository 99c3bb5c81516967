"""Turn any failure into the one-line ``error: …`` the CLI contract promises.

Users of a command line want the cause, not a Python traceback; ``KIP98_DEBUG=1`` lets
the original exception through for whoever needs the stack.
"""

from __future__ import annotations

import os
import sys
from typing import IO, Any

import click
from sqlalchemy.exc import ArgumentError

from app.errors import KafkaException
from app.storage.embedded import EmbeddedError
from app.storage.errors import kafka_error


class CliError(click.ClickException):
    """A failure already phrased for the user; click turns it into exit status 1."""

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True, file=file)


def one_line(text: object) -> str:
    """Collapse whitespace: driver messages span lines, the contract says one line."""
    return " ".join(str(text).split()) or "unknown error"


def describe(exc: BaseException) -> str | None:
    """The message for errors we expect users to meet; None for anything else (a bug)."""
    if isinstance(exc, KafkaException):
        return f"{exc.error.name()}: {one_line(exc.error.str())}"
    if isinstance(exc, EmbeddedError):
        return one_line(exc)
    error = kafka_error(exc)
    if error is not None:
        # Said as an application is told it (docs/design.md rule 25): what it means first,
        # then the driver's first line, without the SQL and link str(DBAPIError) adds.
        return f"database: {one_line(error.str())}"
    if isinstance(exc, ArgumentError):  # a malformed URL or an unknown driver
        return f"database URL: {one_line(exc)}"
    # Alembic is imported only by the commands that migrate; checking by module keeps every
    # other command from paying for importing it.
    if type(exc).__module__.startswith("alembic.") and type(exc).__name__ == "CommandError":
        return f"migrations: {one_line(exc)}"
    return None


def to_cli_error(exc: Exception) -> CliError:
    message = describe(exc)
    if message is None:
        message = f"unexpected {type(exc).__name__}: {one_line(exc)} (KIP98_DEBUG=1 shows where)"
    return CliError(message)


def debug_enabled() -> bool:
    return os.environ.get("KIP98_DEBUG", "") not in ("", "0")


def report_and_exit(exc: Exception) -> None:
    """Last resort for failures outside command invocation (e.g. loading a command)."""
    to_cli_error(exc).show()
    sys.exit(1)
