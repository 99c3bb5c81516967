"""Kafka's Java producer, idempotent and transactional, against kip98 and Kafka: the same
observations from each (tests/conformance's ``same``)."""

from __future__ import annotations

from typing import Any

from tests.conformance.harness import Target, same
from tests.java.build import run


def test_transactions_commit_abort_and_fencing(
    targets: tuple[Target, Target], java_classpath: str
) -> None:
    """An idempotent producer's offsets; committed and aborted transactions as each
    isolation reads them (markers at their offsets); the older instance of a transactional
    id is refused (ProducerFencedException) and its open transaction aborted."""

    def scenario(target: Target) -> Any:
        topic = target.create_topic("jtxn")
        fenced = target.create_topic("jfenced")
        txid = target.name_for("jtx")
        return run(
            java_classpath, "Producers", target.bootstrap, "transactions", topic, fenced, txid
        )

    same(scenario, *targets)


def test_send_offsets_to_transaction(targets: tuple[Target, Target], java_classpath: str) -> None:
    """Consume-transform-produce with the consumer's group metadata: the offsets commit
    with the transaction; committed() under read_committed (requireStable) waits while they
    are pending (its own timeout) and then reads them."""

    def scenario(target: Target) -> Any:
        source = target.create_topic("jin")
        sink = target.create_topic("jout")
        group, txid = target.name_for("jgroup"), target.name_for("jtx")
        return run(
            java_classpath, "Producers", target.bootstrap, "send-offsets", source, sink, group, txid
        )

    same(scenario, *targets)


def test_transaction_timeout(targets: tuple[Target, Target], java_classpath: str) -> None:
    """A transaction left open past transaction.timeout.ms is aborted by the coordinator
    (kip98 serve runs its timers): the LSO moves past the abort marker, the records are
    aborted, and the producer's commit afterwards is refused as Kafka refuses it."""

    def scenario(target: Target) -> Any:
        topic = target.create_topic("jtimeout")
        txid = target.name_for("jtx")
        return run(java_classpath, "Producers", target.bootstrap, "timeout", topic, txid)

    same(scenario, *targets)


def test_the_epoch_moves_at_every_transactions_end(
    targets: tuple[Target, Target], java_classpath: str
) -> None:
    """Kafka 4.4's producer on transaction version 2 (KIP-890): DescribeTransactions gives
    an epoch one higher after every commit and abort, as on Kafka."""

    def scenario(target: Target) -> Any:
        topic = target.create_topic("jepochs")
        txid = target.name_for("jtx")
        return run(java_classpath, "Producers", target.bootstrap, "epochs", topic, txid)

    same(scenario, *targets)
    on_kip98 = scenario(targets[0])
    assert on_kip98["epochs_after_each_end"] == [1, 2, 3]


def test_a_version_1_producer_then_a_version_2_one(db_url: str, java_classpath: str) -> None:
    """The operator's rollback, KIP98_FEATURES=transaction.version=1: Kafka 4.4's producer
    keeps its epoch across transactions; then, on a node at version 2 over the same
    database, the same topic and transactional id (the upgrade back), one moves it at
    every end, and readers see both producers' committed records. (Raw producers of each
    version with their transactions interleaved on one partition:
    tests/conformance/test_transaction_version2.py::test_v1_and_v2_producers_side_by_side.)"""
    from app.broker import Broker
    from app.log.topics import create_topic
    from tests.conformance.fixtures import KIP98_SIDE
    from tests.helpers.wire_client import serving

    create_topic(Broker.connect(db_url), "mixed", 1)
    pinned = {**KIP98_SIDE, "KIP98_FEATURES": "transaction.version=1"}
    with serving(db_url, env=pinned) as address:
        v1 = run(java_classpath, "Producers", address, "epochs", "mixed", "jtx")
    assert v1["epochs_after_each_end"] == [0, 0, 0]
    with serving(db_url, env=KIP98_SIDE) as address:
        v2 = run(java_classpath, "Producers", address, "epochs", "mixed", "jtx")
    assert v2["epochs_after_each_end"] == [1, 2, 3]
    values = [[v for _, v in run_["read_committed"]] for run_ in (v1, v2)]
    assert values == [["c1", "c2"], ["c1", "c2", "c1", "c2"]]
