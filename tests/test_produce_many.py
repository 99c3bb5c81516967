"""Batches for several partitions in one request (one DB transaction): each is decided and
answered on its own, exactly as separate requests would be, and the producer sends the
batches it has ready together; a transactional producer registers their new partitions in
that same request (registration and data commit together, or not at all)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event, text

from app.broker import Broker, write
from app.broker.produce import produce
from app.client import KafkaException, Producer
from app.coordinator import machines as m
from app.coordinator.rebuild import compute_transactions, live_transactions
from app.errors import KafkaError
from app.protocol import AddPartitionsToTxnRequest, ProduceBatchesRequest, ProduceRequest, RecordIn
from tests.helpers.backends import lost_connection
from tests.helpers.identities import hand_out
from tests.helpers.projections import assert_partition_log_rebuilds
from tests.helpers.txn_driver import (
    TxnDriver,
    produce_many,
    produce_registering,
    read_values,
    state_of,
)

pytestmark = pytest.mark.broker(topics={"t": 3})


@pytest.fixture(autouse=True)
def producer_id(broker: Broker) -> None:
    """The idempotent producer id the tests send with (7), handed out."""
    hand_out(broker, 7)


def batch(partition: int, seq: int, *values: str, pid: int = 7, topic: str = "t") -> ProduceRequest:
    records = [RecordIn(None, v.encode(), 0) for v in values]
    return ProduceRequest(topic, partition, records, producer_id=pid, producer_epoch=0,
                          base_sequence=seq)  # fmt: skip


def stored(broker: Broker) -> list[tuple[int, int, bytes]]:
    with broker.engine.connect() as conn:
        rows = conn.execute(text('SELECT partition, "offset", value FROM records ORDER BY 1, 2'))
        return [(r[0], r[1], bytes(r[2])) for r in rows]


def test_each_batch_is_answered_on_its_own(broker: Broker) -> None:
    assert produce(broker, batch(1, 0, "first")).error_code == 0
    responses = produce_many(
        broker,
        [
            batch(2, 0, "a", "b"),
            batch(1, 5, "gap"),  # out of order: refused, writes nothing
            batch(0, 0, "c"),
            batch(9, 0, "nowhere"),  # no such partition
            ProduceRequest("t", 0, []),  # malformed: refused before the database
        ],
    )
    assert [r.error_code for r in responses] == [
        0,
        KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
        0,
        KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
        KafkaError.INVALID_RECORD,
    ]
    assert (responses[0].base_offset, responses[2].base_offset) == (0, 0)
    assert stored(broker) == [(0, 0, b"c"), (1, 0, b"first"), (2, 0, b"a"), (2, 1, b"b")]
    # A retry of the whole request: the written batches are duplicates with their offsets.
    again = produce_many(broker, [batch(2, 0, "a", "b"), batch(0, 0, "c")])
    assert [(r.error_code, r.base_offset, r.duplicate) for r in again] == [
        (0, 0, True),
        (0, 0, True),
    ]
    assert len(stored(broker)) == 4


def test_transactional_batches_are_checked_each(broker: Broker) -> None:
    d = TxnDriver(broker, "many")
    assert d.init() == 0
    assert d.add(("t", 0)) == 0

    def txn_batch(partition: int, value: str) -> ProduceRequest:
        return ProduceRequest(
            "t", partition, [RecordIn(None, value.encode(), 0)], producer_id=d.producer_id,
            producer_epoch=d.producer_epoch, base_sequence=0, transactional_id="many",
            is_transactional=True,
        )  # fmt: skip

    responses = produce_many(broker, [txn_batch(1, "unregistered"), txn_batch(0, "ok")])
    assert [r.error_code for r in responses] == [KafkaError.INVALID_TXN_STATE, 0]
    d.sequences[("t", 0)] = 1
    assert d.end(commit=True) == 0
    assert read_values(broker, "t", 0) == ["ok"]
    assert read_values(broker, "t", 1, committed=False) == []


@pytest.mark.parametrize("in_flight", [1, 5])
def test_ready_batches_of_several_partitions_share_one_commit_per_lane(
    db_url: str, broker: Broker, in_flight: int
) -> None:
    """With one request in flight, every partition's ready batch goes in it; with five,
    each of the three partitions has a lane, and the three requests commit side by side."""
    reports: list[Any] = []
    producer = Producer({"database.url": db_url, "linger.ms": 10_000, "max.in.flight": in_flight})
    try:
        commits = 0

        def count(*_: Any) -> None:
            nonlocal commits
            commits += 1

        event.listen(producer.broker.engine, "commit", count)
        for i in range(9):
            producer.produce(
                "t", str(i), partition=i % 3, on_delivery=lambda e, m: reports.append(e)
            )
        assert producer.flush(30) == 0
        assert commits == min(in_flight, 3)
    finally:
        producer.close()
    assert reports == [None] * 9
    assert [(p, o) for p, o, _ in stored(broker)] == [(p, o) for p in range(3) for o in range(3)]


# ------------------------------------------------------------------ registering produce


def registering(
    d: TxnDriver, *partitions: int, epoch: int | None = None
) -> AddPartitionsToTxnRequest:
    return AddPartitionsToTxnRequest(
        d.transactional_id, d.producer_id, d.producer_epoch if epoch is None else epoch,
        [("t", p) for p in partitions],
    )  # fmt: skip


def txn_request(
    d: TxnDriver, partition: int, value: str, epoch: int | None = None
) -> ProduceRequest:
    return ProduceRequest(
        "t", partition, [RecordIn(None, value.encode(), 0)], producer_id=d.producer_id,
        producer_epoch=d.producer_epoch if epoch is None else epoch, base_sequence=0,
        transactional_id=d.transactional_id, is_transactional=True,
    )  # fmt: skip


def events(broker: Broker, tid: str) -> list[str]:
    with broker.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT reason FROM transaction_log WHERE transactional_id = :t ORDER BY event_id"
            ),
            {"t": tid},
        )
        return [r[0] for r in rows]


def test_registration_and_batches_commit_together(broker: Broker) -> None:
    d = TxnDriver(broker, "implicit")
    assert d.init() == 0
    registered, responses = produce_registering(
        broker, [txn_request(d, 2, "b"), txn_request(d, 0, "a")], registering(d, 0, 2)
    )
    assert registered is not None and registered.error_code == 0
    assert [r.error_code for r in responses] == [0, 0]
    assert state_of(broker, "implicit") == m.BEGIN
    assert events(broker, "implicit")[-1] == "AddPartitionsToTxn"
    d.sequences.update({("t", 0): 1, ("t", 2): 1})
    assert d.end(commit=True) == 0
    assert [read_values(broker, "t", p) for p in range(3)] == [["a"], [], ["b"]]


def test_refused_registration_writes_nothing(broker: Broker) -> None:
    d = TxnDriver(broker, "refused")
    assert d.init() == 0
    stale = d.producer_epoch
    assert d.init() == 0  # a new instance: the old epoch is fenced
    before = events(broker, "refused")
    registered, responses = produce_registering(
        broker, [txn_request(d, 0, "zombie", epoch=stale)], registering(d, 0, epoch=stale)
    )
    assert registered is not None
    assert registered.error_code == KafkaError.PRODUCER_FENCED
    assert [r.error_code for r in responses] == [KafkaError.PRODUCER_FENCED]
    registered, responses = produce_registering(
        broker, [txn_request(d, 9, "nowhere")], registering(d, 9)
    )
    assert registered is not None
    assert [r.error_code for r in responses] == [KafkaError.UNKNOWN_TOPIC_OR_PARTITION]
    assert events(broker, "refused") == before
    assert stored(broker) == []


def test_a_failed_request_registers_nothing(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = TxnDriver(broker, "atomic")
    assert d.init() == 0

    def broken_copy(*_: Any) -> None:
        raise RuntimeError("COPY failed")

    monkeypatch.setattr(write, "copy_rows", broken_copy)  # the executor's COPY
    with pytest.raises(RuntimeError):
        produce_registering(broker, [txn_request(d, 0, "x")], registering(d, 0))
    assert state_of(broker, "atomic") == m.EMPTY
    assert events(broker, "atomic")[-1] != "AddPartitionsToTxn"


def count_commits(producer: Producer) -> list[int]:
    """A one-element list counting the DB commits of ``producer``'s engine from now on."""
    commits = [0]

    def count(*_: Any) -> None:
        commits[0] += 1

    event.listen(producer.broker.engine, "commit", count)
    return commits


@pytest.mark.parametrize(
    ("flushed_first", "commits_per_transaction"),
    [
        # The record waits out its linger until the commit and goes with the EndTxn: the
        # registration, the append, PREPARE, markers and COMPLETE in one DB transaction.
        (False, 1),
        # Nothing left to send at commit: the produce with its registration, then a bare
        # EndTxn (PREPARE, then markers and COMPLETE).
        (True, 3),
    ],
)
def test_db_commits_of_a_one_record_transaction(
    db_url: str, broker: Broker, flushed_first: bool, commits_per_transaction: int
) -> None:
    producer = Producer({"database.url": db_url, "transactional.id": "one", "linger.ms": 10_000})
    try:
        producer.init_transactions()
        commits = count_commits(producer)
        for i in range(3):
            producer.begin_transaction()
            producer.produce("t", str(i), partition=i)
            if flushed_first:
                assert producer.flush(30) == 0
            producer.commit_transaction()
        assert commits[0] == 3 * commits_per_transaction
    finally:
        producer.close()
    assert [read_values(broker, "t", p) for p in range(3)] == [["0"], ["1"], ["2"]]
    assert events(broker, "one")[-3:] == ["AddPartitionsToTxn", "EndTxn", "markers written"]


@pytest.mark.parametrize("reached", [True, False])
def test_registration_lost_with_the_connection_then_abort(
    db_url: str, broker: Broker, monkeypatch: pytest.MonkeyPatch, reached: bool
) -> None:
    """The registering request's answer is lost every time (``reached``: it committed),
    until the batch times out (flushed before the commit, so it goes without the EndTxn):
    aborting must still leave nothing behind and an identity that works."""

    def lose_answer(request: ProduceBatchesRequest) -> Any:
        if request.add is None:
            return real(request)
        if reached:
            real(request)
        raise lost_connection()

    producer = Producer(
        {"database.url": db_url, "transactional.id": "lost", "linger.ms": 0,
         "retry.backoff.ms": 5, "message.timeout.ms": 300}
    )  # fmt: skip
    try:
        producer.init_transactions()
        real = producer.sender.transport
        monkeypatch.setattr(producer.sender, "transport", lose_answer)
        failed: list[Any] = []
        producer.begin_transaction()
        producer.produce("t", "lost", partition=0, on_delivery=lambda e, m: failed.append(e))
        assert producer.flush(30) == 0
        with pytest.raises(KafkaException):
            producer.commit_transaction()
        assert len(failed) == 1 and failed[0] is not None
        producer.abort_transaction()
        assert state_of(broker, "lost") == (m.COMPLETE_ABORT if reached else m.EMPTY)
        monkeypatch.setattr(producer.sender, "transport", real)
        producer.begin_transaction()
        producer.produce("t", "next", partition=0)
        producer.commit_transaction()
    finally:
        producer.close()
    assert read_values(broker, "t", 0) == ["next"]


def registered_partitions(broker: Broker, tid: str) -> list[tuple[str, int]]:
    with broker.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT partitions FROM transactions WHERE transactional_id = :t"), {"t": tid}
        ).scalar_one()
    return [(t, p) for t, p in rows]


def test_a_refused_batch_does_not_register_its_partition(broker: Broker) -> None:
    """The partition has seen the transaction's producer id at a later epoch than the
    coordinator's: its batch is refused, so the request must not register it either, or
    the transaction would hold a partition whose abort marker is refused (never ending)."""
    d = TxnDriver(broker, "ahead")
    assert d.init() == 0
    assert d.send("t", 0, "kept").error_code == 0
    ahead = produce(
        broker,
        ProduceRequest(
            "t", 1, [RecordIn(None, b"idempotent", 0)], producer_id=d.producer_id,
            producer_epoch=d.producer_epoch, base_sequence=0,
        ),
    )  # fmt: skip
    assert ahead.error_code == 0
    # Produce refuses an epoch the coordinator never handed out, so a partition ahead of
    # the coordinator is set up as a state left by older data would be.
    with broker.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE producer_states SET producer_epoch = producer_epoch + 2"
                " WHERE topic = 't' AND partition = 1 AND producer_id = :pid"
            ),
            {"pid": d.producer_id},
        )
    before = events(broker, "ahead")
    registered, responses = produce_registering(
        broker, [txn_request(d, 1, "refused")], registering(d, 1)
    )
    assert [r.error_code for r in responses] == [KafkaError.INVALID_PRODUCER_EPOCH]
    assert registered is not None
    assert registered.results == {("t", 1): KafkaError.INVALID_PRODUCER_EPOCH}
    assert registered_partitions(broker, "ahead") == [("t", 0)]
    assert events(broker, "ahead") == before
    assert d.end(commit=False) == 0
    assert state_of(broker, "ahead") == m.COMPLETE_ABORT
    assert read_values(broker, "t", 0) == []
    assert read_values(broker, "t", 1) == ["idempotent"]


def test_only_partitions_whose_batch_is_refused_stay_unregistered(broker: Broker) -> None:
    """One request registering three partitions: "t" 0 already registered (its batch
    refused: it stays), "t" 1 new and accepted (registered), "t" 2 new and refused (not)."""
    d = TxnDriver(broker, "mixed")
    assert d.init() == 0
    assert d.send("t", 0, "first").error_code == 0
    gap = ProduceRequest(
        "t", 0, [RecordIn(None, b"gap", 0)], producer_id=d.producer_id,
        producer_epoch=d.producer_epoch, base_sequence=5, transactional_id="mixed",
        is_transactional=True,
    )  # fmt: skip
    empty = ProduceRequest(
        "t", 2, [], producer_id=d.producer_id, producer_epoch=d.producer_epoch,
        base_sequence=0, transactional_id="mixed", is_transactional=True,
    )  # fmt: skip
    registered, responses = produce_registering(
        broker, [gap, txn_request(d, 1, "accepted"), empty], registering(d, 0, 1, 2)
    )
    assert [r.error_code for r in responses] == [
        KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, 0, KafkaError.INVALID_RECORD,
    ]  # fmt: skip
    assert registered is not None and registered.error_code == 0
    assert registered.results == {
        ("t", 0): 0, ("t", 1): 0, ("t", 2): KafkaError.INVALID_RECORD,
    }  # fmt: skip
    assert registered_partitions(broker, "mixed") == [("t", 0), ("t", 1)]
    d.sequences[("t", 1)] = 1
    assert d.end(commit=True) == 0
    assert [read_values(broker, "t", p) for p in range(3)] == [["first"], ["accepted"], []]
    with broker.engine.connect() as conn:
        assert compute_transactions(conn, broker.settings) == live_transactions(conn)


def test_a_partition_twice_in_one_request_is_decided_batch_after_batch(broker: Broker) -> None:
    """Batches for one partition in one request are decided one after the other, each on
    the offsets and producer state the one before left: a gap after a refused batch is
    refused, a retry of an earlier batch in the same request is a duplicate."""
    responses = produce_many(
        broker,
        [
            batch(0, 0, "a", "b"),
            batch(1, 0, "x"),
            batch(0, 2, "c"),  # follows the first batch of partition 0
            batch(0, 0, "a", "b"),  # the first batch again: a duplicate, with its offsets
            batch(0, 9, "gap"),  # out of order after "c"
            batch(0, 3, "d"),
        ],
    )
    answers = [(r.error_code, r.base_offset, r.duplicate) for r in responses]
    assert answers == [
        (0, 0, False),
        (0, 0, False),
        (0, 2, False),
        (0, 0, True),
        (KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, -1, False),
        (0, 3, False),
    ]
    assert stored(broker) == [(0, 0, b"a"), (0, 1, b"b"), (0, 2, b"c"), (0, 3, b"d"), (1, 0, b"x")]
    assert_partition_log_rebuilds(broker, broker.clock.now_ms())
