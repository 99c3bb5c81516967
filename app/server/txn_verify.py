"""AddPartitionsToTxn v4+, the partition leader's form (KIP-890): a transaction's
partitions checked (``verify_only``) as Kafka's coordinator checks them, and the answer's
per-topic shape, shared with a client's v0-3.

Kafka's partition leaders send it to the coordinator; kip98's write path registers a
transaction's partitions itself, in the produce's DB transaction, so only a tool or a
test sends it to ``kip98 serve``. It is answered as Kafka answers it, for a caller allowed
ClusterAction on the cluster.
"""

from __future__ import annotations

from typing import Any

from app.errors import KafkaError
from app.protocol import TopicPartitionKey, TransactionStateResult

# KIP-430's bit of ClusterAction (AclOperation 7) in the cluster's authorized operations.
CLUSTER_ACTION_BIT = 1 << 7

_PREPARE = ("PREPARE_COMMIT", "PREPARE_ABORT")


def verified(
    found: TransactionStateResult,
    producer_id: int,
    producer_epoch: int,
    wanted: list[TopicPartitionKey],
) -> dict[TopicPartitionKey, int]:
    """Each partition's answer to a verification: in the transaction or not
    (TRANSACTION_ABORTABLE), once the identity matches the transaction's
    (INVALID_PRODUCER_ID_MAPPING, PRODUCER_FENCED) and it is not completing
    (CONCURRENT_TRANSACTIONS), as Kafka's coordinator answers."""
    d = found.description
    if d is None:
        code = (
            KafkaError.INVALID_PRODUCER_ID_MAPPING
            if found.error_code in (KafkaError.NO_ERROR, KafkaError.TRANSACTIONAL_ID_NOT_FOUND)
            else found.error_code
        )
        return dict.fromkeys(wanted, code)
    if d.producer_id != producer_id:
        return dict.fromkeys(wanted, KafkaError.INVALID_PRODUCER_ID_MAPPING)
    if d.producer_epoch != producer_epoch:
        return dict.fromkeys(wanted, KafkaError.PRODUCER_FENCED)
    if d.state in _PREPARE:
        return dict.fromkeys(wanted, KafkaError.CONCURRENT_TRANSACTIONS)
    inside = set(d.partitions) if d.state == "BEGIN" else set()
    return {
        tp: KafkaError.NO_ERROR if tp in inside else KafkaError.TRANSACTION_ABORTABLE
        for tp in wanted
    }


def topic_results(codes: dict[TopicPartitionKey, int]) -> list[dict[str, Any]]:
    """``codes`` as AddPartitionsToTxn's results by topic, in the request's order."""
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), code in codes.items():
        by_topic.setdefault(topic, []).append(
            {"partition_index": partition, "partition_error_code": code}
        )
    return [{"name": t, "results_by_partition": r} for t, r in by_topic.items()]
