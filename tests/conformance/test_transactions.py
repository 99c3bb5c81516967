"""Transactions (KIP-98, KIP-447, KIP-890): what a transactional producer and its readers
observe, written once and run against kip98 serve and Apache Kafka."""

from __future__ import annotations

from typing import Any

import confluent_kafka as ck

from tests.conformance.harness import Target, same
from tests.conformance.normalise import records
from tests.wire_client import consume_all


def read_all(target: Target, topic: str, isolation: str, want: int) -> list[Any]:
    """The first ``want`` records of partition 0, read by a fresh consumer."""
    consumer = ck.Consumer(
        target.config(**{
            "group.id": target.name_for("reader"), "isolation.level": isolation,
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
        })
    )  # fmt: skip
    consumer.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
    try:
        return records(consume_all(consumer, want))
    finally:
        consumer.close()


def scenario_commit_and_abort(target: Target) -> Any:
    """A committed transaction, an aborted one and a committed one again: read_committed
    sees the committed records only, read_uncommitted all of them."""
    topic = target.create_topic("txn")
    producer = ck.Producer(target.config(**{"transactional.id": target.name_for("tid")}))
    producer.init_transactions(30)
    for outcome, values in (("commit", "ab"), ("abort", "cd"), ("commit", "e")):
        producer.begin_transaction()
        for v in values:
            producer.produce(topic, v.encode(), key=b"k", partition=0, headers={"h": b"1"})
        producer.flush(30)
        if outcome == "commit":
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    return {
        "read_committed": read_all(target, topic, "read_committed", 3),
        "read_uncommitted": read_all(target, topic, "read_uncommitted", 5),
    }


def test_read_committed_sees_committed_transactions_only(targets: tuple[Target, Target]) -> None:
    same(scenario_commit_and_abort, *targets)
