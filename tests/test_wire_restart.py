"""``kip98 serve`` SIGKILLed mid-run and started again on its port, under librdkafka
clients that carry on: nothing the server held in memory mattered, every answer it could
not give is asked again, and the log holds each intended record exactly once, in order.

A transactional producer meets each kind of failure an application handles: records that
time out while the server is down (the transaction must be aborted and done again), a
commit that times out (asked again), and a kill at an arbitrary moment with the server back
at once (a request whose answer was lost, retried by the client). An idempotent producer
keeps its order across two kills.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import confluent_kafka as ck
import pytest

from app.broker import Broker
from app.log.topics import create_topic
from app.server.process import ServeProcess
from tests.helpers.txn_driver import read_values

TRANSACTIONS = 30
PER_TRANSACTION = 5


@pytest.fixture
def serve(db_url: str) -> Iterator[ServeProcess]:
    create_topic(Broker.connect(db_url), "t", 1)
    serve = ServeProcess(db_url)
    serve.start()
    try:
        yield serve
    finally:
        serve.stop()
        serve.kill()


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.02)


class Outage:
    """A kill of the server, run from another thread when the application asks: either
    back at once, or only once the application has seen an error of the outage."""

    def __init__(self, serve: ServeProcess, errors: list[ck.KafkaError]) -> None:
        self.serve = serve
        self.errors = errors
        self.killed = 0
        self.thread: threading.Thread | None = None

    def now(self, until_an_error: bool) -> None:
        """Kill the server now; start it again in the background."""
        self.join()
        self.serve.kill()
        self.killed += 1
        seen = len(self.errors)
        self.thread = threading.Thread(target=self._restart, args=(until_an_error, seen))
        self.thread.start()

    def _restart(self, until_an_error: bool, seen: int) -> None:
        if until_an_error:
            wait_until(lambda: len(self.errors) > seen, "the client saw no error of the outage")
        self.serve.start()

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None


def transactional(address: str) -> ck.Producer:
    producer = ck.Producer({
        "bootstrap.servers": address, "transactional.id": "restarts", "linger.ms": 5,
        "message.timeout.ms": 3_000, "transaction.timeout.ms": 60_000,
    })  # fmt: skip
    retrying(partial(producer.init_transactions, 10), [])
    return producer


def retrying(call: Callable[[], Any], errors: list[ck.KafkaError]) -> None:
    """``call`` again while it fails retriably, as librdkafka asks of an application."""
    while True:
        try:
            call()
            return
        except ck.KafkaException as exc:
            errors.append(exc.args[0])
            if not exc.args[0].retriable():
                raise


def recovered(
    producer: ck.Producer, err: ck.KafkaError, errors: list[ck.KafkaError], address: str
) -> ck.Producer:
    """The producer to go on with after its transaction failed with ``err``: the same one
    once the transaction is aborted, or a new one (which fences the old) when the error
    is fatal to it. librdkafka makes an abort fatal when the coordinator may never have seen
    the transaction (its AddPartitionsToTxn lost with the server) and ended the one before
    the other way, as Kafka's coordinator answers such an EndTxn."""
    errors.append(err)
    while not err.fatal():
        if not err.txn_requires_abort():
            raise ck.KafkaException(err)
        try:
            retrying(partial(producer.abort_transaction, 10), errors)
            return producer
        except ck.KafkaException as exc:
            err = exc.args[0]
    return transactional(address)


def test_a_transactional_producer_commits_each_transaction_once_across_kills(
    serve: ServeProcess, db_url: str
) -> None:
    errors: list[ck.KafkaError] = []
    outage = Outage(serve, errors)
    producer = transactional(serve.address)
    i = 0
    while i < TRANSACTIONS:
        try:
            producer.begin_transaction()
            if i == 5 and outage.killed == 0:
                outage.now(until_an_error=True)  # the records time out: abort, do it again
            for j in range(PER_TRANSACTION):
                producer.produce("t", f"{i}-{j}", partition=0)
            if i == 15 and outage.killed == 1:
                producer.flush(30)
                outage.now(until_an_error=True)  # the commit times out: commit again
            if i == 25 and outage.killed == 2:
                outage.now(until_an_error=False)  # wherever the commit has got to
            # Only the commit meant to time out has a short timeout; the others outlast
            # message.timeout.ms, so the records are what fails first while the server is
            # down (the abort) at any speed.
            retrying(partial(producer.commit_transaction, 3 if i == 15 else 60), errors)
            i += 1
        except ck.KafkaException as exc:
            producer = recovered(producer, exc.args[0], errors, serve.address)
    outage.join()

    assert outage.killed == 3
    assert any(e.txn_requires_abort() for e in errors), errors
    assert any(e.retriable() for e in errors), errors
    broker = Broker.connect(db_url)
    want = [f"{i}-{j}" for i in range(TRANSACTIONS) for j in range(PER_TRANSACTION)]
    assert read_values(broker, "t", 0) == want
    consumer = ck.Consumer({"bootstrap.servers": serve.address, "group.id": "check",
                            "isolation.level": "read_committed"})  # fmt: skip
    try:
        consumer.assign([ck.TopicPartition("t", 0, 0)])
        got: list[str] = []
        while len(got) < len(want):
            msg = consumer.poll(30)
            assert msg is not None, f"{len(got)} of {len(want)} read"
            assert msg.error() is None, msg.error()
            got.append(msg.value().decode())
        assert got == want
    finally:
        consumer.close()


def test_an_idempotent_producer_keeps_its_order_across_kills(
    serve: ServeProcess, db_url: str
) -> None:
    records = 3000
    errors: list[ck.KafkaError] = []
    outage = Outage(serve, errors)
    delivered: list[int] = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            delivered.append(msg.offset())

    producer = ck.Producer({"bootstrap.servers": serve.address, "enable.idempotence": True,
                            "linger.ms": 5})  # fmt: skip

    def delivered_past(n: int) -> bool:
        producer.poll(0.05)  # serves the delivery reports
        return len(delivered) > n

    for i in range(records):
        producer.produce("t", f"{i}", partition=0, on_delivery=report)
        producer.poll(0)
        if i in (1000, 2000):
            wait_until(partial(delivered_past, i - 500), "no deliveries")
            outage.now(until_an_error=False)  # batches in flight, their answers lost
    assert producer.flush(120) == 0
    outage.join()

    assert errors == []
    assert outage.killed == 2
    assert sorted(delivered) == list(range(records))
    assert read_values(Broker.connect(db_url), "t", 0) == [f"{i}" for i in range(records)]


def test_an_idempotent_producer_raises_its_own_epoch_after_records_time_out(
    serve: ServeProcess, db_url: str
) -> None:
    """Records whose request timed out may or may not be in the log, so librdkafka drains
    and raises its producer's epoch itself, starting its sequences again at 0 (docs/design.md
    rule 19). The server is stopped (SIGSTOP), not killed, so the timed-out request may yet
    be written when it resumes; either way the later records are taken in the new epoch."""
    assert serve.proc is not None
    errors: list[ck.KafkaError] = []
    delivered: list[str] = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            delivered.append(msg.value().decode())

    # The records time out while the server is stopped; those after it have as long to be
    # delivered once it runs again: a bound far above any machine's pace.
    producer = ck.Producer({"bootstrap.servers": serve.address, "enable.idempotence": True,
                            "linger.ms": 5, "request.timeout.ms": 5000,
                            "message.timeout.ms": 10000})  # fmt: skip
    for i in range(10):
        producer.produce("t", f"before-{i}", partition=0, on_delivery=report)
    assert producer.flush(30) == 0
    serve.proc.send_signal(signal.SIGSTOP)
    try:
        for i in range(5):
            producer.produce("t", f"lost-{i}", partition=0, on_delivery=report)
        wait_until(lambda: producer.poll(0.05) is not None and len(errors) == 5, "no timeouts", 60)
    finally:
        serve.proc.send_signal(signal.SIGCONT)
    assert {e.code() for e in errors} == {ck.KafkaError._MSG_TIMED_OUT}
    for i in range(10):
        producer.produce("t", f"after-{i}", partition=0, on_delivery=report)
    assert producer.flush(60) == 0
    assert len(errors) == 5, errors[5:]  # nothing after the outage failed

    before = [f"before-{i}" for i in range(10)]
    lost = [f"lost-{i}" for i in range(5)]
    after = [f"after-{i}" for i in range(10)]
    assert delivered == before + after
    assert read_values(Broker.connect(db_url), "t", 0) in (before + after, before + lost + after)
    with Broker.connect(db_url).engine.connect() as conn:
        epochs = conn.exec_driver_sql(
            "SELECT producer_epoch FROM producer_states WHERE topic = 't'"
        ).scalars()
        assert max(epochs) >= 1  # the batches after the outage came in a raised epoch
