"""``kip98 serve`` and ``python -m app.server``: the Kafka wire protocol, for any Kafka
client."""

from __future__ import annotations

import logging

import click

from app.server import DEFAULT_LISTEN, Listener, serve


def _address(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        try:
            Listener.parse(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from exc
    return value


@click.command("serve")
@click.option("--listen", default=DEFAULT_LISTEN, show_default=True, metavar="HOST:PORT",
              callback=_address, help="Where to accept Kafka clients (PLAINTEXT:// or SASL_PLAINTEXT://).")  # fmt: skip
@click.option("--advertised-listener", default=None, metavar="HOST:PORT", callback=_address,
              help="The address clients are told to connect to (default: --listen).")  # fmt: skip
@click.option("--metrics-listen", default=None, metavar="HOST:PORT", callback=_address,
              help="Serve this process's counters for Prometheus at /metrics there.")  # fmt: skip
def serve_command(listen: str, advertised_listener: str | None, metrics_listen: str | None) -> None:
    """Serve the Kafka protocol until SIGTERM or SIGINT. A SASL_PLAINTEXT://HOST:PORT
    listener asks SASL/PLAIN of each connection first (users: kip98 users add)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    # The state machine library logs every transition at INFO: detail for debugging, and
    # several lines per transaction under load.
    logging.getLogger("transitions").setLevel(logging.WARNING)
    click.echo(f"kip98 serve: listening on {listen}", err=True)
    serve(listen, advertised_listener, metrics_listen)
