"""DeleteRecords (API 21): a partition's log start moves to the offset asked (never past
the high watermark, nor past an open transaction), its records below deleted as
retention deletes them, producer state wholly below evicted; the projections still fold
from the events. The native AdminClient, ``kip98 topics delete-records``, confluent-kafka
and kafka-python against a real ``kip98 serve``, and librdkafka's idempotent and
transactional producers going on, exactly once, while their partition is trimmed under
them."""

from __future__ import annotations

import threading
import time
from typing import Any

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient as CkAdmin
from confluent_kafka.admin import OffsetSpec
from kafka import TopicPartition as KpTopicPartition
from kafka.admin import KafkaAdminClient
from sqlalchemy import text

from app.admin import AdminClient, DeletedRecords
from app.broker import Broker
from app.client import KafkaError, KafkaException, TopicPartition
from app.log.topics import create_topic, describe_topic
from app.protocol import (
    EARLIEST_TIMESTAMP,
    DeleteRecordsRequest,
    FetchRequest,
    InitProducerIdRequest,
    ListOffsetsRequest,
    ProduceRequest,
    RecordIn,
)
from app.security import acls as acl_admin
from app.security.rules import AclBinding as Acl
from app.settings import BrokerSettings
from tests.helpers.cli_runner import run_kip98
from tests.helpers.projections import assert_partition_log_rebuilds
from tests.helpers.txn_driver import TxnDriver, read_values
from tests.helpers.wire_client import consume_all, delivered, serving

pytestmark = pytest.mark.broker(topics={"t": 2}, manual_clock=True)


def _produce(broker: Broker, n: int, partition: int = 0, batch: int = 1) -> None:
    for i in range(0, n, batch):
        records = [RecordIn(None, f"v{i + j}".encode(), 0) for j in range(min(batch, n - i))]
        assert broker.handle(ProduceRequest("t", partition, records)).error_code == 0


def _delete(broker: Broker, *partitions: tuple[str, int, int]) -> list[tuple[int, int]]:
    results = broker.handle(DeleteRecordsRequest(list(partitions))).results
    return [(r.error_code, r.low_watermark) for r in results]


def _log_start(broker: Broker, partition: int = 0) -> int:
    return describe_topic(broker, "t").partitions[partition].log_start_offset


def test_the_log_start_moves_to_the_offset_asked(broker: Broker) -> None:
    """Exactly to the offset, even inside a batch; records below it are gone for every
    reader; the high watermark (-1) deletes everything; nothing moves back; the
    projections fold from the events as before (the producer snapshot never splits the
    batch it lands in)."""
    p = _Idempotent(broker)  # its batches [0-3] [4-7] [8-9]
    for values in (["v0", "v1", "v2", "v3"], ["v4", "v5", "v6", "v7"], ["v8", "v9"]):
        assert p.send(values) == 0
    assert _delete(broker, ("t", 0, 6)) == [(0, 6)]
    assert _log_start(broker) == 6
    with broker.engine.connect() as conn:
        assert conn.execute(text('SELECT min("offset") FROM records')).scalar() == 6
    assert read_values(broker, "t", 0) == ["v6", "v7", "v8", "v9"]
    refused = broker.handle(FetchRequest("t", 0, 5))
    assert refused.error_code == KafkaError.OFFSET_OUT_OF_RANGE
    earliest = broker.handle(ListOffsetsRequest("t", 0, EARLIEST_TIMESTAMP))
    assert earliest.offset == 6
    assert_partition_log_rebuilds(broker, broker.clock.now_ms())
    assert _delete(broker, ("t", 0, 3)) == [(0, 6)], "a log start never moves back"
    assert _delete(broker, ("t", 0, -1), ("t", 1, 0)) == [(0, 10), (0, 0)]
    assert read_values(broker, "t", 0) == []
    assert_partition_log_rebuilds(broker, broker.clock.now_ms())
    _produce(broker, 2)
    assert read_values(broker, "t", 0) == ["v0", "v1"]  # appended from offset 10 on


def test_what_is_refused(broker: Broker, db_url: str) -> None:
    """Past the high watermark or negative: OFFSET_OUT_OF_RANGE; past an open
    transaction's first record: refused too, nothing moved (the cleaner never removes an
    undecided record, rule 20); a compacted topic: POLICY_VIOLATION; an unknown partition;
    and Delete on the topic needed. Each partition answered on its own."""
    _produce(broker, 3)
    d = TxnDriver(broker, "tx")
    d.init()
    d.send("t", 0, "open")  # offset 3, its transaction open: the LSO stays at 3
    _produce(broker, 1, partition=1)
    create_topic(broker, "c", 1, {"cleanup.policy": "compact"})
    got = _delete(broker, ("t", 0, 9), ("t", 0, -7), ("t", 0, 4), ("t", 0, -1), ("c", 0, 0),
                  ("t", 5, 0), ("nope", 0, 0), ("t", 1, 1))  # fmt: skip
    assert [code for code, _ in got] == [
        KafkaError.OFFSET_OUT_OF_RANGE, KafkaError.OFFSET_OUT_OF_RANGE,
        KafkaError.OFFSET_OUT_OF_RANGE, KafkaError.OFFSET_OUT_OF_RANGE,
        KafkaError.POLICY_VIOLATION, KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
        KafkaError.UNKNOWN_TOPIC_OR_PARTITION, 0,
    ]  # fmt: skip
    assert _log_start(broker) == 0 and _log_start(broker, 1) == 1
    assert _delete(broker, ("t", 0, 3)) == [(0, 3)], "up to the open transaction"
    d.end(commit=True)
    assert _delete(broker, ("t", 0, -1)) == [(0, 5)]  # past the data and the marker

    admin = Broker.connect(db_url, settings=BrokerSettings(authorization=1),
                           principal="User:admin")  # fmt: skip
    from dataclasses import replace

    alice = replace(admin, principal="User:alice")
    assert _delete(alice, ("t", 1, 1)) == [(KafkaError.TOPIC_AUTHORIZATION_FAILED, -1)]
    acl_admin.create_acls(admin, [Acl("User:alice", "topic", "t", "delete")])
    assert _delete(alice, ("t", 1, 1)) == [(0, 1)]


class _Idempotent:
    """An idempotent producer of partition t/0, request by request."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        got = broker.handle(InitProducerIdRequest(None, 60_000))
        self.producer_id, self.epoch, self.sequence = got.producer_id, got.producer_epoch, 0

    def send(self, values: list[str]) -> int:
        records = [RecordIn(None, v.encode(), 0) for v in values]
        request = ProduceRequest("t", 0, records, self.producer_id, self.epoch, self.sequence)
        self.sequence += len(values)
        return self.broker.handle(request).error_code


def test_idle_producer_state_goes_with_its_records(broker: Broker) -> None:
    """As retention: a producer whose records are all below the new log start is
    forgotten, from the projection and its snapshot, and comes back accepted at its next
    sequence, as a Kafka broker accepts a producer it has no state for (KIP-360)."""
    p = _Idempotent(broker)
    assert p.send(["a", "b"]) == 0
    other = _Idempotent(broker)
    assert other.send(["c"]) == 0
    assert _delete(broker, ("t", 0, 2)) == [(0, 2)]
    with broker.engine.connect() as conn:
        left = conn.execute(text("SELECT producer_id FROM producer_states")).scalars().all()
        # The snapshot at offset 2 held only ``p``, evicted from it too.
        snapshot = conn.execute(text("SELECT producer_id FROM producer_snapshots")).scalars()
        assert left == [other.producer_id] and list(snapshot) == []
    assert p.send(["d"]) == 0  # its next sequence, with no state: accepted
    assert read_values(broker, "t", 0) == ["c", "d"]
    assert_partition_log_rebuilds(broker, broker.clock.now_ms())


def test_native_admin_and_cli(db_url: str, broker: Broker) -> None:
    _produce(broker, 5)
    with AdminClient({"database.url": db_url}) as admin:
        tp = TopicPartition("t", 0, 2)
        futures = admin.delete_records([tp, TopicPartition("t", 1, 7)])
        assert futures[tp].result() == DeletedRecords(2)
        with pytest.raises(KafkaException) as refused:
            futures[TopicPartition("t", 1)].result()
        assert refused.value.args[0].code() == KafkaError.OFFSET_OUT_OF_RANGE
        with pytest.raises(KafkaException) as bad:
            admin.delete_records(["t"])  # type: ignore[list-item]
        assert bad.value.args[0].code() == KafkaError._INVALID_ARG
    shown = run_kip98("topics", "delete-records", "--topic", "t", "--partition", "0",
                      "--offset", "4", "--output", "json")  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert '"low_watermark": 4' in shown.stdout
    failed = run_kip98("topics", "delete-records", "--topic", "t", "--partition", "0",
                       "--offset", "99")  # fmt: skip
    assert failed.returncode != 0 and "OFFSET_OUT_OF_RANGE" in failed.stderr
    assert "Traceback" not in failed.stderr and len(failed.stderr.strip().splitlines()) == 1
    assert _log_start(broker) == 4


def test_wire_clients_delete_records(db_url: str, broker: Broker) -> None:
    """confluent-kafka's delete_records answers the low watermark its list_offsets then
    gives; kafka-python's likewise; each partition on its own."""
    _produce(broker, 6)
    _produce(broker, 2, partition=1)
    with serving(db_url) as server:
        admin = CkAdmin({"bootstrap.servers": server})
        tp = ck.TopicPartition("t", 0, 2)
        [deleted] = admin.delete_records([tp]).values()
        assert deleted.result(30).low_watermark == 2
        [earliest] = admin.list_offsets({ck.TopicPartition("t", 0): OffsetSpec.earliest()}).values()
        assert earliest.result(30).offset == 2
        futures = admin.delete_records([ck.TopicPartition("t", 1, 9)])
        with pytest.raises(ck.KafkaException) as refused:
            next(iter(futures.values())).result(30)
        assert refused.value.args[0].code() == ck.KafkaError.OFFSET_OUT_OF_RANGE

        kp = KafkaAdminClient(bootstrap_servers=server)
        try:
            answer = kp.delete_records({KpTopicPartition("t", 0): 5, KpTopicPartition("t", 1): -1})
        finally:
            kp.close()
    assert {tp.partition: low["low_watermark"] for tp, low in answer.items()} == {0: 5, 1: 2}
    assert [_log_start(broker), _log_start(broker, 1)] == [5, 2]


def _trim_repeatedly(db_url: str, stop: threading.Event, trims: list[int]) -> None:
    """Delete the partition's records up to its LSO, again and again, until told."""
    broker = Broker.connect(db_url)
    while not stop.is_set():
        lso = describe_topic(broker, "t").partitions[0].last_stable_offset
        [(code, low)] = [
            (r.error_code, r.low_watermark)
            for r in broker.handle(DeleteRecordsRequest([("t", 0, lso)])).results
        ]
        if code == 0 and low > (trims[-1] if trims else 0):
            trims.append(low)
        time.sleep(0.01)


def _trimmed(trims: list[int], least: int) -> None:
    """Wait until the trimmer has trimmed ``least`` times (a hang guard only): the writer
    goes on only then, so the trims land while it writes, however fast either runs."""
    deadline = time.monotonic() + 120
    while len(trims) < least:
        assert time.monotonic() < deadline, f"the partition was trimmed {len(trims)} times"
        time.sleep(0.01)


def test_an_idempotent_librdkafka_producer_goes_on_exactly_once(
    db_url: str, broker: Broker
) -> None:
    """While the partition is trimmed under it again and again (its producer state
    evicted each time its records are all gone), librdkafka's idempotent producer keeps
    writing: every record delivered once, at offsets that rise by one, nothing written
    twice."""
    stop, trims = threading.Event(), []
    trimmer = threading.Thread(target=_trim_repeatedly, args=(db_url, stop, trims))
    with serving(db_url) as server:
        producer = ck.Producer({"bootstrap.servers": server, "enable.idempotence": True,
                                "linger.ms": 2, "batch.num.messages": 7})  # fmt: skip
        trimmer.start()
        try:
            reports: list[Any] = []
            for round_ in range(30):
                reports += delivered(producer, 20, topic="t", partition=0, key=str(round_))
                if round_ % 10 == 9:  # a trim of what the last ten rounds wrote
                    _trimmed(trims, round_ // 10 + 1)
        finally:
            stop.set()
            trimmer.join(30)
    assert [err for err, _ in reports] == [None] * 600
    assert [offset for _, offset in reports] == list(range(600))
    assert len(trims) > 1, "the partition was trimmed while the producer wrote"
    assert describe_topic(broker, "t").partitions[0].high_watermark == 600
    assert_partition_log_rebuilds(broker, int(time.time() * 1000))


def test_a_transactional_librdkafka_producer_goes_on_exactly_once(
    db_url: str, broker: Broker
) -> None:
    """The same with transactions, as librdkafka's own test does it (trimmed between and
    inside transactions, up to the open one's first record): every committed record read
    once by a read_committed consumer from the log start on, none aborted."""
    stop, trims = threading.Event(), []
    trimmer = threading.Thread(target=_trim_repeatedly, args=(db_url, stop, trims))
    with serving(db_url) as server:
        producer = ck.Producer({"bootstrap.servers": server, "transactional.id": "trimmed",
                                "linger.ms": 2})  # fmt: skip
        producer.init_transactions(30)
        trimmer.start()
        committed: list[str] = []
        try:
            for t in range(25):
                producer.begin_transaction()
                values = [f"{t}-{i}" for i in range(8)]
                for v in values:
                    producer.produce("t", v, partition=0)
                if t % 5 == 4:
                    producer.abort_transaction(30)
                else:
                    producer.commit_transaction(30)
                    committed += values
                if t in (8, 18):  # trims between the transactions, up to the last commit
                    _trimmed(trims, 1 if t == 8 else 2)
            stop.set()
            trimmer.join(30)
            last = trims[-1] if trims else 0
            # One more after the trims: the trimmer may have taken every record before it
            # (up to the LSO), so these are the ones certain to be read.
            producer.begin_transaction()
            values = [f"last-{i}" for i in range(8)]
            for v in values:
                producer.produce("t", v, partition=0)
            producer.commit_transaction(30)
            committed += values
            reader = ck.Consumer({"bootstrap.servers": server, "group.id": "r",
                                  "isolation.level": "read_committed",
                                  "enable.partition.eof": True})  # fmt: skip
            try:
                reader.assign([ck.TopicPartition("t", 0, ck.OFFSET_BEGINNING)])
                seen: list[str] = []
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    m = reader.poll(0.5)
                    if m is None:
                        continue
                    if m.error() is not None:
                        assert m.error().code() == ck.KafkaError._PARTITION_EOF
                        break
                    seen.append(m.value().decode())
            finally:
                reader.close()
        finally:
            stop.set()
    assert len(trims) > 1, "the partition was trimmed while the producer wrote"
    assert len(seen) == len(set(seen)), "a committed record read twice"
    assert set(seen) <= set(committed)
    # Everything committed at or past the last trim is there, in order.
    assert seen == [v for v in committed if v in set(seen)]
    assert seen[-8:] == committed[-8:]
    assert last <= describe_topic(broker, "t").partitions[0].log_start_offset


def test_librdkafkas_own_recovery_case(db_url: str, broker: Broker) -> None:
    """librdkafka's 0103 test: transaction 1 committed, its records deleted inside
    transaction 2, which then produces and commits (no UNKNOWN_PRODUCER_ID on a broker
    since KIP-360: a producer without state is accepted), then transaction 3."""
    with serving(db_url) as server:
        producer = ck.Producer({"bootstrap.servers": server, "transactional.id": "0103",
                                "batch.num.messages": 1})  # fmt: skip
        admin = CkAdmin({"bootstrap.servers": server})
        producer.init_transactions(30)
        for n, delete_first in ((6, False), (4, True), (1, False)):
            producer.begin_transaction()
            if delete_first:
                [deleted] = admin.delete_records([ck.TopicPartition("t", 0, 6)]).values()
                assert deleted.result(30).low_watermark == 6
            assert [e for e, _ in delivered(producer, n, topic="t", partition=0)] == [None] * n
            producer.commit_transaction(30)
        reader = ck.Consumer({"bootstrap.servers": server, "group.id": "r",
                              "isolation.level": "read_committed"})  # fmt: skip
        try:
            reader.assign([ck.TopicPartition("t", 0, ck.OFFSET_BEGINNING)])
            got = [m.value() for m in consume_all(reader, 5)]
        finally:
            reader.close()
    assert got == [b"v0", b"v1", b"v2", b"v3", b"v0"]
    with broker.engine.connect() as conn:
        assert not conn.execute(text('SELECT 1 FROM records WHERE "offset" < 6')).first()
