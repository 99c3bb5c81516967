"""The root ``kip98`` group.

Command groups live in their own modules and are imported only when used, so
``kip98 db url`` does not pay for importing PySpark. Adding a group is one line in
``COMMANDS``.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from app.cli.errors import debug_enabled, report_and_exit, to_cli_error

# command name -> "module:attribute" of its click command or group
COMMANDS: dict[str, str] = {
    "acls": "app.cli.acls:acls_group",
    "cluster": "app.cli.cluster:cluster_group",
    "console": "app.cli.web:console",
    "consume": "app.cli.console:consume",
    "coordinator": "app.cli.coordinator:coordinator_group",
    "db": "app.cli.db:db",
    "demo": "app.cli.demo:demo",
    "groups": "app.cli.groups:groups_group",
    "metrics": "app.cli.metrics:metrics",
    "produce": "app.cli.console:produce",
    "serve": "app.server.command:serve_command",
    "spark": "app.cli.spark:spark_group",
    "topics": "app.cli.topics:topics_group",
    "transactions": "app.cli.transactions:transactions_group",
    "users": "app.cli.users:users_group",
}


class RootGroup(click.Group):
    """Loads subcommands lazily and reports their failures as one line."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return super().get_command(ctx, cmd_name)
        module_name, _, attribute = COMMANDS[cmd_name].partition(":")
        command = getattr(importlib.import_module(module_name), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{COMMANDS[cmd_name]} is not a click command")
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except BrokenPipeError:
            closed_pipe()
        except Exception as exc:
            if debug_enabled():
                raise
            raise to_cli_error(exc) from exc


@click.group(cls=RootGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kip98", prog_name="kip98")
def cli() -> None:
    """Kafka's exactly-once transactional messaging (KIP-98) on PostgreSQL."""


# The status of a command whose reader went away (``kip98 consume t | head -1``): what a
# shell reports for a Unix tool ended by SIGPIPE (128 + 13), as ``yes | head -1`` does.
CLOSED_PIPE_STATUS = 141


def closed_pipe() -> None:
    """End quietly when stdout's reader has gone: no traceback, no error line. Output still
    buffered would fail again when the interpreter flushes it at exit, so stdout is pointed
    at /dev/null first (Python's documented recipe for SIGPIPE)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    sys.exit(CLOSED_PIPE_STATUS)


def main() -> None:
    try:
        try:
            cli.main(prog_name="kip98")
        finally:
            sys.stdout.flush()  # a closed pipe shows here for output a command left buffered
    except BrokenPipeError:
        closed_pipe()
    except Exception as exc:  # raised while parsing or loading commands, outside invoke
        if debug_enabled():
            raise
        report_and_exit(exc)
