"""The transactional Producer through the public client API (confluent-kafka's), against a
real PostgreSQL with the in-process coordinator loop: commit/abort visibility at both
isolation levels, API misuse, fencing at each call, abortable errors, the transaction
timeout, offsets sent to a transaction, and KIP-890's epoch bump per transaction."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import text

from app.admin import AdminClient
from app.broker import Broker
from app.broker.loop import CoordinatorLoop
from app.client import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    Consumer,
    ConsumerGroupMetadata,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from app.client import txn_manager as tm
from app.groups.offsets import offset_fetch
from app.protocol import OffsetFetchRequest, TopicPartitionKey
from tests.helpers.client_helpers import create_topics, group_consumer

TOPICS = {"alpha": 3, "beta": 2, "gamma": 4}


# ------------------------------------------------------------------ helpers


@pytest.fixture
def topics(db_url: str) -> dict[str, int]:
    create_topics(db_url, TOPICS)
    return TOPICS


def txn_producer(db_url: str, clients: list[Any], tid: str, **extra: Any) -> Producer:
    p = Producer({"database.url": db_url, "transactional.id": tid, "linger.ms": 5, **extra})
    clients.append(p)
    return p


def read_to_end(
    db_url: str, partitions: list[TopicPartitionKey], isolation: str = "read_committed"
) -> dict[TopicPartitionKey, list[tuple[int, bytes | None]]]:
    """Everything a fresh reader at ``isolation`` gets from the log start up to the end it
    sees right now: it stops at the first EOF of every partition, so it never waits for a
    record that is not visible yet."""
    got: dict[TopicPartitionKey, list[tuple[int, bytes | None]]] = {tp: [] for tp in partitions}
    eof: set[TopicPartitionKey] = set()
    with Consumer(
        {
            "database.url": db_url,
            "isolation.level": isolation,
            "enable.partition.eof": True,
        }
    ) as c:
        c.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in partitions])
        deadline = time.monotonic() + 30
        while eof != set(partitions):
            assert time.monotonic() < deadline, f"no EOF for {set(partitions) - eof}"
            m = c.poll(0.5)
            if m is None:
                continue
            key = (m.topic() or "", m.partition() or 0)
            err = m.error()
            if err is not None:
                assert err.code() == KafkaError._PARTITION_EOF, err
                eof.add(key)
                continue
            got[key].append((m.offset() or 0, m.value()))
    return got


def all_partitions(spec: dict[str, int]) -> list[TopicPartitionKey]:
    return [(t, p) for t, n in sorted(spec.items()) for p in range(n)]


def produce_round(
    producer: Producer, spec: dict[str, int], tag: str, per_partition: int
) -> dict[TopicPartitionKey, list[tuple[int, bytes]]]:
    """Produce ``per_partition`` records to every partition; returns the delivered
    (offset, value) per partition (the reports are served by the flush)."""
    delivered: dict[TopicPartitionKey, list[tuple[int, bytes]]] = {
        tp: [] for tp in all_partitions(spec)
    }
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(err)
            return
        delivered[(msg.topic() or "", msg.partition() or 0)].append(
            (msg.offset() or 0, msg.value() or b"")
        )

    for t, p in all_partitions(spec):
        for i in range(per_partition):
            producer.produce(t, f"{tag}-{t}-{p}-{i}".encode(), partition=p, on_delivery=on_delivery)
    assert producer.flush(30) == 0
    assert not errors, errors
    for values in delivered.values():
        values.sort()
    return delivered


def expect_error(fn: Callable[[], Any]) -> KafkaError:
    with pytest.raises(KafkaException) as info:
        fn()
    err = info.value.args[0]
    assert isinstance(err, KafkaError)
    return err


def expect_code(code: int, fn: Callable[[], Any]) -> KafkaError:
    err = expect_error(fn)
    assert err.code() == code, err
    return err


def assert_fatal_fenced(err: KafkaError) -> None:
    assert err.code() == KafkaError._FENCED, err
    assert err.fatal()
    assert not err.retriable()
    assert not err.txn_requires_abort()


def partition_status(db_url: str) -> dict[TopicPartitionKey, tuple[int, int]]:
    """(high watermark, LSO) per partition, from the admin view."""
    with Broker.connect(db_url).engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT topic, partition, high_watermark, last_stable_offset FROM partition_status"
            )
        ).all()
    return {(r.topic, r.partition): (r.high_watermark, r.last_stable_offset) for r in rows}


def epoch_of(db_url: str, tid: str) -> tuple[int, int, str]:
    admin = AdminClient({"database.url": db_url})
    try:
        d = admin.describe_transactions([tid])[tid]
    finally:
        admin.close()
    return d.producer_id, d.producer_epoch, d.state


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def wait_assigned(consumers: list[Consumer], expected_total: int) -> None:
    """Poll every consumer (one thread, in turn) until their assignments cover
    ``expected_total`` partitions with the same generation."""
    deadline = time.monotonic() + 30
    while True:
        for c in consumers:
            c.poll(0.05)
        total = sum(len(c.assignment()) for c in consumers)
        generations = {c.consumer_group_metadata().generation_id for c in consumers}
        if total == expected_total and len(generations) == 1 and -1 not in generations:
            return
        assert time.monotonic() < deadline, "group did not settle"


# ------------------------------------------------------------------ commit / abort


def test_commit_and_abort_across_topics_at_both_isolation_levels(
    db_url: str, topics: dict[str, int], clients: list[Any]
) -> None:
    parts = all_partitions(topics)
    p = txn_producer(db_url, clients, "multi")
    p.init_transactions()

    p.begin_transaction()
    c1 = produce_round(p, topics, "c1", 3)
    # Open: read_uncommitted sees the records, read_committed nothing yet.
    assert read_to_end(db_url, parts) == {tp: [] for tp in parts}
    assert read_to_end(db_url, parts, "read_uncommitted") == c1
    p.commit_transaction()
    # When commit returns, the markers are written: visible at once, no waiting.
    assert read_to_end(db_url, parts) == c1

    p.begin_transaction()
    a1 = produce_round(p, topics, "a1", 2)
    p.abort_transaction()
    assert read_to_end(db_url, parts) == c1

    p.begin_transaction()
    c2 = produce_round(p, topics, "c2", 4)
    p.commit_transaction()

    committed = read_to_end(db_url, parts)
    uncommitted = read_to_end(db_url, parts, "read_uncommitted")
    status = partition_status(db_url)
    for tp in parts:
        assert committed[tp] == c1[tp] + c2[tp]
        # All data records, aborted ones included, in offset order...
        assert uncommitted[tp] == sorted(c1[tp] + a1[tp] + c2[tp])
        # ...and never a marker: the three markers are exactly the offsets nobody returned.
        hw, lso = status[tp]
        assert hw == lso == 3 + 2 + 4 + 3
        data = {o for o, _ in uncommitted[tp]}
        markers = set(range(hw)) - data
        assert markers == {3, 3 + 1 + 2, hw - 1}
        assert all(v is not None and not v.startswith(b"a1") for _, v in committed[tp])


def test_read_committed_consumer_waiting_in_poll_sees_the_commit(
    db_url: str, topics: dict[str, int], clients: list[Any]
) -> None:
    """A consumer already polling gets the records once the commit returns, and none of
    an aborted transaction before or after."""
    p = txn_producer(db_url, clients, "live")
    p.init_transactions()
    c = Consumer({"database.url": db_url, "enable.partition.eof": False})
    clients.append(c)
    c.assign([TopicPartition("beta", q, OFFSET_BEGINNING) for q in range(2)])
    p.begin_transaction()
    for i in range(5):
        p.produce("beta", f"x{i}".encode(), partition=i % 2)
    p.flush(60)
    assert c.poll(0.3) is None
    p.abort_transaction()
    p.begin_transaction()
    for i in range(5):
        p.produce("beta", f"y{i}".encode(), partition=i % 2)
    p.commit_transaction()
    got = c.consume(5, timeout=60)
    assert sorted(m.value() or b"" for m in got) == [f"y{i}".encode() for i in range(5)]
    assert c.poll(0.2) is None


# ------------------------------------------------------------------ API misuse


def test_api_misuse_raises_typed_errors(
    db_url: str, topics: dict[str, int], clients: list[Any]
) -> None:
    p = txn_producer(db_url, clients, "misuse")
    meta = ConsumerGroupMetadata("g")
    positions = [TopicPartition("alpha", 0, 1)]
    # Before init_transactions.
    for fn in (
        lambda: p.produce("alpha", b"v", partition=0),
        p.begin_transaction,
        p.commit_transaction,
        p.abort_transaction,
        lambda: p.send_offsets_to_transaction(positions, meta),
    ):
        err = expect_code(KafkaError._STATE, fn)
        assert not err.fatal() and not err.txn_requires_abort()

    p.init_transactions()
    expect_code(KafkaError._STATE, p.init_transactions)
    # Outside a transaction.
    expect_code(KafkaError._STATE, lambda: p.produce("alpha", b"v", partition=0))
    expect_code(KafkaError._STATE, p.commit_transaction)
    expect_code(KafkaError._STATE, p.abort_transaction)
    expect_code(KafkaError._STATE, lambda: p.send_offsets_to_transaction(positions, meta))

    p.begin_transaction()
    expect_code(KafkaError._STATE, p.begin_transaction)
    expect_code(KafkaError._STATE, p.init_transactions)
    bad_metadata: list[Any] = [{"group_id": "g"}, "g", None, ("g", -1, "")]
    for bad in bad_metadata:

        def send_bad(b: Any = bad) -> None:
            p.send_offsets_to_transaction(positions, b)

        expect_code(KafkaError._INVALID_ARG, send_bad)
    # The misuse did not break the transaction.
    p.produce("alpha", b"ok", partition=0)
    p.commit_transaction()
    assert read_to_end(db_url, [("alpha", 0)])[("alpha", 0)] == [(0, b"ok")]

    plain = Producer({"database.url": db_url})
    clients.append(plain)
    for fn in (
        plain.init_transactions,
        plain.begin_transaction,
        plain.commit_transaction,
        plain.abort_transaction,
        lambda: plain.send_offsets_to_transaction(positions, meta),
    ):
        expect_code(KafkaError._NOT_CONFIGURED, fn)


def test_negative_offsets_in_positions_are_ignored(
    db_url: str, topics: dict[str, int], clients: list[Any]
) -> None:
    consumer = group_consumer(db_url, clients, "neg")
    p = txn_producer(db_url, clients, "neg-tx")
    p.init_transactions()

    # Only negative entries: nothing to send, and the empty transaction commits.
    p.begin_transaction()
    p.send_offsets_to_transaction(
        [TopicPartition("alpha", 0, OFFSET_INVALID), TopicPartition("alpha", 1, -1)],
        consumer.consumer_group_metadata(),
    )
    p.commit_transaction()

    p.begin_transaction()
    p.send_offsets_to_transaction(
        [
            TopicPartition("alpha", 0, OFFSET_INVALID),
            TopicPartition("alpha", 1, 7),
            TopicPartition("alpha", 2, OFFSET_BEGINNING),
        ],
        consumer.consumer_group_metadata(),
    )
    p.commit_transaction()
    got = consumer.committed([TopicPartition("alpha", q) for q in range(3)], timeout=60)
    assert [tp.offset for tp in got] == [OFFSET_INVALID, 7, OFFSET_INVALID]


# ------------------------------------------------------------------ fencing


def test_fenced_at_flush_and_commit(
    db_url: str, topics: dict[str, int], clients: list[Any]
) -> None:
    old = txn_producer(db_url, clients, "fence")
    old.init_transactions()
    old.begin_transaction()
    produce_round(old, {"alpha": 3}, "zombie", 2)  # in the log, transaction open

    new = txn_producer(db_url, clients, "fence")
    new.init_transactions()
    # The old instance's open transaction was aborted: never visible, LSO released.
    parts = all_partitions({"alpha": 3})
    assert read_to_end(db_url, parts) == {tp: [] for tp in parts}
    status = partition_status(db_url)
    assert all(status[tp][0] == status[tp][1] for tp in parts)

    # The zombie writes again (partitions it had added, and a new one) and commits.
    reports: list[KafkaError | None] = []
    old.produce("alpha", b"late", partition=0, on_delivery=lambda e, m: reports.append(e))
    old.produce("beta", b"late", partition=0, on_delivery=lambda e, m: reports.append(e))
    err = expect_error(old.commit_transaction)
    assert_fatal_fenced(err)
    # The sender may meet the fence before the commit does (a loaded machine), and the
    # commit then fails at once; the failed records' reports come with the next poll, as
    # librdkafka serves them.
    deadline = time.monotonic() + 60  # hang guard only
    while len(reports) < 2 and time.monotonic() < deadline:
        old.poll(0.1)
    assert len(reports) == 2 and all(e is not None for e in reports), reports
    # Fatal is sticky: every transactional call fails the same way.
    for fn in (
        old.begin_transaction,
        old.abort_transaction,
        old.commit_transaction,
        lambda: old.produce("alpha", b"x", partition=0),
    ):
        assert_fatal_fenced(expect_error(fn))

    # The new instance works, and nothing of the zombie ever became visible.
    new.begin_transaction()
    new.produce("alpha", b"fresh", partition=1)
    new.commit_transaction()
    seen = read_to_end(db_url, [*parts, ("beta", 0)])
    assert [v for tp in seen for _, v in seen[tp]] == [b"fresh"]


def test_fenced_at_flush_without_new_partitions(
    db_url: str, topics: dict[str, int], clients: list[Any]
) -> None:
    old = txn_producer(db_url, clients, "fence-flush")
    old.init_transactions()
    old.begin_transaction()
    old.produce("gamma", b"first", partition=2)
    assert old.flush(60) == 0
    new = txn_producer(db_url, clients, "fence-flush")
    new.init_transactions()
    reports: list[KafkaError | None] = []
    old.produce("gamma", b"second", partition=2, on_delivery=lambda e, m: reports.append(e))
    assert old.flush(60) == 0
    assert len(reports) == 1 and reports[0] is not None
    assert reports[0].code() in (
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError._FENCED,
    ), reports[0]
    assert_fatal_fenced(expect_error(old.commit_transaction))
    assert read_to_end(db_url, [("gamma", 2)], "read_uncommitted")[("gamma", 2)] == [(0, b"first")]
    assert read_to_end(db_url, [("gamma", 2)])[("gamma", 2)] == []


def test_fenced_at_send_offsets(db_url: str, topics: dict[str, int], clients: list[Any]) -> None:
    consumer = group_consumer(db_url, clients, "fence-g")
    old = txn_producer(db_url, clients, "fence-offsets")
    old.init_transactions()
    old.begin_transaction()
    old.produce("alpha", b"zombie", partition=0)
    assert old.flush(60) == 0
    new = txn_producer(db_url, clients, "fence-offsets")
    new.init_transactions()
    err = expect_error(
        lambda: old.send_offsets_to_transaction(
            [TopicPartition("beta", 0, 5)], consumer.consumer_group_metadata()
        )
    )
    assert_fatal_fenced(err)
    assert_fatal_fenced(expect_error(old.commit_transaction))
    assert consumer.committed([TopicPartition("beta", 0)], timeout=60)[0].offset == OFFSET_INVALID
    assert read_to_end(db_url, [("alpha", 0)])[("alpha", 0)] == []


def test_fenced_before_begin(db_url: str, topics: dict[str, int], clients: list[Any]) -> None:
    old = txn_producer(db_url, clients, "fence-begin")
    old.init_transactions()
    new = txn_producer(db_url, clients, "fence-begin")
    new.init_transactions()
    # begin_transaction is local (as in librdkafka); the fence shows at produce/commit.
    old.begin_transaction()
    old.produce("beta", b"zombie", partition=1)
    assert_fatal_fenced(expect_error(old.commit_transaction))
    assert read_to_end(db_url, [("beta", 1)], "read_uncommitted")[("beta", 1)] == []

    # The new instance is unaffected.
    new.begin_transaction()
    new.produce("beta", b"ok", partition=1)
    new.commit_transaction()
    assert [v for _, v in read_to_end(db_url, [("beta", 1)])[("beta", 1)]] == [b"ok"]


def test_fenced_instance_that_only_sends_offsets(
    db_url: str, topics: dict[str, int], clients: list[Any]
) -> None:
    consumer = group_consumer(db_url, clients, "fence-only-offsets")
    old = txn_producer(db_url, clients, "fence-o")
    old.init_transactions()
    new = txn_producer(db_url, clients, "fence-o")
    new.init_transactions()
    old.begin_transaction()
    err = expect_error(
        lambda: old.send_offsets_to_transaction(
            [TopicPartition("alpha", 1, 3)], consumer.consumer_group_metadata()
        )
    )
    assert_fatal_fenced(err)


# ------------------------------------------------------------------ abortable errors


def test_stale_group_metadata_is_abortable(
    db_url: str, topics: dict[str, int], clients: list[Any]
) -> None:
    first = group_consumer(db_url, clients, "stale")
    first.subscribe(["alpha"])
    wait_assigned([first], 3)
    stale = first.consumer_group_metadata()
    assert stale.generation_id >= 0 and stale.member_id

    second = group_consumer(db_url, clients, "stale")
    second.subscribe(["alpha"])
    wait_assigned([first, second], 3)
    current = first.consumer_group_metadata()
    assert current.generation_id > stale.generation_id

    p = txn_producer(db_url, clients, "abortable")
    p.init_transactions()
    p.begin_transaction()
    p.produce("beta", b"doomed", partition=0)
    err = expect_error(
        lambda: p.send_offsets_to_transaction([TopicPartition("alpha", 0, 1)], stale)
    )
    assert err.txn_requires_abort(), err
    assert not err.fatal()
    assert err.code() == KafkaError.ILLEGAL_GENERATION
    # Nothing but an abort is possible now.
    err = expect_error(p.commit_transaction)
    assert err.txn_requires_abort() and not err.fatal()
    err = expect_error(lambda: p.produce("beta", b"more", partition=0))
    assert err.txn_requires_abort()
    p.abort_transaction()

    # The producer carries on with a new transaction.
    p.begin_transaction()
    p.produce("beta", b"fine", partition=0)
    p.send_offsets_to_transaction(
        [TopicPartition(tp.topic, tp.partition, 1) for tp in first.assignment()], current
    )
    p.commit_transaction()
    assert [v for _, v in read_to_end(db_url, [("beta", 0)])[("beta", 0)]] == [b"fine"]
    got = first.committed(first.assignment(), timeout=60)
    assert got and all(tp.offset == 1 for tp in got)


# ------------------------------------------------------------------ transaction timeout


def test_transaction_timeout_aborts_and_fences(
    db_url: str, topics: dict[str, int], clients: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIP98_COORDINATOR_INTERVAL_MS", "100")
    # The coordinator loop runs from the moment the producer stalls (not inside it, where
    # it could time the transaction out before its records are in, on a slow machine).
    monkeypatch.setenv("KIP98_CLIENT_COORDINATOR_LOOP", "0")
    p = txn_producer(db_url, clients, "slow", **{"transaction.timeout.ms": 1000})
    p.init_transactions()
    pid, epoch, _ = epoch_of(db_url, "slow")
    p.begin_transaction()
    produced = produce_round(p, {"gamma": 4}, "late", 2)
    parts = all_partitions({"gamma": 4})

    # The producer stalls; the coordinator loop times the transaction out.
    loop = CoordinatorLoop(Broker.connect(db_url))
    loop.start()
    try:
        wait_for(lambda: epoch_of(db_url, "slow")[2] == "COMPLETE_ABORT", "the timeout abort", 60)
    finally:
        loop.stop()
    assert read_to_end(db_url, parts, "read_uncommitted") == produced
    assert epoch_of(db_url, "slow")[:2] == (pid, epoch + 1)  # fenced by an epoch bump
    assert read_to_end(db_url, parts) == {tp: [] for tp in parts}
    status = partition_status(db_url)
    for tp in parts:
        hw, lso = status[tp]
        assert lso == hw == 3  # two records and the abort marker

    assert_fatal_fenced(expect_error(p.commit_transaction))
    assert read_to_end(db_url, parts) == {tp: [] for tp in parts}


# ------------------------------------------------------------------ send_offsets_to_transaction


def test_offsets_commit_only_with_the_transaction(
    db_url: str, topics: dict[str, int], clients: list[Any]
) -> None:
    broker = Broker.connect(db_url)
    with Producer({"database.url": db_url}) as feeder:
        for i in range(10):
            feeder.produce("alpha", f"in{i}".encode(), partition=i % 3)
        assert feeder.flush(60) == 0

    consumer = group_consumer(db_url, clients, "copy")
    consumer.subscribe(["alpha"])
    got = consumer.consume(10, timeout=60)
    assert len(got) == 10
    assignment = consumer.assignment()
    positions = consumer.position(assignment)
    assert sorted(tp.offset for tp in positions) == [3, 3, 4]

    p = txn_producer(db_url, clients, "copier")
    p.init_transactions()
    p.begin_transaction()
    for m in got:
        p.produce("beta", (m.value() or b"").upper(), partition=0)
    p.send_offsets_to_transaction(positions, consumer.consumer_group_metadata())

    # Pending: require_stable makes committed() wait (and time out here); without
    # require_stable the group still has no committed offset.
    expect_code(KafkaError._TIMED_OUT, lambda: consumer.committed(assignment, timeout=0.5))
    r = offset_fetch(broker, OffsetFetchRequest("copy", None, require_stable=False))
    assert r.error_code == 0 and r.offsets == {}

    p.commit_transaction()
    committed = consumer.committed(assignment, timeout=60)
    assert {(tp.topic, tp.partition): tp.offset for tp in committed} == {
        (tp.topic, tp.partition): tp.offset for tp in positions
    }

    # An aborted transaction's offsets never land.
    p.begin_transaction()
    p.produce("beta", b"nope", partition=0)
    p.send_offsets_to_transaction(
        [TopicPartition(tp.topic, tp.partition, tp.offset + 100) for tp in positions],
        consumer.consumer_group_metadata(),
    )
    expect_code(KafkaError._TIMED_OUT, lambda: consumer.committed(assignment, timeout=0.3))
    p.abort_transaction()
    after = consumer.committed(assignment, timeout=60)
    assert [tp.offset for tp in after] == [tp.offset for tp in committed]
    out = read_to_end(db_url, [("beta", 0)])[("beta", 0)]
    assert sorted(v or b"" for _, v in out) == sorted((m.value() or b"").upper() for m in got)


def test_offsets_join_the_transaction_with_their_first_commit(
    db_url: str, topics: dict[str, int], clients: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """KIP-890's transaction version 2: a transaction's first send_offsets_to_transaction
    is one TxnOffsetCommit that also adds the group's offsets (no AddOffsetsToTxn), the
    next ones in it only commit offsets, and the next transaction adds them again."""
    sent: list[tuple[str, bool | None]] = []
    handle = Broker.handle

    def recording(self: Broker, request: Any) -> Any:
        sent.append((type(request).__name__, getattr(request, "add_offsets", None)))
        return handle(self, request)

    monkeypatch.setattr(Broker, "handle", recording)
    consumer = group_consumer(db_url, clients, "v2-offsets")
    meta = consumer.consumer_group_metadata()
    p = txn_producer(db_url, clients, "v2-offsets-tx")
    p.init_transactions()
    for txn in range(2):
        p.begin_transaction()
        sent.clear()
        p.send_offsets_to_transaction([TopicPartition("gamma", 0, 10 * txn + 1)], meta)
        p.send_offsets_to_transaction([TopicPartition("gamma", 1, 10 * txn + 2)], meta)
        assert sent == [("TxnOffsetCommitRequest", True), ("TxnOffsetCommitRequest", False)]
        p.commit_transaction()
        got = consumer.committed([TopicPartition("gamma", 0), TopicPartition("gamma", 1)], 10)
        assert [tp.offset for tp in got] == [10 * txn + 1, 10 * txn + 2]


def test_offsets_from_a_consumer_that_never_subscribed(
    db_url: str, topics: dict[str, int], clients: list[Any]
) -> None:
    consumer = group_consumer(db_url, clients, "assign-only")
    meta = consumer.consumer_group_metadata()
    assert (meta.generation_id, meta.member_id) == (-1, "")
    p = txn_producer(db_url, clients, "assign-only-tx")
    p.init_transactions()
    p.begin_transaction()
    p.send_offsets_to_transaction([TopicPartition("gamma", 3, 42)], meta)
    p.commit_transaction()
    assert consumer.committed([TopicPartition("gamma", 3)], timeout=60)[0].offset == 42


# ------------------------------------------------------------------ KIP-890 epochs


def test_each_transaction_bumps_the_epoch(
    db_url: str, topics: dict[str, int], clients: list[Any]
) -> None:
    consumer = group_consumer(db_url, clients, "epochs")
    p = txn_producer(db_url, clients, "epochs-tx")
    p.init_transactions()
    pid, epoch, state = epoch_of(db_url, "epochs-tx")
    assert state == "EMPTY"
    for i in range(4):
        p.begin_transaction()
        p.produce("alpha", f"v{i}".encode(), partition=i % 3)
        if i % 2:
            p.send_offsets_to_transaction(
                [TopicPartition("beta", 0, i)], consumer.consumer_group_metadata()
            )
        if i == 2:
            assert p.flush(60) == 0  # on the broker, so the abort is a real EndTxn
            p.abort_transaction()
        else:
            p.commit_transaction()
        now = epoch_of(db_url, "epochs-tx")
        assert now == (pid, epoch + i + 1, "COMPLETE_ABORT" if i == 2 else "COMPLETE_COMMIT")
    # An offsets-only transaction bumps it too.
    p.begin_transaction()
    p.send_offsets_to_transaction(
        [TopicPartition("beta", 1, 9)], consumer.consumer_group_metadata()
    )
    p.commit_transaction()
    assert epoch_of(db_url, "epochs-tx") == (pid, epoch + 5, "COMPLETE_COMMIT")
    values = read_to_end(db_url, all_partitions({"alpha": 3}))
    assert sorted(v or b"" for vs in values.values() for _, v in vs) == [b"v0", b"v1", b"v3"]


def test_abort_before_anything_was_sent_ends_locally(
    db_url: str, topics: dict[str, int], clients: list[Any]
) -> None:
    """Records still lingering are purged (_PURGE_QUEUE), as in librdkafka; the transaction
    never reached the coordinator, so there is no EndTxn and no new epoch."""
    p = txn_producer(db_url, clients, "purge", **{"linger.ms": 30_000})
    p.init_transactions()
    pid, epoch, _ = epoch_of(db_url, "purge")
    purged: list[KafkaError | None] = []
    p.begin_transaction()
    p.produce("alpha", b"never", partition=0, on_delivery=lambda e, m: purged.append(e))
    p.abort_transaction()
    p.poll(0)
    assert len(purged) == 1 and purged[0] is not None
    assert purged[0].code() == KafkaError._PURGE_QUEUE
    assert epoch_of(db_url, "purge") == (pid, epoch, "EMPTY")
    assert read_to_end(db_url, [("alpha", 0)], "read_uncommitted")[("alpha", 0)] == []
    p.begin_transaction()
    p.produce("alpha", b"later", partition=0)
    p.commit_transaction()
    assert read_to_end(db_url, [("alpha", 0)])[("alpha", 0)] == [(0, b"later")]


def test_records_timing_out_unsent_make_the_transaction_abortable(
    db_url: str, topics: dict[str, int], clients: list[Any]
) -> None:
    """A record that expires before it is sent never reaches the coordinator, so without
    this the commit would end an empty transaction and succeed: the record would be lost
    with the transaction reported committed (the process paused past message.timeout.ms)."""
    # The record expires after a second; the transactions have a minute, however slow.
    p = txn_producer(db_url, clients, "expire", **{"message.timeout.ms": 1000})
    p.init_transactions()
    reports: list[KafkaError | None] = []
    p.begin_transaction()
    with p._accumulator.lock:  # the sender cannot form a batch: as if the process were paused
        p.produce("alpha", b"lost?", partition=0, on_delivery=lambda e, m: reports.append(e))
        time.sleep(1.2)
    err = expect_error(lambda: p.commit_transaction(60))
    assert err.code() == KafkaError._MSG_TIMED_OUT and err.txn_requires_abort()
    assert [e.code() if e else None for e in reports] == [KafkaError._MSG_TIMED_OUT]
    p.abort_transaction(60)
    p.begin_transaction()
    p.produce("alpha", b"kept", partition=0)
    p.commit_transaction(60)
    assert read_to_end(db_url, [("alpha", 0)])[("alpha", 0)] == [(0, b"kept")]


def test_a_started_commit_can_only_be_retried_unless_it_failed_abortably() -> None:
    """The client machine (librdkafka's): once commit_transaction() started, abort is
    refused, not fatally and without requiring an abort, until the commit completes or
    fails in a way that proves the transaction did not commit (abortable)."""
    manager = tm.TransactionManager()
    for trigger in ("initialized", "begin", "start_commit"):
        manager.fire(trigger, trigger)
    with pytest.raises(KafkaException) as refused:
        manager.fire("start_abort", "abort_transaction")
    err = refused.value.args[0]
    assert err.code() == KafkaError._STATE and "commit_transaction() again" in err.str()
    assert not (err.retriable() or err.fatal() or err.txn_requires_abort())
    assert manager.state == tm.COMMITTING
    manager.fail(KafkaError(KafkaError.INVALID_TXN_STATE))
    manager.fire("start_abort", "abort_transaction")
    assert manager.state == tm.ABORTING
