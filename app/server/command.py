"""``kip98 serve`` and ``python -m app.server``: the Kafka wire protocol, for any Kafka
client."""

from __future__ import annotations

import logging
from functools import partial

import click

from app.broker import Broker
from app.errors import KafkaException
from app.protocol import ANY_NODE_ID, configured_assignors, migration_policy
from app.server import DEFAULT_LISTEN, Listener, ServeError, endpoints_of, features, serve
from app.server.listener import check_tls
from app.server.node import check_rack
from app.server.processes import bind_all, cores, run
from app.server.registration import check_session_timeout
from app.server.tls import server_context
from app.settings import BrokerSettings

# Kafka's node ids are non-negative int32s.
MAX_NODE_ID = 2**31 - 1


def _addresses(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> list[str]:
    for text in value:
        try:
            Listener.parse(text)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from exc
    return list(value)


def _address(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    return None if value is None else _addresses(ctx, param, (value,))[0]


def _rack(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    try:
        return None if value is None else check_rack(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def _processes(ctx: click.Context, param: click.Parameter, value: str) -> int:
    """A positive number, or ``auto``: the host's cores."""
    if value == "auto":
        return cores()
    if not value.isdigit() or int(value) < 1:
        raise click.BadParameter(f"{value!r} is not a positive number of processes, nor auto")
    return int(value)


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
              help="Serve this process's counters for Prometheus at /metrics there (with "
                   "--processes, the i-th process at PORT+i).")  # fmt: skip
@click.option("--node-id", type=click.IntRange(0, MAX_NODE_ID), default=None,
              help="This node's id in the database's cluster (default: the smallest one no "
                   "live node holds). Refused while a live node holds it.")  # fmt: skip
@click.option("--rack", default=None, callback=_rack,
              help="The rack (or zone) Metadata gives for this node.")  # fmt: skip
@click.option("--processes", default="1", show_default=True, metavar="N|auto",
              callback=_processes,
              help="Serve with N processes on the same listeners, each a node of its own "
                   "(auto: one per core of the host).")  # fmt: skip
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
    node_id: int | None,
    rack: str | None,
    processes: int,
    replica_url: str | None,
) -> None:
    """Serve the Kafka protocol until SIGTERM or SIGINT, as a node of the cluster of every
    kip98 serve over the same database. SASL_* listeners ask SASL (PLAIN, SCRAM-SHA-256,
    SCRAM-SHA-512) of each connection first (users: kip98 users add); SSL and SASL_SSL
    ones need --tls-cert and --tls-key."""
    try:
        endpoints = endpoints_of(listens, advertised, rack)
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        tls = None if tls_cert is None or tls_key is None else server_context(tls_cert, tls_key)
        check_tls(endpoints, tls)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    for principal in super_users:
        if not principal.startswith("User:") or principal == "User:":
            raise click.BadParameter(f"{principal!r} is not User:NAME", param_hint="--super-user")
    try:
        settings = BrokerSettings.from_env()
        check_session_timeout(settings)
        features.features_of(settings.features)  # KIP98_FEATURES refused here, in one line
        configured_assignors(settings.group_consumer_assignors)  # and an unknown assignor
        migration_policy(settings.group_consumer_migration_policy)  # and an unknown policy
        # Before any process starts: the embedded database (or, with KIP98_AUTO_MIGRATE=1,
        # any) is migrated here; one of one's own left unmigrated is refused in one line.
        Broker.check_schema()
    except KafkaException as exc:
        raise click.ClickException(exc.args[0].str()) from exc
    except ServeError as exc:
        raise click.ClickException(str(exc)) from exc
    if node_id is not None and node_id + processes - 1 > MAX_NODE_ID:
        raise click.BadParameter(
            f"node ids {node_id} to {node_id + processes - 1} go past {MAX_NODE_ID}",
            param_hint="--node-id",
        )
    shown = "%(asctime)s %(levelname)s %(message)s"
    if processes > 1:
        shown = "%(asctime)s %(levelname)s [%(process)d] %(message)s"
    logging.basicConfig(level=logging.INFO, format=shown)
    # The state machine library logs every transition at INFO: detail for debugging, and
    # several lines per transaction under load.
    logging.getLogger("transitions").setLevel(logging.WARNING)
    serving = partial(
        serve, tls=tls, super_users=list(super_users), replica_url=replica_url,
        node_id=ANY_NODE_ID if node_id is None else node_id,
    )  # fmt: skip
    try:
        if processes == 1:
            serving(endpoints, metrics_listen)
            return
        endpoints, sockets = bind_all(endpoints, processes)
    except ServeError as exc:
        raise click.ClickException(str(exc)) from exc
    for endpoint in endpoints:
        click.echo(f"kip98 serve: {processes} processes on {endpoint.listener}", err=True)

    def child(i: int) -> None:
        metrics = None
        if metrics_listen is not None:
            metrics_at = Listener.parse(metrics_listen)
            metrics = f"{metrics_at.host}:{metrics_at.port + i}"
        first = ANY_NODE_ID if node_id is None else node_id + i
        serving(endpoints, metrics, node_id=first, sockets=sockets[i])

    raise SystemExit(run(processes, sockets, child))
