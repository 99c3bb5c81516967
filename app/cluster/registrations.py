"""Who is in the cluster: the ``kip98 serve`` nodes' registrations, each kept alive by its
node's heartbeats (docs/design.md rule 46).

A registration is a row with a lease: its node renews it at least once a second, and it
lapses ``node_session_timeout_ms`` after the last renewal. The live nodes are the rows
whose lease has not lapsed, by the reader's clock, so a node killed outright drops out of
every answer within the session timeout, whoever reads; a node that stops cleanly removes
its row at once. Lapsed rows are removed by the next node to heartbeat (or register), or
by the first reader that finds one, in the same kind of DB transaction as a registration:
every change of who is in the cluster is serialised by the table lock (``sql.LOCK``), so
a free node id is claimed by one node only and each change sees the one before, and it
commits the leader epochs and group sessions it moves (rules 40, 48).

Time is the injectable clock's; the nodes sharing a database must keep their clocks
close (within a fraction of the session timeout), as the coordinator loops' leases ask.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Row

from app.cluster import sql
from app.errors import KafkaError, KafkaException, fail
from app.groups.membership import coordinator_moved, group_ids
from app.log.leader_epoch import bump_leader_epochs
from app.placement import coordinator, leaders, moved_leaders
from app.protocol import (
    ANY_NODE_ID,
    COORDINATOR_GROUP,
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    BrokerRegistrationRequest,
    BrokerRegistrationResponse,
    ClusterNode,
    DescribeClusterRequest,
    DescribeClusterResponse,
    NodeEndpoint,
    UnregisterBrokerRequest,
    UnregisterBrokerResponse,
)
from app.storage.context import BrokerContext
from app.storage.engine import retry_conflicts

log = logging.getLogger(__name__)


def register(broker: BrokerContext, req: BrokerRegistrationRequest) -> BrokerRegistrationResponse:
    """The node joins with ``req.node_id``, or the smallest id no live node holds. A live
    node's id is DUPLICATE_BROKER_REGISTRATION, nothing written."""
    try:
        node_id = _register(broker, req)
    except KafkaException as exc:
        return BrokerRegistrationResponse(exc.error.code(), error_message=exc.error.str())
    return BrokerRegistrationResponse(KafkaError.NO_ERROR, node_id)


@retry_conflicts
def _register(broker: BrokerContext, req: BrokerRegistrationRequest) -> int:
    now = broker.clock.now_ms()
    with broker.engine.begin() as conn:
        conn.execute(sql.LOCAL_COMMIT)
        rows = _lock_rows(conn)
        live = {r.node_id: r for r in rows if r.expires_ms > now}
        node_id = req.node_id
        if node_id == ANY_NODE_ID:
            node_id = smallest_free(list(live))
        holder = live.get(node_id)
        if holder is not None and str(holder.incarnation) != req.incarnation:
            raise fail(
                KafkaError.DUPLICATE_BROKER_REGISTRATION,
                f"node id {node_id} is held by a live node ({_where(holder)}) until its "
                "lease lapses",
            )
        conn.execute(sql.DELETE_LAPSED, {"now": now})
        listeners = {e.security_protocol: {"host": e.host, "port": e.port} for e in req.endpoints}
        registered = conn.execute(
            sql.REGISTER,
            {
                "node_id": node_id, "incarnation": req.incarnation, "rack": req.rack,
                "listeners": json.dumps(listeners), "host": req.host, "pid": req.pid,
                "now": now, "expires_ms": now + broker.settings.node_session_timeout_ms,
            },
        ).first()  # fmt: skip
        if registered is None:  # unreachable under the lock; never overwrite another's row
            raise fail(KafkaError.DUPLICATE_BROKER_REGISTRATION, f"node id {node_id} is held")
        _live_nodes_changed(conn, [r.node_id for r in rows], [*live, node_id], now)
    log.info("node %d registered (%s)", node_id, req.incarnation)
    return node_id


def heartbeat(broker: BrokerContext, req: BrokerHeartbeatRequest) -> BrokerHeartbeatResponse:
    """The registration's lease renewed; lapsed registrations of other nodes removed."""
    now = broker.clock.now_ms()
    with broker.engine.begin() as conn:
        conn.execute(sql.LOCAL_COMMIT)
        row = conn.execute(
            sql.HEARTBEAT,
            {
                "node_id": req.node_id, "incarnation": req.incarnation, "now": now,
                "expires_ms": now + broker.settings.node_session_timeout_ms,
                "requests": req.requests,
            },
        ).one()  # fmt: skip
    if row.lapsed:
        remove_lapsed(broker)
    if not row.renewed:
        return BrokerHeartbeatResponse(
            KafkaError.STALE_BROKER_EPOCH,
            f"node {req.node_id}'s registration {req.incarnation} is gone or has lapsed",
        )
    return BrokerHeartbeatResponse(KafkaError.NO_ERROR)


@retry_conflicts
def remove_lapsed(broker: BrokerContext) -> list[int]:
    """Remove the registrations whose lease has lapsed; their node ids."""
    now = broker.clock.now_ms()
    with broker.engine.begin() as conn:
        conn.execute(sql.LOCAL_COMMIT)
        rows = _lock_rows(conn)
        lapsed = [r.node_id for r in rows if r.expires_ms <= now]
        if lapsed:
            conn.execute(sql.DELETE_LAPSED, {"now": now})
            _live_nodes_changed(
                conn,
                [r.node_id for r in rows],
                [r.node_id for r in rows if r.expires_ms > now],
                now,
            )
    if lapsed:
        log.info("nodes %s left the cluster: their registrations lapsed", lapsed)
    return lapsed


@retry_conflicts
def unregister(broker: BrokerContext, req: UnregisterBrokerRequest) -> UnregisterBrokerResponse:
    """The node leaves at once. Another's registration of the same id is left alone."""
    now = broker.clock.now_ms()
    with broker.engine.begin() as conn:
        conn.execute(sql.LOCAL_COMMIT)
        rows = _lock_rows(conn)
        mine = [
            r for r in rows if r.node_id == req.node_id and str(r.incarnation) == req.incarnation
        ]
        if not mine:
            return UnregisterBrokerResponse(
                KafkaError.STALE_BROKER_EPOCH,
                f"node {req.node_id}'s registration {req.incarnation} is gone",
            )
        conn.execute(sql.UNREGISTER, {"node_id": req.node_id, "incarnation": req.incarnation})
        conn.execute(sql.DELETE_LAPSED, {"now": now})
        after = [r.node_id for r in rows if r.expires_ms > now and r.node_id != req.node_id]
        _live_nodes_changed(conn, [r.node_id for r in rows], after, now)
    log.info("node %d unregistered", req.node_id)
    return UnregisterBrokerResponse(KafkaError.NO_ERROR)


def partitions_added(conn: Connection, topic: str, before: int, after: int) -> None:
    """``topic`` grew from ``before`` to ``after`` partitions in this DB transaction. The
    leaders' bound grows with a topic (``placement.leader_cap``), which can move the leader
    of a partition it had: each such gets a new leader epoch, as a change of nodes gives
    (docs/design.md rule 40), with no change of nodes in between (``sql.HOLD_STILL``)."""
    conn.execute(sql.HOLD_STILL)
    nodes = [r.node_id for r in conn.execute(sql.ALL)]
    if not nodes:  # no leader to move: the first node to register bumps every partition
        return
    was, now = leaders(topic, before, nodes), leaders(topic, after, nodes)
    bump_leader_epochs(conn, [(topic, p) for p in range(before) if was[p] != now[p]])


def describe_cluster(broker: BrokerContext, req: DescribeClusterRequest) -> DescribeClusterResponse:
    """The live nodes, by node id. A lapsed registration is removed before it is left out
    (``remove_lapsed``), so no answer places leaders over a live set whose leader epochs
    were not bumped yet (docs/design.md rule 40)."""
    now = broker.clock.now_ms()
    with broker.engine.connect() as conn:
        rows = conn.execute(sql.ALL).all()
    if any(r.expires_ms <= now for r in rows):
        remove_lapsed(broker)
        with broker.engine.connect() as conn:
            rows = conn.execute(sql.ALL).all()
    return DescribeClusterResponse([cluster_node(r) for r in rows if r.expires_ms > now])


def smallest_free(held: Sequence[int]) -> int:
    """The smallest node id not in ``held``."""
    taken = set(held)
    return next(n for n in range(len(taken) + 1) if n not in taken)


def cluster_node(row: Row[Any]) -> ClusterNode:
    endpoints = tuple(
        NodeEndpoint(protocol, address["host"], int(address["port"]))
        for protocol, address in sorted(row.listeners.items())
    )
    return ClusterNode(
        row.node_id, endpoints, row.rack, row.host, row.pid, row.registered_ms,
        row.heartbeat_ms, row.expires_ms, row.requests,
    )  # fmt: skip


def _lock_rows(conn: Connection) -> list[Row[Any]]:
    conn.execute(sql.LOCK)
    return list(conn.execute(sql.ALL))


def _where(row: Row[Any]) -> str:
    listeners = ", ".join(
        f"{protocol}://{address['host']}:{address['port']}"
        for protocol, address in sorted(row.listeners.items())
    )
    return f"{listeners}; process {row.pid} on {row.host}"


def _live_nodes_changed(conn: Connection, before: list[int], after: list[int], now: int) -> None:
    """Who is in the cluster changed from ``before`` (every registration there was, the
    set leadership was last placed over) to ``after``, in this DB transaction, under the
    table lock: each partition whose leader moved gets a new leader epoch, beginning at
    its log end (docs/design.md rule 40), and each group whose coordinator moved gives its
    members a fresh session (rule 48), committed with the change itself."""
    topics = [(r.topic, r.num_partitions) for r in conn.execute(sql.TOPIC_PARTITIONS)]
    moved = moved_leaders(topics, before, after)
    if moved:
        bump_leader_epochs(conn, moved)
        log.info("leadership of %d partitions moved (nodes %s -> %s)", len(moved), before, after)
    if before and after:
        groups = [
            g for g in group_ids(conn)
            if coordinator(COORDINATOR_GROUP, g, before) != coordinator(COORDINATOR_GROUP, g, after)
        ]  # fmt: skip
        coordinator_moved(conn, groups, now)
