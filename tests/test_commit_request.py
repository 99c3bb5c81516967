"""The commit as one request: a transaction's last batches with its EndTxn (one DB
transaction), how a retry of it is answered, what a refused batch does, and the Producer
using it, including when its answer is lost."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import text

from app.broker import Broker
from app.broker.produce import produce
from app.client import KafkaException, Producer
from app.coordinator import machines as m
from app.coordinator.rebuild import compute_transactions, live_transactions
from app.errors import KafkaError
from app.protocol import ProduceBatchesRequest, ProduceRequest, RecordIn
from tests.helpers.backends import lost_connection
from tests.helpers.projections import assert_partition_log_rebuilds
from tests.helpers.txn_driver import TxnDriver, partition_offsets, read_values, state_of

PARTITIONS = [("t", 0), ("t", 1), ("u", 0)]


pytestmark = pytest.mark.broker(topics={"t": 2, "u": 1})


def events(broker: Broker, tid: str) -> list[str]:
    with broker.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT state FROM transaction_log WHERE transactional_id = :t ORDER BY event_id"),
            {"t": tid},
        )
        return [r[0] for r in rows]


def settled(broker: Broker) -> bool:
    offsets = [partition_offsets(broker, t, p) for t, p in PARTITIONS]
    return all(hw == lso for hw, lso in offsets)


def test_batches_and_end_commit_together(broker: Broker) -> None:
    driver = TxnDriver(broker, "c")
    assert driver.init() == 0
    before = (driver.producer_id, driver.producer_epoch)
    r = driver.commit_with(
        driver.requests(("t", 0, "a"), ("t", 1, "b"), ("u", 0, "c")), register=PARTITIONS
    )
    assert r.registered is not None and r.registered.error_code == 0
    assert [b.error_code for b in r.batches] == [0, 0, 0]
    assert [b.base_offset for b in r.batches] == [0, 0, 0]
    assert r.end.error_code == 0
    assert (r.end.producer_id, r.end.producer_epoch) == (before[0], before[1] + 1)  # KIP-890
    assert [read_values(broker, t, p) for t, p in PARTITIONS] == [["a"], ["b"], ["c"]]
    assert settled(broker)
    # Every transition is still an event, in order, and the projection their fold.
    assert events(broker, "c")[-3:] == [m.BEGIN, m.PREPARE_COMMIT, m.COMPLETE_COMMIT]
    assert_transactions_rebuild(broker)
    # The markers' write superseded the appends' advance of the same partitions: the
    # partition rows and producer states are still the fold of the log.
    assert_partition_log_rebuilds(broker, broker.clock.now_ms())


def assert_transactions_rebuild(broker: Broker) -> None:
    with broker.engine.connect() as conn:
        assert compute_transactions(conn, broker.settings) == live_transactions(conn)


def test_a_retry_after_the_commit_is_answered_with_the_first_answer(broker: Broker) -> None:
    """The answer was lost after COMMIT: the same request again appends nothing, ends
    nothing, and answers the batches with the offsets they were given."""
    driver = TxnDriver(broker, "r")
    assert driver.init() == 0
    assert driver.send("t", 0, "earlier").error_code == 0  # the batch of "t" 0 lands at 1
    requests = driver.requests(("t", 0, "x"), ("u", 0, "y"))
    first = driver.commit_with(requests, register=[("u", 0)])
    assert first.end.error_code == 0
    again = TxnDriver(broker, "r")
    again.producer_id, again.producer_epoch = requests[0].producer_id, requests[0].producer_epoch
    retry = again.commit_with(requests, register=[("u", 0)])
    assert retry.end.error_code == 0
    assert (retry.end.producer_id, retry.end.producer_epoch) == (
        first.end.producer_id,
        first.end.producer_epoch,
    )
    assert [(b.error_code, b.base_offset, b.duplicate) for b in retry.batches] == [
        (0, 1, True),
        (0, 0, True),
    ]
    assert retry.registered is not None and retry.registered.error_code == 0
    assert read_values(broker, "t", 0) == ["earlier", "x"]
    assert read_values(broker, "u", 0) == ["y"]
    assert events(broker, "r").count(m.COMPLETE_COMMIT) == 1


def test_a_refused_batch_stops_the_commit(broker: Broker) -> None:
    """One batch out of sequence: the others are appended, the transaction stays open and
    undecided, and can then be aborted."""
    driver = TxnDriver(broker, "f")
    assert driver.init() == 0
    assert driver.send("t", 1, "first").error_code == 0
    good, bad = driver.requests(("t", 0, "good"), ("t", 1, "bad"))
    bad = replace(bad, base_sequence=5)  # a gap after sequence 0
    r = driver.commit_with([good, bad], register=[("t", 0)])
    assert [b.error_code for b in r.batches] == [0, KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER]
    assert r.end.error_code == KafkaError.OPERATION_NOT_ATTEMPTED
    assert state_of(broker, "f") == m.BEGIN
    assert read_values(broker, "t", 0) == [] and read_values(broker, "t", 0, committed=False) == [
        "good"
    ]
    assert driver.end(commit=False) == 0
    assert read_values(broker, "t", 0) == [] and read_values(broker, "t", 1) == []
    assert state_of(broker, "f") == m.COMPLETE_ABORT
    assert settled(broker)
    # The registration made by the refused commit was persisted with its batch.
    assert events(broker, "f").count(m.BEGIN) == 2
    assert_transactions_rebuild(broker)


def test_a_refused_marker_keeps_the_appended_batches(broker: Broker) -> None:
    """A partition whose producer state carries a newer coordinator epoch refuses its
    marker (rule 7): the batches stay appended, partitions advanced, and the transaction
    stays PREPARE_COMMIT, to be completed by that coordinator."""
    driver = TxnDriver(broker, "r")
    assert driver.init() == 0
    assert driver.send("u", 0, "early").error_code == 0
    with broker.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE producer_states SET coordinator_epoch = 99 "
                "WHERE topic = 'u' AND partition = 0 AND producer_id = :pid"
            ),
            {"pid": driver.producer_id},
        )
    r = driver.commit_with(driver.requests(("t", 0, "late")), register=[("t", 0)])
    assert [b.error_code for b in r.batches] == [0]
    assert r.end.error_code == KafkaError.TRANSACTION_COORDINATOR_FENCED
    assert state_of(broker, "r") == m.PREPARE_COMMIT
    assert read_values(broker, "t", 0, committed=False) == ["late"]
    assert read_values(broker, "t", 0) == []
    assert partition_offsets(broker, "t", 0) == (1, 0)
    with broker.engine.connect() as conn:
        state = conn.execute(
            text(
                "SELECT last_sequence, last_offset, txn_first_offset FROM producer_states "
                "WHERE topic = 't' AND partition = 0 AND producer_id = :pid"
            ),
            {"pid": driver.producer_id},
        ).one()
    assert tuple(state) == (0, 0, 0)  # the append's state, its transaction still open


def test_partitions_without_a_batch_in_the_request_get_their_markers(broker: Broker) -> None:
    """The transaction wrote to "u" 0 earlier; the commit carries a batch for "t" 1 only:
    both are marked, the partitions locked in sorted order first."""
    driver = TxnDriver(broker, "p")
    assert driver.init() == 0
    assert driver.send("u", 0, "early").error_code == 0
    r = driver.commit_with(driver.requests(("t", 1, "late")), register=[("t", 1)])
    assert r.end.error_code == 0
    assert read_values(broker, "u", 0) == ["early"] and read_values(broker, "t", 1) == ["late"]
    assert settled(broker)


def test_a_commit_from_a_fenced_instance_writes_nothing(broker: Broker) -> None:
    zombie = TxnDriver(broker, "z")
    assert zombie.init() == 0
    assert zombie.send("t", 0, "zombie").error_code == 0
    successor = TxnDriver(broker, "z")
    assert successor.init() == 0  # fences the zombie and aborts its transaction
    r = zombie.commit_with(zombie.requests(("t", 0, "late")))
    # The partition's answer to a stale epoch, as to any produce; nothing is ended.
    assert [b.error_code for b in r.batches] == [KafkaError.INVALID_PRODUCER_EPOCH]
    assert r.end.error_code == KafkaError.OPERATION_NOT_ATTEMPTED
    assert read_values(broker, "t", 0, committed=False) == ["zombie"]  # aborted by the fence
    assert read_values(broker, "t", 0) == []
    assert settled(broker)


# ---------------------------------------------------------------- the Producer


def lossy(
    monkeypatch: pytest.MonkeyPatch, producer: Producer, losses: int, reached: bool
) -> list[int]:
    """Lose the answer of the producer's next ``losses`` combined requests (``reached``:
    each was carried out first); returns a one-element count of the requests made."""
    real = producer.sender.transport
    calls = [0]

    def flaky(request: ProduceBatchesRequest) -> Any:
        if request.end is None:
            return real(request)
        calls[0] += 1
        if calls[0] > losses:
            return real(request)
        if reached:
            real(request)
        raise lost_connection()

    monkeypatch.setattr(producer.sender, "transport", flaky)
    return calls


def transactional_producer(db_url: str, tid: str, **extra: Any) -> Producer:
    config = {"database.url": db_url, "transactional.id": tid, "linger.ms": 10_000}
    return Producer({**config, "retry.backoff.ms": 5, **extra})


@pytest.mark.parametrize("reached", [True, False])
def test_a_lost_commit_answer_is_retried_as_the_same_request(
    db_url: str, broker: Broker, monkeypatch: pytest.MonkeyPatch, reached: bool
) -> None:
    producer = transactional_producer(db_url, f"lost-{reached}")
    reports: list[tuple[Any, int]] = []
    try:
        producer.init_transactions()
        calls = lossy(monkeypatch, producer, 2, reached)
        producer.begin_transaction()
        for topic, partition in PARTITIONS:
            producer.produce(
                topic, f"{topic}{partition}", partition=partition,
                on_delivery=lambda e, msg: reports.append((e, msg.offset())),
            )  # fmt: skip
        producer.commit_transaction()
        assert calls[0] == 3
        assert reports == [(None, 0)] * 3
        # The next transaction works with the identity the commit returned.
        producer.begin_transaction()
        producer.produce("t", "next", partition=0)
        producer.commit_transaction()
    finally:
        producer.close()
    assert read_values(broker, "t", 0) == ["t0", "next"]
    assert read_values(broker, "t", 1) == ["t1"] and read_values(broker, "u", 0) == ["u0"]
    assert settled(broker)


def test_an_unresolved_commit_times_out_retriably_and_completes_when_retried(
    db_url: str, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer stays lost past message.timeout.ms: the batch is not reported failed
    (the transaction may have committed with it); commit_transaction times out, retriably,
    and completes when called again."""
    producer = transactional_producer(
        db_url, "unresolved", **{"linger.ms": 100, "message.timeout.ms": 200}
    )
    reports: list[Any] = []
    try:
        producer.init_transactions()
        lossy(monkeypatch, producer, 1_000_000, reached=True)
        producer.begin_transaction()
        producer.produce("t", "v", partition=0, on_delivery=lambda e, msg: reports.append(e))
        with pytest.raises(KafkaException) as raised:
            producer.commit_transaction(0.5)
        assert raised.value.args[0].retriable() and not raised.value.args[0].txn_requires_abort()
        assert reports == []
        monkeypatch.undo()
        producer.commit_transaction()
        assert reports == [None]
    finally:
        producer.close()
    assert read_values(broker, "t", 0) == ["v"]
    assert state_of(broker, "unresolved") == m.COMPLETE_COMMIT


def test_an_idle_sender_leaves_the_last_batches_to_the_committing_thread(
    db_url: str, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With nothing in flight, commit_transaction() sends the last batches and the EndTxn
    itself (no hand-off to the sender thread and back); the delivery reports are served
    as usual."""
    threads: list[threading.Thread] = []
    producer = transactional_producer(db_url, "here")
    real = producer.sender.transport

    def recording(request: ProduceBatchesRequest) -> Any:
        if request.end is not None:
            threads.append(threading.current_thread())
        return real(request)

    monkeypatch.setattr(producer.sender, "transport", recording)
    reports: list[tuple[Any, int]] = []
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce(
            "t", "v", partition=0, on_delivery=lambda e, msg: reports.append((e, msg.offset()))
        )
        producer.commit_transaction()
    finally:
        producer.close()
    assert threads == [threading.current_thread()]
    assert reports == [(None, 0)]
    assert read_values(broker, "t", 0) == ["v"]


def test_commits_racing_the_sender_report_every_record_once(db_url: str, broker: Broker) -> None:
    """With linger.ms=1 the sender thread and commit_transaction() often reach a
    transaction's last batches at the same moment; whichever forms them sends them, and
    every record is stored and reported exactly once, with the offset it has in the log."""
    producer = transactional_producer(db_url, "race", **{"linger.ms": 1})
    reports: list[tuple[Any, str, int]] = []

    def report(err: Any, msg: Any) -> None:
        reports.append((err, msg.value().decode(), msg.offset()))

    expected: dict[tuple[str, int], list[str]] = {tp: [] for tp in PARTITIONS}
    try:
        producer.init_transactions()
        for i in range(120):
            producer.begin_transaction()
            for topic, partition in PARTITIONS[: 1 + i % 3]:
                value = f"{topic}{partition}-{i}"
                producer.produce(topic, value, partition=partition, on_delivery=report)
                expected[(topic, partition)].append(value)
            if i % 4 == 1:
                time.sleep(0.001)  # let the sender's linger run out first, now and then
            producer.commit_transaction()
    finally:
        producer.close()
    stored = {tp: read_values(broker, *tp) for tp in PARTITIONS}
    assert stored == expected
    assert all(err is None for err, _, _ in reports)
    assert sorted(v for _, v, _ in reports) == sorted(v for vs in expected.values() for v in vs)
    for (topic, partition), values in stored.items():
        # Each partition holds its values, one transaction marker after each.
        offsets = {v: o for _, v, o in reports if v.startswith(f"{topic}{partition}-")}
        assert [offsets[v] for v in values] == [2 * n for n in range(len(values))]


def epoch_ahead_of_coordinator(
    broker: Broker, topic: str, partition: int, producer_id: int, ahead: int
) -> None:
    with broker.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE producer_states SET producer_epoch = producer_epoch + :ahead"
                " WHERE topic = :t AND partition = :p AND producer_id = :pid"
            ),
            {"ahead": ahead, "t": topic, "p": partition, "pid": producer_id},
        )


@pytest.mark.parametrize(
    ("epoch_ahead", "refusal"),
    [
        # An idempotent batch of the same producer id and epoch took the sequence on.
        (0, KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER),
        # One at a later epoch than the coordinator's, even the abort's bumped one: the
        # partition would refuse the abort marker, were it registered.
        (2, KafkaError.INVALID_PRODUCER_EPOCH),
    ],
)
def test_a_refused_batch_does_not_register_its_partition(
    broker: Broker, epoch_ahead: int, refusal: int
) -> None:
    driver = TxnDriver(broker, "g")
    assert driver.init() == 0
    assert driver.send("t", 0, "first").error_code == 0
    other = ProduceRequest(
        "u", 0, [RecordIn(None, b"other", 0)] * 3, producer_id=driver.producer_id,
        producer_epoch=driver.producer_epoch, base_sequence=0,
    )  # fmt: skip
    assert produce(broker, other).error_code == 0
    # Produce refuses an epoch the coordinator never handed out, so a partition ahead of
    # the coordinator is set up as a state left by older data would be.
    epoch_ahead_of_coordinator(broker, "u", 0, driver.producer_id, epoch_ahead)
    r = driver.commit_with(driver.requests(("t", 0, "second"), ("u", 0, "refused")), [("u", 0)])
    assert [b.error_code for b in r.batches] == [0, refusal]
    assert r.end.error_code == KafkaError.OPERATION_NOT_ATTEMPTED
    assert r.registered is not None and r.registered.results == {("u", 0): refusal}
    with broker.engine.connect() as conn:
        partitions = conn.execute(
            text("SELECT partitions FROM transactions WHERE transactional_id = 'g'")
        ).scalar_one()
    assert partitions == [["t", 0]]
    assert driver.end(commit=False) == 0
    assert state_of(broker, "g") == m.COMPLETE_ABORT
    assert read_values(broker, "t", 0) == [] and read_values(broker, "u", 0) == ["other"] * 3
    assert settled(broker)
    assert_transactions_rebuild(broker)


def test_abort_after_an_unresolved_commit_is_refused_until_the_commit_completes(
    db_url: str, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The combined commit committed but its answer was lost until commit_transaction timed
    out. Aborting now could only tell the application "aborted" about records that are in
    the log: it is refused (not fatal, and no abort required), and retrying the commit
    learns the real outcome, reported once."""
    producer = transactional_producer(
        db_url, "no-abort", **{"linger.ms": 100, "message.timeout.ms": 200}
    )
    reports: list[Any] = []
    try:
        producer.init_transactions()
        lossy(monkeypatch, producer, 1_000_000, reached=True)
        producer.begin_transaction()
        producer.produce("t", "v", partition=0, on_delivery=lambda e, msg: reports.append(e))
        with pytest.raises(KafkaException):
            producer.commit_transaction(0.5)
        monkeypatch.undo()
        try:
            producer.abort_transaction(5)
        except KafkaException as exc:
            err = exc.args[0]
        else:
            pytest.fail(f"told aborted; committed in the log: {read_values(broker, 't', 0)}")
        assert err.code() == KafkaError._STATE and "commit" in err.str()
        assert not (err.retriable() or err.fatal() or err.txn_requires_abort())
        producer.commit_transaction(60)
        assert reports == [None]
        producer.begin_transaction()
        producer.produce("t", "next", partition=0)
        producer.commit_transaction()
    finally:
        producer.close()
    assert read_values(broker, "t", 0) == ["v", "next"]
    assert events(broker, "no-abort").count("COMPLETE_COMMIT") == 2
    assert settled(broker)


def test_finite_retries_leave_the_unresolved_commit_to_the_commit(
    db_url: str, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``retries`` runs out while the combined commit's answer is lost: the batch may have
    committed with the transaction, so it is not failed (which would have the application
    abort a committed transaction); the commit resolves it."""
    producer = transactional_producer(db_url, "few-retries", retries=1)
    reports: list[Any] = []
    try:
        producer.init_transactions()
        calls = lossy(monkeypatch, producer, 3, reached=True)
        producer.begin_transaction()
        producer.produce("t", "v", partition=0, on_delivery=lambda e, msg: reports.append(e))
        try:
            producer.commit_transaction(60)
        except KafkaException as exc:
            pytest.fail(f"{exc}; committed in the log: {read_values(broker, 't', 0)}")
        assert calls[0] == 4
        assert reports == [None]
    finally:
        producer.close()
    assert read_values(broker, "t", 0) == ["v"]
    assert state_of(broker, "few-retries") == m.COMPLETE_COMMIT


def test_a_partition_twice_in_a_commit_keeps_its_batches_in_order(broker: Broker) -> None:
    """Two batches for one partition in the commit request: the second is decided on the
    offsets and producer state the first left, and the markers close what both opened."""
    driver = TxnDriver(broker, "twice")
    assert driver.init() == 0
    first, other = driver.requests(("t", 0, "a"), ("t", 1, "b"))
    second = replace(first, records=[RecordIn(None, b"a2", 0)], base_sequence=1)
    r = driver.commit_with([first, other, second], register=PARTITIONS)
    assert [(b.error_code, b.base_offset) for b in r.batches] == [(0, 0), (0, 0), (0, 1)]
    assert r.end is not None and r.end.error_code == 0
    assert read_values(broker, "t", 0) == ["a", "a2"]
    assert partition_offsets(broker, "t", 0) == (3, 3)  # two records and the marker
    assert settled(broker)
    assert_partition_log_rebuilds(broker, broker.clock.now_ms())
