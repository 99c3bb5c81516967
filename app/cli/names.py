"""One argument style across the CLI: what a command acts on is a positional name
(``kip98 produce TOPIC``, ``kip98 transactions describe ID``), everything else an option.

The option spellings of earlier releases (``-t/--topic``, ``--transactional-id``) are still
accepted, hidden from the help, so scripts keep working; giving both, or neither, is one
clear line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from app.cli.errors import CliError

F = TypeVar("F", bound=Callable[..., Any])


def topic_option(fn: F) -> F:
    """The hidden ``-t/--topic`` of earlier releases, as the ``topic`` parameter."""
    return click.option("--topic", "-t", "topic", default=None, hidden=True)(fn)


def name_argument(positional: str | None, option: str | None, metavar: str, flag: str) -> str:
    """The name given positionally or by the old option, exactly one of them."""
    if positional is not None and option is not None:
        raise CliError(f"give {metavar} or {flag}, not both")
    name = positional if positional is not None else option
    if name is None:
        raise CliError(f"missing {metavar}")
    return name
