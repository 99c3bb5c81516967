"""Idempotent produce under real connection faults: backends terminated while a batch is
blocked, after its rows are written but before COMMIT, after COMMIT but before the client
saw the answer, and continuously while 20k records are sent.

The producer's connections are found through ``client.id``, which the client sets as the
PostgreSQL ``application_name``, within the test's own database (the server is shared).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import text

from app.broker import Broker
from app.broker.produce import produce as produce_handler
from app.client import KafkaError, Message
from app.client.producer import Producer
from app.protocol import ProduceRequest, ProduceResponse, RecordIn
from tests.helpers.backends import (
    conninfo,
    holding,
    lost_connection,
    terminate,
    wait_for_blocked_backend,
)
from tests.helpers.identities import hand_out
from tests.helpers.txn_driver import batchwise

pytestmark = pytest.mark.broker(topics={"t": 2})


@pytest.fixture
def admin(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(conninfo(db_url), autocommit=True) as conn:
        yield conn


def rows(broker: Broker) -> list[Any]:
    with broker.engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    'SELECT partition, "offset", value FROM records WHERE topic = \'t\' ORDER BY partition, "offset"'
                )
            )
        )


class CountingHandler:
    def __init__(self) -> None:
        self.calls = 0
        self.duplicates = 0
        self.lock = threading.Lock()

    def __call__(self, broker: Broker, request: ProduceRequest) -> ProduceResponse:
        with self.lock:
            self.calls += 1
        response = produce_handler(broker, request)
        if response.duplicate:
            with self.lock:
                self.duplicates += 1
        return response


def deliveries() -> tuple[list[tuple[KafkaError | None, Message]], Any]:
    reports: list[tuple[KafkaError | None, Message]] = []
    return reports, lambda err, msg: reports.append((err, msg))


def test_handler_answers_a_retried_committed_batch_with_its_offsets(broker: Broker) -> None:
    request = ProduceRequest(
        "t",
        0,
        [RecordIn(None, f"v{i}".encode(), 0) for i in range(5)],
        producer_id=4242,
        producer_epoch=0,
        base_sequence=0,
    )
    hand_out(broker, 4242)
    produce_handler(broker, ProduceRequest("t", 0, [RecordIn(None, b"other", 0)]))
    first = produce_handler(broker, request)
    again = produce_handler(broker, request)
    assert (first.error_code, first.base_offset, first.duplicate) == (0, 1, False)
    assert (again.error_code, again.base_offset, again.duplicate) == (0, 1, True)
    assert [r.value for r in rows(broker)] == [b"other"] + [f"v{i}".encode() for i in range(5)]


def test_answer_lost_after_commit_is_deduplicated(db_url: str, broker: Broker) -> None:
    """The first attempt commits but the client sees a dropped connection instead of the
    answer; its retry must get the original offsets and write nothing."""
    responses: list[ProduceResponse] = []

    def lose_first_answer(b: Broker, request: ProduceRequest) -> ProduceResponse:
        response = produce_handler(b, request)
        responses.append(response)
        if len(responses) == 1:
            raise lost_connection()
        return response

    reports, on_delivery = deliveries()
    with Producer(
        # one batch, sent at the flush however slowly the records come
        {"database.url": db_url, "client.id": "lost-answer", "retry.backoff.ms": 1,
         "linger.ms": 10_000}
    ) as producer:  # fmt: skip
        producer.sender.transport = batchwise(producer.sender.broker, lose_first_answer)
        for i in range(5):
            producer.produce("t", value=f"v{i}", partition=0, on_delivery=on_delivery)
        assert producer.flush(30) == 0
    assert [r.duplicate for r in responses] == [False, True]
    assert responses[0].base_offset == responses[1].base_offset == 0
    assert [(err, m.offset()) for err, m in reports] == [(None, i) for i in range(5)]
    assert [(r.offset, r.value) for r in rows(broker)] == [(i, f"v{i}".encode()) for i in range(5)]


def test_backend_terminated_while_waiting_for_the_partition_lock(
    db_url: str, broker: Broker, admin: psycopg.Connection[Any]
) -> None:
    handler = CountingHandler()
    reports, on_delivery = deliveries()
    with (
        Producer(
            {"database.url": db_url, "client.id": "blocked-producer", "retry.backoff.ms": 5}
        ) as producer,
        holding(
            db_url, "SELECT 1 FROM partitions WHERE topic = 't' AND partition = 0 FOR UPDATE"
        ) as holder,
    ):
        producer.sender.transport = batchwise(producer.sender.broker, handler)
        for i in range(10):
            producer.produce("t", value=f"v{i}", partition=0, on_delivery=on_delivery)
        pid = wait_for_blocked_backend(admin, "blocked-producer", "%FROM partitions%")
        terminate(admin, pid)
        holder.release()
        assert producer.flush(60) == 0
    assert handler.calls >= 2
    assert [(err, m.offset()) for err, m in reports] == [(None, i) for i in range(10)]
    assert [(r.offset, r.value) for r in rows(broker)] == [(i, f"v{i}".encode()) for i in range(10)]


# Where a producer's second batch (on the partition row it remembers, its advance and COPY
# in one query string, docs/design.md §3.9) is made to wait: what another session holds
# (until it lets go, once the backend is gone), and the statement seen waiting.
BLOCKERS = {
    # the advance waits for the producer's state row, before the COPY
    "advance": (
        "SELECT producer_id FROM producer_states WHERE topic = 't' AND partition = 0 FOR UPDATE",
        "EXECUTE kip98_advance_remembered%",
    ),
    # the COPY waits on an uncommitted row put at one of its offsets, its first rows written
    "mid-copy": (
        'INSERT INTO records SELECT topic, partition, 5, "timestamp", key, value, headers, '
        "producer_id, producer_epoch, sequence, 5, is_transactional, is_control, "
        "control_type, coordinator_epoch FROM records WHERE topic = 't' AND partition = 0",
        "%COPY records%",
    ),
}


@pytest.mark.parametrize("where", sorted(BLOCKERS))
def test_backend_terminated_before_its_commit(
    db_url: str, broker: Broker, admin: psycopg.Connection[Any], where: str
) -> None:
    """Terminated before the batch's commit, whether waiting in its advance or mid-COPY
    with rows written: nothing of it stays, and the retry writes the batch once."""
    hold, waiting = BLOCKERS[where]
    handler = CountingHandler()
    reports, on_delivery = deliveries()
    with Producer({"database.url": db_url, "client.id": where, "retry.backoff.ms": 5}) as producer:
        producer.sender.transport = batchwise(producer.sender.broker, handler)
        producer.produce("t", value="first", partition=0, on_delivery=on_delivery)
        assert producer.flush(30) == 0
        with holding(db_url, hold) as holder:
            for i in range(10):
                producer.produce("t", value=f"v{i}", partition=0, on_delivery=on_delivery)
            pid = wait_for_blocked_backend(admin, where, waiting)
            assert len(rows(broker)) == 1
            terminate(admin, pid)
            holder.release()  # its row lock freed, its uncommitted row rolled back
        assert producer.flush(60) == 0
    assert [(err, m.offset()) for err, m in reports] == [(None, i) for i in range(11)]
    assert handler.calls >= 3
    assert [r.value for r in rows(broker)] == [b"first"] + [f"v{i}".encode() for i in range(10)]


class Terminator(threading.Thread):
    """Terminates every backend of one application_name, every few milliseconds."""

    def __init__(self, db_url: str, app: str) -> None:
        super().__init__(daemon=True)
        self.db_url = db_url
        self.app = app
        self.stop = threading.Event()
        self.terminated = 0

    def run(self) -> None:
        rng = random.Random(98)
        with psycopg.connect(conninfo(self.db_url), autocommit=True) as conn:
            while not self.stop.is_set():
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND application_name = %s "
                    "AND pid <> pg_backend_pid()",
                    (self.app,),
                ).fetchone()
                self.terminated += int(row[0]) if row else 0
                self.stop.wait(rng.uniform(0.005, 0.04))


def test_terminated_backends_never_duplicate_or_lose_records(db_url: str, broker: Broker) -> None:
    total = 20_000
    handler = CountingHandler()
    reports, on_delivery = deliveries()
    producer = Producer(
        {
            "database.url": db_url,
            "client.id": "storm-producer",
            "retry.backoff.ms": 5,
            "linger.ms": 2,
            "batch.num.messages": 50,
        }
    )
    producer.sender.transport = batchwise(producer.sender.broker, handler)
    terminator = Terminator(db_url, "storm-producer")
    terminator.start()
    try:
        started = time.monotonic()
        for chunk in range(40):
            for i in range(chunk * 500, (chunk + 1) * 500):
                producer.produce("t", value=str(i), partition=i % 2, on_delivery=on_delivery)
            producer.poll(0)
            # Spread the sending over about two seconds of terminations.
            time.sleep(max(0.0, started + (chunk + 1) * 0.05 - time.monotonic()))
        # Keep terminating until most of the data is through (or for half a minute, if
        # the terminations hold it back), then let the rest drain; and in any case until
        # a backend was terminated: the producer's connections stay open in its pool
        # until one is, so that always comes.
        deadline = time.monotonic() + 120
        while (
            len(producer) > total // 10 and time.monotonic() - started < 30
        ) or terminator.terminated == 0:
            assert time.monotonic() < deadline, "no backend of the producer was terminated"
            producer.poll(0.05)
    finally:
        terminator.stop.set()
        terminator.join()
    assert producer.flush(120) == 0
    producer.close()

    assert terminator.terminated > 0
    assert len(reports) == total and all(err is None for err, _ in reports)
    stored = rows(broker)
    assert len(stored) == total
    by_partition: dict[int, list[Any]] = {0: [], 1: []}
    for r in stored:
        by_partition[r.partition].append(r)
    for partition, prs in by_partition.items():
        # Gapless offsets, each record exactly once, in production order.
        assert [r.offset for r in prs] == list(range(total // 2))
        assert [int(r.value) for r in prs] == list(range(partition, total, 2))
    where = {r.value: (r.partition, r.offset) for r in stored}
    assert all(where[m.value()] == (m.partition(), m.offset()) for _, m in reports)
    print(
        f"terminated {terminator.terminated} backends; {handler.calls} produce calls, "
        f"{handler.duplicates} answered as duplicates"
    )
