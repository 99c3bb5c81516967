"""``kip98 serve`` and ``python -m app.server``: the Kafka wire protocol, for any Kafka
client."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from app.server import DEFAULT_LISTEN, parse_address, sasl_listener_users, serve
from app.server.sasl import UsersFileError


def _address(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        try:
            parse_address(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from exc
    return value


@click.command("serve")
@click.option("--listen", default=DEFAULT_LISTEN, show_default=True, metavar="HOST:PORT",
              callback=_address, help="Where to accept Kafka clients.")  # fmt: skip
@click.option("--advertised-listener", default=None, metavar="HOST:PORT", callback=_address,
              help="The address clients are told to connect to (default: --listen).")  # fmt: skip
@click.option("--metrics-listen", default=None, metavar="HOST:PORT", callback=_address,
              help="Serve this process's counters for Prometheus at /metrics there.")  # fmt: skip
@click.option("--sasl-users", default=None, metavar="FILE",
              type=click.Path(path_type=Path, dir_okay=False),
              help="name=password lines: the SASL/PLAIN users of a SASL_PLAINTEXT:// "
                   "listener, each acting as User:NAME.")  # fmt: skip
def serve_command(
    listen: str,
    advertised_listener: str | None,
    metrics_listen: str | None,
    sasl_users: Path | None,
) -> None:
    """Serve the Kafka protocol until SIGTERM or SIGINT."""
    try:
        sasl_listener_users(listen, sasl_users)  # refused here, before anything starts
    except (ValueError, UsersFileError) as exc:
        raise click.UsageError(str(exc)) from exc
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    # The state machine library logs every transition at INFO: detail for debugging, and
    # several lines per transaction under load.
    logging.getLogger("transitions").setLevel(logging.WARNING)
    click.echo(f"kip98 serve: listening on {listen}", err=True)
    serve(listen, advertised_listener, metrics_listen, sasl_users)
