"""The cluster as a Kafka client sees it, and DescribeCluster.

The live nodes are read from their registrations at each request that names nodes
(Metadata, FindCoordinator, DescribeCluster), so a node that stopped is gone from the
next answer. A client is given each node's address for the listener it came in on (the
listeners are named by security protocol); nodes without one are left out. Leaders,
coordinators and the controller are ``app.placement``'s, so every node answers alike.
With no node registered (a server run without registering, or every registration
lapsed) the node names itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app import placement
from app.broker import Broker
from app.protocol import (
    CLUSTER,
    CLUSTER_NAME,
    AuthorizedOperationsRequest,
    ClusterNode,
    DescribeClusterRequest,
    NodeEndpoint,
)
from app.server.answer import NO_OPERATIONS
from app.server.node import Node

# DescribeCluster's endpoint types: brokers (1) are what a broker describes; asked for the
# controllers (2), Kafka's brokers answer UNSUPPORTED_ENDPOINT_TYPE.
BROKERS_ENDPOINT = 1
UNSUPPORTED_ENDPOINT_TYPE = 120


@dataclass(frozen=True)
class ClusterView:
    """The live nodes a client of one listener can reach, by node id, with their address
    on that listener."""

    nodes: dict[int, tuple[ClusterNode, NodeEndpoint]]

    @property
    def node_ids(self) -> list[int]:
        return list(self.nodes)

    @property
    def controller_id(self) -> int:
        controller = placement.controller(self.nodes)
        return -1 if controller is None else controller

    def brokers(self) -> list[dict[str, Any]]:
        """Metadata's broker entries."""
        return [
            {"node_id": node_id, "host": e.host, "port": e.port, "rack": n.rack}
            for node_id, (n, e) in self.nodes.items()
        ]

    def partitions(self, topic: str, leader_epochs: Sequence[int]) -> list[dict[str, Any]]:
        """Metadata's partition entries of ``topic``, one per leader epoch: each one's
        leader and epoch, then every live node as its replicas and in-sync replicas (they
        all serve the same storage)."""
        entries = []
        leaders = placement.leaders(topic, len(leader_epochs), self.nodes)
        for p, (leader, epoch) in enumerate(zip(leaders, leader_epochs, strict=True)):
            replicas = [leader, *(n for n in self.nodes if n != leader)]
            entries.append(
                {"error_code": 0, "partition_index": p, "leader_id": leader, "leader_epoch": epoch,
                 "replica_nodes": replicas, "isr_nodes": replicas, "offline_replicas": []}
            )  # fmt: skip
        return entries

    def coordinator(self, key_type: int, key: str) -> tuple[int, NodeEndpoint]:
        """The node coordinating a group or transactional id, and its address."""
        node_id = placement.coordinator(key_type, key, self.nodes)
        assert node_id is not None, "a view always has a node"
        return node_id, self.nodes[node_id][1]


def cluster_view(broker: Broker, node: Node) -> ClusterView:
    """The live nodes reachable on ``node``'s listener; just ``node`` if there are none."""
    protocol = node.security_protocol
    reachable: dict[int, tuple[ClusterNode, NodeEndpoint]] = {}
    for n in broker.handle(DescribeClusterRequest()).nodes:
        endpoint = n.endpoint(protocol)
        if endpoint is not None:
            reachable[n.node_id] = (n, endpoint)
    if not reachable:
        endpoint = NodeEndpoint(protocol, node.host, node.port)
        itself = ClusterNode(node.member.node_id, (endpoint,), node.member.rack)
        reachable[itself.node_id] = (itself, endpoint)
    return ClusterView(reachable)


def authorized_operations(broker: Broker, resource_type: str, names: list[str]) -> dict[str, int]:
    """KIP-430's bit field of each resource, for the answers that carry it when asked."""
    return broker.handle(AuthorizedOperationsRequest(resource_type, tuple(names))).operations


def cluster_operations(broker: Broker, asked: bool) -> int:
    """The cluster's authorized operations if the client asked for them, else Kafka's
    "not given" value."""
    if not asked:
        return NO_OPERATIONS
    return authorized_operations(broker, CLUSTER, [CLUSTER_NAME])[CLUSTER_NAME]


def describe_cluster(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    """Kafka's DescribeCluster (``AdminClient.describe_cluster()``): the live nodes, as
    Metadata lists them, and the cluster's authorized operations when asked (KIP-430)."""
    cluster_id = node.cluster_id
    if getattr(request, "endpoint_type", BROKERS_ENDPOINT) != BROKERS_ENDPOINT:
        return {"error_code": UNSUPPORTED_ENDPOINT_TYPE, "cluster_id": cluster_id, "brokers": [],
                "error_message": "a broker describes brokers only"}  # fmt: skip
    view = cluster_view(broker, node)
    brokers = [
        {"broker_id": node_id, "host": e.host, "port": e.port, "rack": n.rack}
        for node_id, (n, e) in view.nodes.items()
    ]
    return {
        "error_code": 0, "cluster_id": cluster_id, "controller_id": view.controller_id,
        "brokers": brokers, "endpoint_type": BROKERS_ENDPOINT,
        "cluster_authorized_operations": cluster_operations(
            broker, request.include_cluster_authorized_operations
        ),
    }  # fmt: skip
