"""Kafka's Java consumer under read_committed against kip98 and Kafka: never an aborted or
open record, endOffsets and seekToEnd stop at the LSO; and its consumer group protocol
(KIP-848, ``group.protocol=consumer``)."""

from __future__ import annotations

from typing import Any

from tests.conformance.harness import Target, same
from tests.java.build import run


def test_read_committed_stops_at_the_lso(
    targets: tuple[Target, Target], java_classpath: str
) -> None:
    def scenario(target: Target) -> Any:
        topic = target.create_topic("jrc")
        txid = target.name_for("jtx")
        return run(java_classpath, "Consumers", target.bootstrap, "read-committed", topic, txid)

    same(scenario, *targets)


def test_the_consumer_group_protocol_shares_and_moves_partitions(
    targets: tuple[Target, Target], java_classpath: str
) -> None:
    """Two Java consumers of ``group.protocol=consumer`` share a topic's two partitions
    (never one held by both), read each record once, and the one left takes both when the
    other leaves (docs/design.md rules 60, 61)."""

    def scenario(target: Target) -> Any:
        topic = target.create_topic("jcg", 2)
        group = target.name_for("jcg")
        txid = target.name_for("jtx")
        return run(
            java_classpath, "Consumers", target.bootstrap, "group-protocol", topic, group, txid
        )

    same(scenario, *targets)
