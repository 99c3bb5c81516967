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
from app.server.address import Listener
from app.server.answer import Node
from app.server.listener import Server
from app.server.metrics import expose

__all__ = ["Listener", "Node", "Server", "serve"]

DEFAULT_LISTEN = "PLAINTEXT://127.0.0.1:9092"
CLUSTER_ID = "kip98"


def serve(
    listen: str = DEFAULT_LISTEN, advertised: str | None = None, metrics: str | None = None
) -> None:
    """Serve until SIGTERM or SIGINT; with ``metrics``, /metrics for Prometheus there. A
    ``SASL_PLAINTEXT`` listener takes SASL/PLAIN with ``kip98 users``' users first
    (``app.server.sasl``)."""
    listener = Listener.parse(listen)
    shown = Listener.parse(advertised or listen)
    server = Server(Broker.connect(), Node(shown.host, shown.port, CLUSTER_ID), listener)
    if metrics is not None:
        expose(server, Listener.parse(metrics).address)
    # What is loaded by now lives as long as the process. Out of the collector's sight, it
    # is not walked again by every full collection, which the records of each request,
    # thousands of tuples alive until it is answered, would otherwise set off every few
    # requests. For the same reason the youngest generation is collected after 20,000
    # allocations rather than 700: a fetch of 1 MB builds some 8,000 record tuples, alive
    # until it is answered, and collections every 700 of them cost 6% of its time.
    gc.freeze()
    gc.set_threshold(20_000)
    asyncio.run(server.serve_until_stopped())
