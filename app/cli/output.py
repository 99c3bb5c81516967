"""``--output table|json`` for listing commands, rendered the same way everywhere.

Tables are for people, JSON for scripts; when stdout is not a terminal the table is not
wrapped to 80 columns, so piping it through grep keeps one row per line.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

import click
from rich.console import Console
from rich.table import Table

F = TypeVar("F", bound=Callable[..., Any])

FORMATS = ("table", "json")


def output_choice(formats: Sequence[str], default: str, help: str) -> Callable[[F], F]:
    """Add ``--output``/``-o``, one of ``formats``, as the ``output`` parameter."""
    option = click.option(
        "--output",
        "-o",
        "output",
        type=click.Choice(formats),
        default=default,
        show_default=True,
        help=help,
    )
    return cast(Callable[[F], F], option)


def output_option(fn: F) -> F:
    """Add ``--output table|json`` (default table) as the ``output`` parameter."""
    return output_choice(FORMATS, "table", "Render as a table or as JSON.")(fn)


def stdout_console() -> Console:
    if sys.stdout.isatty():
        return Console()
    return Console(width=10_000, no_color=True, soft_wrap=False)


def stderr_console() -> Console:
    """For progress and spinners, so stdout carries only the result."""
    return Console(stderr=True)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list | tuple | dict):
        return json.dumps(value, default=str)
    return str(value)


def emit(
    rows: Sequence[Mapping[str, Any]] | Mapping[str, Any],
    output: str,
    columns: Sequence[str] | None = None,
    headers: Mapping[str, str] | None = None,
) -> None:
    """Print ``rows`` (or one object) as a table or JSON.

    ``columns`` fixes which keys are shown and their order; table headers default to
    Kafka's tool style (``log_end_offset`` -> ``LOG-END-OFFSET``) unless ``headers`` says
    otherwise. JSON always carries every key, with its original name.
    """
    if output == "json":
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    records = [rows] if isinstance(rows, Mapping) else list(rows)
    names = list(columns) if columns else (list(records[0]) if records else [])
    table = Table(box=None, header_style="bold", pad_edge=False)
    for name in names:
        title = (headers or {}).get(name) or name.upper().replace("_", "-")
        table.add_column(title, overflow="fold")
    for record in records:
        table.add_row(*(_cell(record.get(name)) for name in names))
    stdout_console().print(table)
