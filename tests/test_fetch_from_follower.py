"""Reads from a standby (Kafka's fetch from follower, KIP-392; docs/design.md rule 44): a
native Consumer with ``database.replica.url``, Kafka clients of ``kip98 serve
--replica-url``, ``kip98 spark materialize --replica-url``. read_committed on the standby
returns what it does on the primary; a position the standby has not replayed yet waits,
never errors or goes back; offsets and groups stay on the primary."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import confluent_kafka as ck
import pytest

from app.broker import Broker
from app.client import Consumer, TopicPartition
from app.errors import KafkaError
from app.log.topics import create_topic
from app.protocol import OffsetAndMetadata, OffsetCommitRequest
from app.storage.embedded import EmbeddedPostgres
from tests.helpers.replication import ReplicatedDatabase, admin
from tests.helpers.txn_driver import TxnDriver, partition_offsets, read_values
from tests.helpers.wire_client import serving

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

POLLS_WHILE_PAUSED = 10
HANG_GUARD_S = 120


@contextlib.contextmanager
def replay_paused(db: ReplicatedDatabase, standby: EmbeddedPostgres) -> Iterator[None]:
    """The standby receives the primary's WAL but applies none of it: it lags."""
    port = standby.status().port
    assert port is not None
    with admin(port) as conn:
        conn.execute("SELECT pg_wal_replay_pause()")
        while conn.execute("SELECT pg_get_wal_replay_pause_state()").fetchone() != ("paused",):
            time.sleep(0.01)
    try:
        yield
    finally:
        with admin(port) as conn:
            conn.execute("SELECT pg_wal_replay_resume()")


def _transactions(driver: TxnDriver, *outcomes: str, first: int = 0) -> None:
    """One two-record transaction on partition 0 per outcome: committed or aborted, or
    left open; values name each and number them from ``first``."""
    for i, outcome in enumerate(outcomes, start=first):
        assert driver.send("t", 0, f"{outcome}-{i}-a", f"{outcome}-{i}-b").error_code == 0
        if outcome != "open":
            assert driver.end(commit=outcome == "commit") == 0


def _caught_up(db: ReplicatedDatabase, standby: EmbeddedPostgres) -> None:
    """Until the standby has replayed everything the primary has written so far."""
    primary, port = db.primary().status().port, standby.status().port
    assert primary is not None and port is not None
    with admin(primary) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    deadline = time.monotonic() + HANG_GUARD_S
    with admin(port) as conn:
        while conn.execute(
            "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (row[0],)
        ).fetchone() != (True,):
            assert time.monotonic() < deadline, "the standby never caught up"
            time.sleep(0.02)


def _drain(consumer: Consumer, want: int) -> list[str]:
    got: list[str] = []
    deadline = time.monotonic() + HANG_GUARD_S
    while len(got) < want:
        for m in consumer.consume(100, 0.2):
            assert m.error() is None, m.error()
            got.append(m.value().decode())
        assert time.monotonic() < deadline, f"only {got}"
    return got


def test_a_consumer_of_a_lagging_standby_waits_and_reads_only_committed_records(
    replica_db: ReplicatedDatabase,
) -> None:
    broker = Broker.connect(replica_db.url)
    create_topic(broker, "t", 1)
    driver = TxnDriver(broker, "tx")
    assert driver.init() == 0
    _transactions(driver, "commit", "abort", "commit")
    standby = replica_db.standbys()[0]
    _caught_up(replica_db, standby)
    before = read_values(broker, "t", 0)
    assert before == ["commit-0-a", "commit-0-b", "commit-2-a", "commit-2-b"]

    with replay_paused(replica_db, standby):
        _transactions(driver, "commit", "abort", "open", first=3)
        high, lso = partition_offsets(broker, "t", 0)
        assert lso < high  # the open transaction holds the LSO
        # A reader of the primary got as far as the LSO and committed it.
        done = broker.handle(OffsetCommitRequest("g", {("t", 0): OffsetAndMetadata(lso)}))
        assert done.error_code == KafkaError.NO_ERROR and done.results == {("t", 0): 0}
        config = {
            "database.url": replica_db.url,
            "database.replica.url": replica_db.node_url(standby),
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
        }
        behind = Consumer({**config, "group.id": "g"})  # starts at the committed offset
        behind.subscribe(["t"])
        from_start = Consumer(config)
        from_start.assign([TopicPartition("t", 0, 0)])
        try:
            # The standby has not replayed the committed position: nothing yet, no error,
            # no reset; from the start, exactly what the standby has replayed.
            for _ in range(POLLS_WHILE_PAUSED):
                for m in behind.consume(100, 0.1):
                    raise AssertionError(f"read while the standby lags: {m.error() or m.value()}")
            assert _drain(from_start, len(before)) == before
            assert behind.position([TopicPartition("t", 0)])[0].offset in (lso, -1001)
        except BaseException:
            behind.close()
            from_start.close()
            raise
    try:
        assert _drain(from_start, 2) == ["commit-3-a", "commit-3-b"]
        assert driver.end(commit=True) == 0  # the open transaction commits
        assert _drain(behind, 2) == ["open-5-a", "open-5-b"]
        assert _drain(from_start, 2) == ["open-5-a", "open-5-b"]
    finally:
        behind.close()
        from_start.close()
    # Offsets went to the primary only: the standby's replica of them is the primary's.
    assert read_values(Broker.connect(replica_db.node_url(standby)), "t", 0) == read_values(
        broker, "t", 0
    )


def test_kafka_clients_of_the_server_read_its_standby(replica_db: ReplicatedDatabase) -> None:
    broker = Broker.connect(replica_db.url)
    create_topic(broker, "t", 1)
    driver = TxnDriver(broker, "tx")
    assert driver.init() == 0
    _transactions(driver, "commit")
    standby = replica_db.standbys()[0]
    _caught_up(replica_db, standby)
    with serving(replica_db.url, "--replica-url", replica_db.node_url(standby)) as address:
        consumer = ck.Consumer({
            "bootstrap.servers": address, "group.id": "wire", "isolation.level": "read_committed",
            "auto.offset.reset": "earliest", "enable.partition.eof": False,
        })  # fmt: skip
        try:
            consumer.assign([ck.TopicPartition("t", 0, 0)])

            def read(want: int) -> list[str]:
                got: list[str] = []
                deadline = time.monotonic() + HANG_GUARD_S
                while len(got) < want:
                    m = consumer.poll(0.2)
                    if m is not None:
                        assert m.error() is None, m.error()
                        got.append(m.value().decode())
                    assert time.monotonic() < deadline, f"only {got}"
                return got

            assert read(2) == ["commit-0-a", "commit-0-b"]
            with replay_paused(replica_db, standby):
                _transactions(driver, "abort", "commit", first=1)
                for _ in range(POLLS_WHILE_PAUSED):  # the server reads the lagging standby
                    m = consumer.poll(0.1)
                    assert m is None, m.error() or m.value()
            assert read(2) == ["commit-2-a", "commit-2-b"]
        finally:
            consumer.close()


@pytest.mark.spark
def test_spark_materializes_from_a_standby(
    replica_db: ReplicatedDatabase, spark: SparkSession
) -> None:
    from app.spark.materialize import materialize
    from tests.test_spark_materialize import table

    broker = Broker.connect(replica_db.url)
    create_topic(broker, "t", 1)
    driver = TxnDriver(broker, "tx")
    assert driver.init() == 0
    _transactions(driver, "commit", "abort", "commit", "open")
    standby = replica_db.standbys()[0]
    _caught_up(replica_db, standby)
    with replay_paused(replica_db, standby):
        assert driver.end(commit=True) == 0  # on the primary only, so far
        counts = materialize(spark, replica_db.url, replica_url=replica_db.node_url(standby))
    # The standby's LSO (held by the transaction open there) and records, not the primary's.
    assert counts == {("t", 0): 4}
    rows = [r[4].decode() for r in table(broker)]
    assert rows == ["commit-0-a", "commit-0-b", "commit-2-a", "commit-2-b"]
    assert read_values(broker, "t", 0) == [*rows, "open-3-a", "open-3-b"]
