"""The Kafka wire protocol: a second front end of ``Broker.handle``, so any Kafka client
(librdkafka, kafka-python, aiokafka, kcat) runs against kip98 unchanged.

``codec`` reads and writes Kafka's frames and entities (kio), ``records`` the record
batches (aiokafka's record module), ``apis`` maps each API onto the broker's requests (the
admin APIs in ``topic_apis``, ``acl_apis``, ``txn_apis``), and
``listener`` is the asyncio server; ``kip98 serve`` and ``python -m app.server`` run it.
"""

from __future__ import annotations

import asyncio
import gc

from app.broker import Broker
from app.server.answer import Node
from app.server.listener import Server
from app.server.metrics import expose

__all__ = ["Node", "Server", "listener_scheme", "parse_address", "serve"]

DEFAULT_LISTEN = "PLAINTEXT://127.0.0.1:9092"
CLUSTER_ID = "kip98"


# The listeners' security protocols served: as is, or SASL (PLAIN) first.
SCHEMES = ("PLAINTEXT", "SASL_PLAINTEXT")


def listener_scheme(text: str) -> str:
    """The security protocol of a listener address (PLAINTEXT when none is given)."""
    scheme, sep, _ = text.partition("://")
    return scheme.upper() if sep else "PLAINTEXT"


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``PLAINTEXT://HOST:PORT`` or ``SASL_PLAINTEXT://HOST:PORT`` (an IPv6
    host in brackets) as (host, port); ValueError if it is not one."""
    scheme, sep, rest = text.partition("://")
    if sep:
        if scheme.upper() not in SCHEMES:
            raise ValueError(f"{text!r}: only {' and '.join(SCHEMES)} listeners are served")
        text = rest
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def serve(
    listen: str = DEFAULT_LISTEN, advertised: str | None = None, metrics: str | None = None
) -> None:
    """Serve until SIGTERM or SIGINT; with ``metrics``, /metrics for Prometheus there. A
    ``SASL_PLAINTEXT`` listener takes SASL/PLAIN with ``kip98 users``' users first
    (``app.server.sasl``)."""
    host, port = parse_address(listen)
    ad_host, ad_port = parse_address(advertised or listen)
    sasl = listener_scheme(listen) == "SASL_PLAINTEXT"
    server = Server(Broker.connect(), Node(ad_host, ad_port, CLUSTER_ID), (host, port), sasl=sasl)
    if metrics is not None:
        expose(server, parse_address(metrics))
    # What is loaded by now lives as long as the process. Out of the collector's sight, it
    # is not walked again by every full collection, which the records of each request,
    # thousands of tuples alive until it is answered, would otherwise set off every few
    # requests. For the same reason the youngest generation is collected after 20,000
    # allocations rather than 700: a fetch of 1 MB builds some 8,000 record tuples, alive
    # until it is answered, and collections every 700 of them cost 6% of its time.
    gc.freeze()
    gc.set_threshold(20_000)
    asyncio.run(server.serve_until_stopped())
