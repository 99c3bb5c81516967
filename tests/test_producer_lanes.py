"""The Producer with several requests in flight (``max.in.flight``): its sender lanes.

Each partition is sent by one lane, a lane has one request in flight at a time, and a
partition's next batch is formed only once its last one is settled, so a partition's
batches reach the log in order however the lanes' requests overlap and complete, retries
included (docs/design.md rule 27). The faults are injected into the producer's transport,
as in the other producer tests: lost connections before the request reached the database
and after it committed, and one partition's requests held back so the others complete
first.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
from sqlalchemy import text

from app.broker import Broker
from app.broker.produce import produce as produce_handler
from app.client import KafkaError, Message
from app.client.producer import Producer
from app.protocol import (
    AddPartitionsToTxnRequest,
    ProduceBatchesRequest,
    ProduceBatchesResponse,
    ProduceRequest,
    ProduceResponse,
    RecordIn,
)
from tests.helpers.backends import lost_connection
from tests.helpers.txn_driver import TxnDriver, batchwise, partition_offsets, read_values

PARTITIONS = 4


pytestmark = pytest.mark.broker(topics={"t": PARTITIONS})


def stored(broker: Broker) -> dict[int, list[tuple[int, str]]]:
    """Each partition's (offset, value) in offset order."""
    out: dict[int, list[tuple[int, str]]] = {p: [] for p in range(PARTITIONS)}
    with broker.engine.connect() as conn:
        for r in conn.execute(
            text("SELECT partition, \"offset\", value FROM records WHERE topic = 't' ORDER BY 1, 2")
        ):
            out[r.partition].append((r.offset, bytes(r.value).decode()))
    return out


class FaultyHandler:
    """Per batch: the answer lost before the request reached the database or after it
    committed, each about one time in eight; partition 0's batches held back a little, so
    the other lanes' requests overtake them."""

    def __init__(self) -> None:
        self.rng = random.Random(28)
        self.lock = threading.Lock()
        self.threads: set[str] = set()
        self.calls = 0
        self.duplicates = 0

    def __call__(self, broker: Broker, request: ProduceRequest) -> ProduceResponse:
        with self.lock:
            self.calls += 1
            self.threads.add(threading.current_thread().name)
            roll = self.rng.random()
        if request.partition == 0:
            time.sleep(0.002)
        if roll < 0.125:
            raise lost_connection()
        response = produce_handler(broker, request)
        if response.duplicate:
            with self.lock:
                self.duplicates += 1
        if roll > 0.875:
            raise lost_connection()
        return response


@pytest.mark.parametrize(
    ("in_flight", "batch"),
    [(1, 20), (5, 20), (5, 1000)],  # 1000-record batches each go as three COPYs (§3.10)
    ids=["one-lane", "lanes", "lanes-large-batches"],
)
def test_each_partition_keeps_its_order_when_requests_complete_out_of_order(
    db_url: str, broker: Broker, in_flight: int, batch: int, copies_written: list[int]
) -> None:
    total = 4_000 if batch < 100 else 48_000
    handler = FaultyHandler()
    reports: list[tuple[KafkaError | None, Message]] = []
    producer = Producer(
        {
            "database.url": db_url,
            "max.in.flight": in_flight,
            "retry.backoff.ms": 1,
            # Large batches are sent full (a thousand records), however fast the records
            # come; small ones as soon as they linger.
            "linger.ms": 1 if batch < 100 else 60_000,
            "batch.num.messages": batch,
            "on_delivery": lambda err, msg: reports.append((err, msg)),
        }
    )
    producer.sender.transport = batchwise(producer.sender.broker, handler)
    try:
        for i in range(total):
            producer.produce("t", value=f"{i % PARTITIONS}:{i}", partition=i % PARTITIONS)
            if i % 200 == 0:
                producer.poll(0)
        assert producer.flush(60) == 0
    finally:
        producer.close()

    # One lane per partition with five in flight; one lane for all with one.
    assert len(handler.threads) == min(in_flight, PARTITIONS)
    assert (max(copies_written) > 1) == (batch == 1000)
    assert handler.duplicates > 0  # answers lost after the commit were asked for again
    assert len(reports) == total and all(err is None for err, _ in reports)
    log = stored(broker)
    for partition, entries in log.items():
        # Gapless offsets, each record once, in the order it was produced.
        assert [offset for offset, _ in entries] == list(range(total // PARTITIONS))
        assert [value for _, value in entries] == [
            f"{partition}:{i}" for i in range(partition, total, PARTITIONS)
        ]
    where = {value: (p, offset) for p, entries in log.items() for offset, value in entries}
    assert all(where[m.value().decode()] == (m.partition(), m.offset()) for _, m in reports)


def lossy_registrations(producer: Producer, threads: set[str]) -> list[int]:
    """Lose the answer of every third request that registers partitions (after it was
    carried out), but never a commit's: the lane sends the batches and their registration
    again. Returns a one-element count of the answers lost; ``threads`` collects the
    names of the threads that sent requests."""
    real = producer.sender.transport
    seen = [0]
    lost = [0]
    lock = threading.Lock()

    def transport(request: ProduceBatchesRequest) -> ProduceBatchesResponse:
        with lock:
            threads.add(threading.current_thread().name)
        response = real(request)
        if request.add is not None and request.end is None:
            with lock:
                seen[0] += 1
                lose = seen[0] % 3 == 0
                lost[0] += lose
            if lose:
                raise lost_connection()
        return response

    producer.sender.transport = transport
    return lost


def test_transactions_commit_and_abort_with_batches_on_every_lane(
    db_url: str, broker: Broker
) -> None:
    """Batches of one transaction go out on four lanes at once, each registering its own
    partition (KIP-890) on its own connection; commits and aborts alternate, and a
    read_committed reader sees exactly the committed transactions, in order."""
    producer = Producer(
        {
            "database.url": db_url,
            "transactional.id": "lanes",
            "max.in.flight": 5,
            "linger.ms": 1,
            "batch.num.messages": 5,
            "retry.backoff.ms": 1,
        }
    )
    threads: set[str] = set()
    lost = lossy_registrations(producer, threads)
    outcomes: dict[str, int] = {}  # value -> error code (0: delivered)

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        outcomes[msg.value().decode()] = err.code() if err else 0

    produced: dict[int, list[tuple[int, str]]] = {p: [] for p in range(PARTITIONS)}
    try:
        producer.init_transactions()
        for txn in range(6):
            producer.begin_transaction()
            for i in range(60):
                value = f"{txn}:{i}"
                produced[i % PARTITIONS].append((txn, value))
                producer.produce(
                    "t", value=value, partition=i % PARTITIONS, on_delivery=on_delivery
                )
                if i == 29:
                    producer.flush(30)  # half the transaction sent on the four lanes at once
                elif i % 10 == 9:
                    producer.poll(0.005)
            if txn % 2 == 0:
                producer.commit_transaction(30)
            else:
                producer.abort_transaction(30)
    finally:
        producer.close()
    assert lost[0] > 0
    assert {f"kip98-producer-sender-{lane}" for lane in range(PARTITIONS)} <= threads
    committed = {v for entries in produced.values() for t, v in entries if t % 2 == 0}
    assert {v: outcomes[v] for v in committed} == dict.fromkeys(committed, 0)
    # An abort purges what was not sent yet; what was sent is in the log, marked aborted.
    aborted = {outcomes[v] for v in outcomes if v not in committed}
    assert 0 in aborted and aborted <= {0, KafkaError._PURGE_QUEUE}
    for partition, entries in produced.items():
        assert read_values(broker, "t", partition) == [v for t, v in entries if t % 2 == 0]
        sent = [v for _, v in entries if outcomes[v] == 0]
        assert read_values(broker, "t", partition, committed=False) == sent
        high_watermark, last_stable = partition_offsets(broker, "t", partition)
        assert high_watermark == last_stable


def register_at_once(broker: Broker, driver: TxnDriver, round_: int) -> list[Any]:
    """One request per partition, each registering its partition with its batch, all
    released at once from their own threads (so on their own connections)."""
    start = threading.Barrier(PARTITIONS)
    answers: list[Any] = [None] * PARTITIONS

    def register(partition: int) -> None:
        batch = ProduceRequest(
            "t", partition, [RecordIn(None, f"{round_}:{partition}".encode(), 0)],
            driver.producer_id, driver.producer_epoch, 0, driver.transactional_id, True,
        )  # fmt: skip
        add = AddPartitionsToTxnRequest(
            driver.transactional_id, driver.producer_id, driver.producer_epoch, [("t", partition)]
        )
        start.wait()
        answers[partition] = broker.handle(ProduceBatchesRequest([batch], add))

    threads = [threading.Thread(target=register, args=(p,)) for p in range(PARTITIONS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def test_concurrent_registrations_of_one_transaction_all_count(broker: Broker) -> None:
    """Four requests of one transaction, each registering another partition with its batch,
    sent at once on four connections: none deadlocks, none loses another's partition."""
    driver = TxnDriver(broker, "together")
    assert driver.init() == 0
    for round_ in range(5):
        for response in register_at_once(broker, driver, round_):
            assert response.registered.error_code == KafkaError.NO_ERROR
            assert [b.error_code for b in response.batches] == [KafkaError.NO_ERROR]
        assert driver.end(commit=round_ % 2 == 0) == 0
    for partition in range(PARTITIONS):
        # Every round's batch was in its transaction: committed ones visible, the rest aborted.
        assert read_values(broker, "t", partition) == [f"{r}:{partition}" for r in (0, 2, 4)]
        high_watermark, last_stable = partition_offsets(broker, "t", partition)
        assert high_watermark == last_stable
