"""The Kafka wire protocol: a second front end of ``Broker.handle``, so any Kafka client
(librdkafka, kafka-python, aiokafka, kcat) runs against kip98 unchanged.

``codec`` reads and writes Kafka's frames and entities (kio), ``records`` the record
batches (aiokafka's record module), ``apis`` maps each API onto the broker's requests (the
admin APIs in ``topic_apis``, ``acl_apis``, ``txn_apis``), and
``listener`` is the asyncio server; ``kip98 serve`` and ``python -m app.server`` run it.
Each server is a node of a cluster over its database (``registration``; Metadata and
FindCoordinator spread clients over the live nodes, ``cluster_apis``), and ``processes``
runs several on the same listeners, one per core.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import ssl
from dataclasses import replace

from app.broker import Broker
from app.protocol import ANY_NODE_ID
from app.server.address import Listener, advertised_for
from app.server.listener import Endpoint, Server
from app.server.metrics import expose
from app.server.node import Member, Node
from app.server.registration import Registration, ServeError
from app.settings import BrokerSettings

__all__ = ["Endpoint", "Listener", "Node", "ServeError", "Server", "endpoints_of", "serve"]

DEFAULT_LISTEN = "PLAINTEXT://127.0.0.1:9092"
CLUSTER_ID = "kip98"


def endpoints_of(
    listens: list[str], advertised: list[str], rack: str | None = None
) -> list[Endpoint]:
    """Each ``--listen`` with the node it advertises (``--advertised-listener`` of its
    protocol, or itself), all of one node (in ``rack``). ValueError for an address that
    is not one, a protocol listened on twice, or an advertised address without a
    listener of its protocol."""
    listeners = [Listener.parse(text) for text in listens]
    shown = advertised_for(
        listeners,
        [Listener.parse(text) for text in advertised],
        bare=len(advertised) == 1 and "://" not in advertised[0],
    )
    member = Member(rack=rack)
    endpoints = []
    for listener in listeners:
        at = shown[listener]
        node = Node(at.host, at.port, CLUSTER_ID, listener.security_protocol, member)
        endpoints.append(Endpoint(listener, node))
    return endpoints


def serve(
    endpoints: list[Endpoint],
    metrics: str | None = None,
    tls: ssl.SSLContext | None = None,
    super_users: list[str] | None = None,
    node_id: int = ANY_NODE_ID,
    sockets: list[socket.socket] | None = None,
    replica_url: str | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT on ``endpoints`` (``endpoints_of``), as node
    ``node_id`` of the database's cluster (``ANY_NODE_ID``: the database assigns one);
    with ``metrics``, /metrics for Prometheus there. SASL listeners take ``kip98 users``'
    users first (``app.server.sasl``); SSL ones use ``tls`` (``app.server.tls``).
    ``super_users`` replace ``KIP98_SUPER_USERS``; ``sockets``: the endpoints' sockets,
    bound already (``processes``); ``replica_url``: a standby whose Fetches read there
    (``app.broker.follower``). ServeError if a listener cannot bind or the node id is
    held by a live node."""
    settings = BrokerSettings.from_env()
    if super_users:
        settings = replace(settings, super_users=",".join(super_users))
    broker = Broker.connect(settings=settings, replica_url=replica_url)
    server = Server(broker, endpoints, tls=tls, sockets=sockets)
    registration = Registration(broker, endpoints[0].node.member, node_id, lambda: server.answered)
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
    asyncio.run(server.serve_until_stopped(registration))
