"""Kafka's Java producer, idempotent and transactional, against kip98 and Kafka: the same
observations from each (tests/conformance's ``same``)."""

from __future__ import annotations

from typing import Any

from tests.conformance.harness import Target, documented_difference, same
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

    observed = {"hw_while_open": 2, "lso_while_open": 0, "read_committed": []}
    documented_difference(
        "commit-after-timeout-transaction-version", scenario, *targets,
        kip98_expected={**observed, "commit_after_timeout": "ProducerFencedException"},
        kafka_expected={**observed, "commit_after_timeout": "InvalidTxnStateException"},
    )  # fmt: skip
