"""WriteTxnMarkers (API 27), what Kafka's Admin.abortTransaction sends (KIP-664), asked of
kip98 and Kafka alike: each partition answered with its own error, a stale producer or
coordinator epoch refused, an open transaction aborted and the LSO released."""

from __future__ import annotations

from typing import Any

from tests.conformance.harness import Target, run_both
from tests.conformance.normalise import error_name, lso_relation
from tests.conformance.raw_calls import call
from tests.conformance.requests import (
    LATEST,
    READ_COMMITTED,
    add_partitions,
    batch,
    init_producer_id,
    list_offsets,
    produce,
)

WRITE_TXN_MARKERS = 27


def write_marker(
    target: Target, producer_id: int, epoch: int, coordinator_epoch: int,
    topic: str, partitions: list[int], commit: bool = False,
) -> list[str]:  # fmt: skip
    """One marker (v1, as the Admin sends it); each partition's error by name, in order."""
    answer = call(target, WRITE_TXN_MARKERS, 1, {"markers": [
        {"producer_id": producer_id, "producer_epoch": epoch, "transaction_result": commit,
         "coordinator_epoch": coordinator_epoch,
         "topics": [{"name": topic, "partition_indexes": partitions}]},
    ]})  # fmt: skip
    (marker,) = answer.markers
    assert marker.producer_id == producer_id
    return [error_name(p.error_code) for t in marker.topics for p in t.partitions]


def scenario_abort_an_open_transaction(target: Target) -> Any:
    topic = target.create_topic("markers")
    txid = target.name_for("markers")
    init_producer_id(target, txid)
    again = init_producer_id(target, txid)  # epoch 1: an epoch 0 is then stale
    pid, epoch = again.producer_id, again.producer_epoch
    assert add_partitions(target, txid, pid, epoch, topic) == [0]
    written = produce(target, topic, batch(["a", "b"], pid, epoch, 0, True), transactional_id=txid)
    observed: dict[str, Any] = {"produce": error_name(written.error_code), "epoch": epoch}

    def relation() -> str:
        lso = list_offsets(target, topic, LATEST, READ_COMMITTED).offset
        return lso_relation(lso, list_offsets(target, topic, LATEST).offset)

    observed["open"] = relation()
    observed["stale_epoch"] = write_marker(target, pid, epoch - 1, 0, topic, [0])
    observed["unknown_partition"] = write_marker(target, pid, epoch, 0, topic, [5])
    observed["still_open"] = relation()
    observed["abort"] = write_marker(target, pid, epoch, 0, topic, [0])
    observed["aborted"] = relation()
    observed["stale_coordinator_epoch"] = write_marker(target, pid, epoch, -1, topic, [0])
    return observed


EXPECTED = {
    "produce": "NONE", "epoch": 1, "open": "lso<hw",
    "stale_epoch": ["INVALID_PRODUCER_EPOCH"],
    "unknown_partition": ["UNKNOWN_TOPIC_OR_PARTITION"], "still_open": "lso<hw",
    "abort": ["NONE"], "aborted": "lso==hw",
    "stale_coordinator_epoch": ["TRANSACTION_COORDINATOR_FENCED"],
}  # fmt: skip


def test_write_txn_markers(targets: tuple[Target, Target]) -> None:
    on_kip98, on_kafka = run_both(scenario_abort_an_open_transaction, *targets)
    assert on_kafka == EXPECTED
    assert on_kip98 == on_kafka
