"""The Kafka APIs of KIP-664's transaction tooling: ListTransactions, DescribeTransactions,
DescribeProducers and WriteTxnMarkers (Admin.abortTransaction's), onto the broker's requests. The wire names a transaction's state as
Kafka's coordinator does (``Ongoing``, ``PrepareCommit``, ...)."""

from __future__ import annotations

from typing import Any

from app.broker import Broker
from app.protocol import (
    KAFKA_STATES,
    STATES_BY_KAFKA_NAME,
    DescribeProducersRequest,
    DescribeTransactionsRequest,
    ListTransactionsRequest,
    WriteTxnMarkersRequest,
)
from app.server.node import Node

EMPTY = "Empty"
NO_START_TIME = -1


def _kafka_state(state: str) -> str:
    return KAFKA_STATES.get(state, state)


def list_transactions(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    """An empty state or producer filter is no filter, as in Kafka."""
    asked = list(request.state_filters)
    unknown = [s for s in asked if s not in STATES_BY_KAFKA_NAME]
    states = [STATES_BY_KAFKA_NAME[s] for s in asked if s in STATES_BY_KAFKA_NAME]
    if asked and not states:  # only unknown states: none matches
        return {"error_code": 0, "unknown_state_filters": unknown, "transaction_states": []}
    a = broker.handle(
        ListTransactionsRequest(
            states or None, list(request.producer_id_filters),
            getattr(request, "duration_filter", -1),
        )
    )  # fmt: skip
    listed = [
        {"transactional_id": t.transactional_id, "producer_id": t.producer_id,
         "transaction_state": _kafka_state(t.state)}
        for t in a.transaction_states
    ]  # fmt: skip
    return {"error_code": a.error_code, "unknown_state_filters": unknown,
            "transaction_states": listed}  # fmt: skip


def describe_transactions(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    a = broker.handle(DescribeTransactionsRequest(list(request.transactional_ids)))
    states = []
    for t in a.transaction_states:
        d = t.description
        if d is None:
            states.append(
                {"error_code": t.error_code, "transactional_id": t.transactional_id,
                 "transaction_state": "", "transaction_timeout": 0,
                 "producer_id": -1, "producer_epoch": -1,
                 "topics": []}
            )  # fmt: skip
            continue
        by_topic: dict[str, list[int]] = {}
        for topic, partition in d.partitions:
            by_topic.setdefault(topic, []).append(partition)
        state = _kafka_state(d.state)
        # Kafka's Empty id has no transaction, so no start time: -1 (the coordinator keeps
        # its own for the timeout of the next one).
        started = NO_START_TIME if state == EMPTY else d.txn_start_ms
        states.append(
            {"error_code": t.error_code, "transactional_id": d.transactional_id,
             "transaction_state": state, "transaction_timeout": d.timeout_ms,
             "transaction_start_time": started, "producer_id": d.producer_id,
             "producer_epoch": d.producer_epoch,
             "topics": [{"topic": topic, "partitions": p} for topic, p in by_topic.items()]}
        )  # fmt: skip
    return {"transaction_states": states}


def describe_producers(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    asked = [(t.name, p) for t in request.topics for p in t.partition_indexes]
    answers = [broker.handle(DescribeProducersRequest([tp])).partitions[0] for tp in asked]
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for p in answers:
        producers = [
            {"producer_id": s.producer_id, "producer_epoch": s.producer_epoch,
             "last_sequence": s.last_sequence, "last_timestamp": s.last_timestamp,
             "coordinator_epoch": s.coordinator_epoch,
             "current_txn_start_offset": s.current_transaction_start_offset}
            for s in p.active_producers
        ]  # fmt: skip
        by_topic.setdefault(p.topic, []).append(
            {"partition_index": p.partition, "error_code": p.error_code,
             "error_message": p.error_message, "active_producers": producers}
        )  # fmt: skip
    return {"topics": [{"name": t, "partitions": p} for t, p in by_topic.items()]}


def write_txn_markers(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    """Each marker on its partitions, each partition answered with its own error code, in
    the request's order (Kafka's WriteTxnMarkers). Admin.abortTransaction sends one ABORT
    with the producer's id and epoch and a coordinator epoch, for one partition."""
    markers = []
    for m in request.markers:
        asked = [(t.name, p) for t in m.topics for p in t.partition_indexes]
        a = broker.handle(
            WriteTxnMarkersRequest(
                m.producer_id, m.producer_epoch, m.coordinator_epoch,
                bool(m.transaction_result), asked,
            )
        )  # fmt: skip
        topics = [
            {"name": t.name,
             "partitions": [{"partition_index": p, "error_code": a.results[(t.name, p)]}
                            for p in t.partition_indexes]}
            for t in m.topics
        ]  # fmt: skip
        markers.append({"producer_id": m.producer_id, "topics": topics})
    return {"markers": markers}
