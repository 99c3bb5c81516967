"""KIP-890's transaction version 2 on ``kip98 serve``'s wire, with a raw client (kio
frames): what only kip98's own tables show (the epoch moving per transaction in the
transaction log, a new producer id once the epochs are spent), the feature levels and the
operator's pin back to version 1, and AddPartitionsToTxn of a partition leader. The
answers Kafka gives are compared in tests/conformance/test_transaction_version2.py
(docs/design.md rules 64, 65)."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from app.broker import Broker
from app.log.topics import create_topic
from tests.conformance.harness import Target
from tests.conformance.requests import batch
from tests.conformance.tv2_calls import Tv2Transaction, add_partitions5, produce_at
from tests.helpers.wire_client import exchange, read_committed_values, serving

API_VERSIONS = 18
EVENTS = (
    "SELECT producer_id, producer_epoch, state FROM transaction_log "
    "WHERE transactional_id = :t ORDER BY event_id"
)


@pytest.fixture
def server(db_url: str) -> Iterator[Target]:
    create_topic(Broker.connect(db_url), "t", 2)
    with serving(db_url) as address:
        yield Target("kip98", address)


def events(db_url: str, transactional_id: str) -> list[tuple[int, int, str]]:
    with Broker.connect(db_url).engine.connect() as conn:
        rows = conn.execute(text(EVENTS), {"t": transactional_id}).all()
    return [(r.producer_id, r.producer_epoch, r.state) for r in rows]


def features(server: str) -> tuple[dict[str, Any], dict[str, Any], dict[int, Any]]:
    from kio.schema.api_versions.v4 import request as r

    answer = exchange(
        server, API_VERSIONS, 4,
        r.ApiVersionsRequest(client_software_name="t", client_software_version="1"),
    )  # fmt: skip
    finalized = {f.name: f.max_version_level for f in answer.finalized_features}
    supported = {f.name: (f.min_version, f.max_version) for f in answer.supported_features}
    keys = {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}
    return finalized, supported, keys


def test_every_end_bumps_the_epoch_in_the_transaction_log(server: Target, db_url: str) -> None:
    txn = Tv2Transaction(server)
    pid = txn.producer_id
    for i, commit in enumerate([True, False, True]):
        assert txn.produce("t", [f"v{i}"]) == "NONE"
        assert txn.end(commit) == {"error": "NONE", "same_producer_id": True, "epoch_moved_by": 1}
    assert txn.epoch == 3
    log = events(db_url, txn.transactional_id)
    # Each transaction ran at its own epoch; its PREPARE carries the next one.
    assert [e for e in log if e[2] == "BEGIN"] == [(pid, 0, "BEGIN"), (pid, 1, "BEGIN"),
                                                   (pid, 2, "BEGIN")]  # fmt: skip
    assert [e for e in log if e[2].startswith("PREPARE")] == [
        (pid, 1, "PREPARE_COMMIT"), (pid, 2, "PREPARE_ABORT"), (pid, 3, "PREPARE_COMMIT"),
    ]  # fmt: skip
    assert txn.described()["epoch"] == 3
    assert committed(server, 2) == [b"v0", b"v2"]


def committed(server: Target, want: int) -> list[bytes]:
    """Partition 0 of "t" as a read_committed librdkafka consumer reads it."""
    return read_committed_values(
        {"bootstrap.servers": server.bootstrap, "group.id": "r"}, "t", want
    )


def test_a_spent_epoch_ends_with_a_new_producer_id(server: Target, db_url: str) -> None:
    """The epoch's last value (Kafka's Short.MaxValue - 1) is never handed out again: the
    end answers a new producer id at epoch 0, on which the next transaction runs."""
    txn = Tv2Transaction(server)
    with Broker.connect(db_url).engine.begin() as conn:
        conn.execute(
            text("UPDATE transactions SET producer_epoch = 32766 WHERE transactional_id = :t"),
            {"t": txn.transactional_id},
        )
    txn.epoch = 32766
    old = txn.producer_id
    assert txn.produce("t", ["last"]) == "NONE"
    assert txn.end(commit=True)["same_producer_id"] is False
    assert txn.producer_id != old and txn.epoch == 0
    assert txn.produce("t", ["first"]) == "NONE"
    assert txn.end(commit=True)["epoch_moved_by"] == 1
    assert committed(server, 2) == [b"last", b"first"]


def test_one_produce_v12_adds_every_partition_it_writes(server: Target) -> None:
    from kio.schema.produce.v12 import request as p

    txn = Tv2Transaction(server)
    body = p.ProduceRequest(
        transactional_id=txn.transactional_id, acks=-1, timeout=datetime.timedelta(seconds=30),
        topic_data=(p.TopicProduceData(name="t", partition_data=tuple(
            p.PartitionProduceData(index=i, records=batch([f"p{i}"], txn.producer_id, 0, 0,
                                                          transactional=True))
            for i in (0, 1))),),
    )  # fmt: skip
    answer = server.raw(0, 12, body)
    assert [r.error_code.value for r in answer.responses[0].partition_responses] == [0, 0]
    assert txn.described()["topics"] == [["t", [0, 1]]]
    assert txn.end(commit=True)["error"] == "NONE"


def test_a_produce_without_a_transactional_id_adds_nothing(server: Target) -> None:
    """A v12 produce of plain batches is a plain produce; one of transactional batches
    without the id is refused whole, as before KIP-890."""
    plain = produce_at(server, 12, "t", batch(["x"]), None)
    assert plain.error_code.value == 0
    txn = Tv2Transaction(server)
    refused = produce_at(server, 12, "t", batch(["y"], txn.producer_id, 0, 0, True), None)
    assert refused.error_code.name.upper() == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
    assert txn.described()["topics"] == []


def test_transaction_version_2_is_finalized_and_the_versions_served(server: Target) -> None:
    finalized, supported, keys = features(server.bootstrap)
    assert finalized["transaction.version"] == 2
    assert supported["transaction.version"] == (0, 2)
    assert keys[0] == (3, 12) and keys[26] == (0, 5) and keys[28] == (0, 5)
    assert keys[24] == (0, 5) and keys[22] == (0, 5) and keys[25] == (0, 4)


def test_the_operator_pins_transaction_version_1(db_url: str) -> None:
    """KIP98_FEATURES=transaction.version=1, the rollback: finalized 1 (Kafka 4 producers
    then keep the first protocol), the versions served unchanged, as Kafka's broker keeps
    them at a lower level."""
    with serving(db_url, env={"KIP98_FEATURES": "transaction.version=1"}) as address:
        finalized, supported, keys = features(address)
    assert finalized["transaction.version"] == 1
    assert supported["transaction.version"] == (0, 2)
    assert keys[26] == (0, 5)


def test_a_partition_leaders_add_partitions_adds_and_verifies(server: Target) -> None:
    """AddPartitionsToTxn v5 adds and verifies, each answer as Kafka's coordinator gives it
    (no authorizer here, so ClusterAction is allowed)."""
    txn = Tv2Transaction(server)
    tid, pid = txn.transactional_id, txn.producer_id
    assert add_partitions5(server, tid, pid, 0, "t", verify_only=True) == [
        "NONE", ["TRANSACTION_ABORTABLE"],
    ]  # fmt: skip
    assert add_partitions5(server, tid, pid, 0, "t", verify_only=False) == ["NONE", ["NONE"]]
    assert add_partitions5(server, tid, pid, 0, "t", verify_only=True) == ["NONE", ["NONE"]]
    assert add_partitions5(server, tid, pid, 1, "t", verify_only=True) == [
        "NONE", ["PRODUCER_FENCED"],
    ]  # fmt: skip
    assert add_partitions5(server, "nobody", pid, 0, "t", verify_only=True) == [
        "NONE", ["INVALID_PRODUCER_ID_MAPPING"],
    ]  # fmt: skip


def test_a_partition_leaders_add_partitions_needs_cluster_action(db_url: str) -> None:
    """With authorization on, a client not allowed ClusterAction on the cluster (here the
    anonymous user of a PLAINTEXT listener) is refused the whole request, as Kafka refuses
    it; nothing is added."""
    with serving(db_url, env={"KIP98_AUTHORIZATION": "1"}) as address:
        target = Target("kip98", address)
        answer = add_partitions5(target, "tx", 1, 0, "t", verify_only=False)
    assert answer == ["CLUSTER_AUTHORIZATION_FAILED", []]
    allowed = {"KIP98_AUTHORIZATION": "1", "KIP98_SUPER_USERS": "User:ANONYMOUS"}
    with serving(db_url, env=allowed) as address:
        target = Target("kip98", address)
        answer = add_partitions5(target, "tx", 1, 0, "t", verify_only=False)
    assert answer == ["NONE", ["UNKNOWN_TOPIC_OR_PARTITION"]]  # allowed: no topic "t" here
