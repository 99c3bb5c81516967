"""acks=all on a primary with two synchronous standbys (ANY 1): a write the standbys cannot
confirm ends within its bound, typed and retriable, never acknowledged; its retry is a
duplicate only once the standbys confirm the first attempt's commit (docs/design.md rules
41 and 42). Standbys stopped, or hung (SIGSTOP) with the primary not noticing, as a
machine that hangs on a network that stays up."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import replace

import confluent_kafka as ck
import pytest

from app.admin import AdminClient, NewTopic
from app.broker import Broker
from app.client import KafkaException, Producer
from app.errors import KafkaError
from app.log.topics import alter_topic_config, create_topic
from app.protocol import (
    InitProducerIdRequest,
    ProduceBatchesRequest,
    ProduceRequest,
    RecordIn,
)
from app.settings import BrokerSettings
from app.storage.urls import parse
from tests.helpers.batches import produce_batch
from tests.helpers.cli_runner import run_kip98
from tests.helpers.replication import ReplicatedDatabase, paused, server_setting
from tests.helpers.txn_driver import read_values
from tests.helpers.wire_client import serving

BOUND_MS = 2000  # the statement bound, which now bounds a commit's wait for its standbys
NOT_ENOUGH = KafkaError.NOT_ENOUGH_REPLICAS
AFTER_APPEND = KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND


def _broker(db: ReplicatedDatabase) -> Broker:
    settings = replace(BrokerSettings.from_env(), db_statement_timeout_ms=BOUND_MS)
    broker = Broker.connect(db.url, settings=settings)
    create_topic(broker, "t", 1)
    return broker


def _one(broker: Broker, batch: ProduceRequest, acks: int = -1) -> tuple[int, int, bool]:
    answer = broker.handle(ProduceBatchesRequest([batch], acks=acks)).batches[0]
    return answer.error_code, answer.base_offset, answer.duplicate


@contextlib.contextmanager
def _hung_standbys(db: ReplicatedDatabase) -> Iterator[None]:
    """Both standbys hung while the primary goes on counting them as streaming (no
    wal_sender_timeout): the check before the write passes, the commit's wait does not."""
    port = db.primary().status().port
    assert port is not None
    with server_setting(port, "wal_sender_timeout", "0"), paused(db.standbys()):
        yield


def test_too_few_standbys_refuse_acks_all_before_the_write_and_acks_1_goes_on(
    replica_db: ReplicatedDatabase,
) -> None:
    broker = _broker(replica_db)
    assert _one(broker, produce_batch("before"))[0] == KafkaError.NO_ERROR
    for standby in replica_db.standbys():
        standby.stop()
    # A request may still be let in by the look the broker last took (kept a second);
    # its commit then ends at the bound, unconfirmed. Sooner or later the look is taken
    # again and the request is refused before anything is written.
    unconfirmed = 0
    deadline = time.monotonic() + 120
    while True:
        code, _, _ = _one(broker, produce_batch(f"tried-{unconfirmed}"))
        assert code in (NOT_ENOUGH, AFTER_APPEND)
        if code == NOT_ENOUGH:
            break
        unconfirmed += 1
        assert time.monotonic() < deadline, "never refused before the write"
    written = read_values(broker, "t", 0, committed=False)
    assert written == ["before", *(f"tried-{i}" for i in range(unconfirmed))]
    assert _one(broker, produce_batch("refused"))[0] == NOT_ENOUGH
    assert read_values(broker, "t", 0, committed=False) == written  # nothing written

    assert _one(broker, produce_batch("leader only"), acks=1)[0] == KafkaError.NO_ERROR
    assert read_values(broker, "t", 0, committed=False)[-1] == "leader only"


def test_a_topics_min_insync_replicas_counts_the_primary_and_its_streaming_standbys(
    replica_db: ReplicatedDatabase,
) -> None:
    """Kafka's min.insync.replicas, the leader's copy counted: with both standbys
    streaming, three copies are in sync; a topic asking four is refused NOT_ENOUGH_REPLICAS
    before anything is written, acks=1 goes on, and altering it to three lets acks=all in.
    One standby stopped leaves two copies: the topic asking three is refused again."""
    broker = _broker(replica_db)
    create_topic(broker, "m", 1, {"min.insync.replicas": 4})

    def one(value: str, acks: int = -1) -> int:
        batch = ProduceRequest("m", 0, [RecordIn(None, value.encode(), 0)])
        return broker.handle(ProduceBatchesRequest([batch], acks=acks)).batches[0].error_code

    assert one("four") == NOT_ENOUGH
    assert one("leader only", acks=1) == KafkaError.NO_ERROR
    assert _one(broker, produce_batch("other topic"))[0] == KafkaError.NO_ERROR
    alter_topic_config(broker, "m", {"min.insync.replicas": "3"})
    assert one("three") == KafkaError.NO_ERROR
    replica_db.standbys()[0].stop()
    deadline = time.monotonic() + 120
    while (code := one("one standby")) != NOT_ENOUGH:  # once the primary has seen it go
        assert code == KafkaError.NO_ERROR and time.monotonic() < deadline
    assert read_values(broker, "m", 0, committed=False)[:2] == ["leader only", "three"]


def test_a_retry_is_answered_as_a_duplicate_only_once_the_standbys_confirm_it(
    replica_db: ReplicatedDatabase,
) -> None:
    broker = _broker(replica_db)
    ident = broker.handle(InitProducerIdRequest(None, 60_000))
    first = produce_batch("once", producer_id=ident.producer_id, sequence=0)
    with _hung_standbys(replica_db):
        assert _one(broker, first)[0] == AFTER_APPEND  # committed on the primary
        # The retry finds it a duplicate and writes nothing; its answer would acknowledge
        # the first attempt, which no standby holds yet: it waits, and is not answered OK.
        assert _one(broker, first)[0] == AFTER_APPEND
    code, offset, duplicate = _one(broker, first)
    assert (code, duplicate) == (KafkaError.NO_ERROR, True)
    assert read_values(broker, "t", 0) == ["once"] and offset == 0
    answer = _one(broker, produce_batch("next", producer_id=ident.producer_id, sequence=1))
    assert answer[:2] == (KafkaError.NO_ERROR, 1)


@pytest.mark.parametrize("flushed", [True, False], ids=["bare EndTxn", "combined commit"])
def test_an_unconfirmed_transactional_commit_never_reports_success(
    replica_db: ReplicatedDatabase, monkeypatch: pytest.MonkeyPatch, flushed: bool
) -> None:
    """A commit whose batches went before it (EndTxn on its own), or with it (the
    Producer's combined commit, its batches held by linger.ms): while the standbys hang,
    every attempt ends unconfirmed and the application is never told it committed."""
    monkeypatch.setenv("KIP98_DB_STATEMENT_TIMEOUT_MS", str(BOUND_MS))
    create_topic(Broker.connect(replica_db.url), "t", 1)
    producer = Producer(
        {"database.url": replica_db.url, "transactional.id": "tx", "linger.ms": 30_000}
    )
    try:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(3):
            producer.produce("t", f"r{i}".encode(), partition=0)
        if flushed:
            assert producer.flush(60) == 0
        with _hung_standbys(replica_db):
            with pytest.raises(KafkaException) as failed:
                producer.commit_transaction(3 * BOUND_MS / 1000)
            assert failed.value.args[0].retriable() and not failed.value.args[0].fatal()
            # Its outcome is unknown to the client: only the commit may be asked again.
            with pytest.raises(KafkaException):
                producer.abort_transaction(1)
        producer.commit_transaction(60)
        producer.begin_transaction()
        producer.produce("t", b"after", partition=0)
        producer.commit_transaction(60)
    finally:
        producer.close()
    assert read_values(Broker.connect(replica_db.url), "t", 0) == ["r0", "r1", "r2", "after"]


def test_kafka_clients_through_the_server_get_the_same_codes(
    replica_db: ReplicatedDatabase,
) -> None:
    create_topic(Broker.connect(replica_db.url), "t", 1)
    with serving(replica_db.url) as address:

        def produce(value: str) -> int:
            outcome: list[int] = []
            producer = ck.Producer({
                "bootstrap.servers": address, "acks": "all", "enable.idempotence": False,
                "retries": 0, "request.timeout.ms": BOUND_MS, "linger.ms": 0,
            })  # fmt: skip
            producer.produce(
                "t", value.encode(), partition=0,
                on_delivery=lambda err, _msg: outcome.append(err.code() if err else 0),
            )  # fmt: skip
            assert producer.flush(120) == 0
            return outcome[0]

        assert produce("confirmed") == 0
        with _hung_standbys(replica_db):  # within the request's timeout
            assert produce("unconfirmed") == AFTER_APPEND
        for standby in replica_db.standbys():
            standby.stop()
        deadline = time.monotonic() + 120
        while (code := produce("refused")) != NOT_ENOUGH:
            assert code == AFTER_APPEND and time.monotonic() < deadline


def test_a_url_whose_hosts_are_all_standbys_fails_typed_and_retriable(
    replica_db: ReplicatedDatabase,
) -> None:
    """Every host of the URL is a standby (a failover under way, say): clients get a
    retriable _TRANSPORT, the CLI one line and a non-zero exit."""
    hosts = [("127.0.0.1", s.status().port) for s in replica_db.standbys()]
    url = replace(parse(replica_db.url).with_target("read-write"), hosts=tuple(hosts)).render()
    admin = AdminClient({"database.url": url})
    future = admin.create_topics([NewTopic("t", 1)])["t"]
    with pytest.raises(KafkaException) as failed:
        future.result()
    error = failed.value.args[0]
    assert error.code() == KafkaError._TRANSPORT and error.retriable()
    result = run_kip98("topics", "list", env={"KIP98_DATABASE_URL": url})
    assert result.returncode != 0 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: _TRANSPORT: database unreachable")
    assert "read-only" in lines[0]
