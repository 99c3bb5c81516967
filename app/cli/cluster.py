"""``kip98 cluster describe``: the live ``kip98 serve`` nodes sharing the database.

For each: its listeners (advertised addresses by protocol), rack, where it runs, when it
registered, its last heartbeat, and how many partitions it leads, worked out as every
node works them out (``app.placement``, over every live node). The same rows, but for
the partitions led, are the SQL view ``cluster_nodes``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click

from app import placement
from app.broker import Broker
from app.cli.output import emit, output_option
from app.protocol import ClusterNode, DescribeClusterRequest, MetadataRequest

COLUMNS = [
    "node_id",
    "listeners",
    "rack",
    "host",
    "pid",
    "since",
    "last_heartbeat",
    "partitions_led",
    "controller",
]


@click.group("cluster")
def cluster_group() -> None:
    """The serve nodes: the kip98 serve processes sharing this database (its primary and
    standbys are kip98 db's)."""


@cluster_group.command()
@output_option
def describe(output: str) -> None:
    """Every live serve node: listeners, rack, since, last heartbeat, partitions led."""
    broker = Broker.connect()
    nodes = broker.handle(DescribeClusterRequest()).nodes
    ids = [n.node_id for n in nodes]
    led = dict.fromkeys(ids, 0)
    for topic in broker.handle(MetadataRequest(None)).topics:
        for leader in placement.leaders(topic.topic, topic.num_partitions, ids):
            led[leader] += 1
    controller = placement.controller(ids)
    rows = [_row(n, led[n.node_id], n.node_id == controller, output) for n in nodes]
    emit(rows, output, columns=COLUMNS)


def _row(node: ClusterNode, led: int, controller: bool, output: str) -> dict[str, Any]:
    listeners = {e.security_protocol: f"{e.host}:{e.port}" for e in node.endpoints}
    if output == "json":
        return {
            "node_id": node.node_id, "listeners": listeners, "rack": node.rack,
            "host": node.host, "pid": node.pid, "since": _time(node.registered_ms),
            "last_heartbeat": _time(node.heartbeat_ms),
            "lease_expires": _time(node.expires_ms), "requests": node.requests,
            "partitions_led": led, "controller": controller,
        }  # fmt: skip
    return {
        "node_id": node.node_id,
        "listeners": " ".join(f"{p}://{a}" for p, a in listeners.items()),
        "rack": node.rack or "-", "host": node.host, "pid": node.pid,
        "since": _time(node.registered_ms), "last_heartbeat": _time(node.heartbeat_ms),
        "partitions_led": led, "controller": "yes" if controller else "",
    }  # fmt: skip


def _time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
