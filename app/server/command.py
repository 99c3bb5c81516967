"""``kip98 serve`` and ``python -m app.server``: the Kafka wire protocol, for any Kafka
client."""

from __future__ import annotations

import logging

import click

from app.server import DEFAULT_LISTEN, Listener, endpoints_of, serve
from app.server.listener import check_tls
from app.server.tls import server_context


def _addresses(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> list[str]:
    for text in value:
        try:
            Listener.parse(text)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from exc
    return list(value)


def _address(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    return None if value is None else _addresses(ctx, param, (value,))[0]


@click.command("serve")
@click.option("--listen", "listens", multiple=True, default=[DEFAULT_LISTEN], show_default=True,
              metavar="[PROTOCOL://]HOST:PORT", callback=_addresses,
              help="Where to accept Kafka clients; repeat for several listeners, one per "
                   "protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL).")  # fmt: skip
@click.option("--advertised-listener", "advertised", multiple=True,
              metavar="[PROTOCOL://]HOST:PORT", callback=_addresses,
              help="The address a listener's clients are told to connect to, matched by "
                   "protocol (default: the listener's own).")  # fmt: skip
@click.option("--tls-cert", type=click.Path(dir_okay=False), default=None,
              help="PEM certificate (chain) of SSL and SASL_SSL listeners.")  # fmt: skip
@click.option("--tls-key", type=click.Path(dir_okay=False), default=None,
              help="PEM private key of --tls-cert.")  # fmt: skip
@click.option("--super-user", "super_users", multiple=True, metavar="User:NAME",
              help="A principal allowed everything (repeat; replaces KIP98_SUPER_USERS).")  # fmt: skip
@click.option("--metrics-listen", default=None, metavar="HOST:PORT", callback=_address,
              help="Serve this process's counters for Prometheus at /metrics there.")  # fmt: skip
@click.option("--replica-url", default=None, metavar="URL",
              help="A standby of the database: Fetch requests read their records there "
                   "(fetch from follower); everything else stays on the primary.")  # fmt: skip
def serve_command(
    listens: list[str],
    advertised: list[str],
    tls_cert: str | None,
    tls_key: str | None,
    super_users: tuple[str, ...],
    metrics_listen: str | None,
    replica_url: str | None,
) -> None:
    """Serve the Kafka protocol until SIGTERM or SIGINT. SASL_* listeners ask SASL (PLAIN,
    SCRAM-SHA-256, SCRAM-SHA-512) of each connection first (users: kip98 users add);
    SSL and SASL_SSL ones need --tls-cert and --tls-key."""
    try:
        endpoints = endpoints_of(listens, advertised)
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        tls = None if tls_cert is None or tls_key is None else server_context(tls_cert, tls_key)
        check_tls(endpoints, tls)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    for principal in super_users:
        if not principal.startswith("User:") or principal == "User:":
            raise click.BadParameter(f"{principal!r} is not User:NAME", param_hint="--super-user")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    # The state machine library logs every transition at INFO: detail for debugging, and
    # several lines per transaction under load.
    logging.getLogger("transitions").setLevel(logging.WARNING)
    for endpoint in endpoints:
        click.echo(f"kip98 serve: listening on {endpoint.listener}", err=True)
    serve(endpoints, metrics_listen, tls, list(super_users), replica_url)
