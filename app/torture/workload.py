"""The worker process: a transactional producer and a read_committed consumer of all
partitions of the input topic, doing random transactions under the nemesis' faults.

Worker ``i`` always uses transactional id ``torture-i``, so every restart fences its
previous incarnation, and ``client.id`` ``torture-wi`` (the PostgreSQL application_name)
so the nemesis can terminate exactly its connections. Values are ``w{i}-{n}`` with ``n``
unique across incarnations (each incarnation starts a new block of numbers).

Outcomes are recorded conservatively: ``ok`` only when commit_transaction returned,
``fail`` only when abort_transaction returned (so the transaction certainly did not
commit), ``info`` whenever the outcome may be either; the client pair is then rebuilt, as
an application that lost track of its transaction would do.

Now and then a worker is impatient: it gives commit_transaction() almost no time and, when
that times out, tries to abort. A commit that has started may have committed, so the abort
must be refused (``abort-after-commit`` fails, not fatally) and commit_transaction() again
tells the outcome; the checker holds the told outcome against the log.
"""

from __future__ import annotations

import logging
import random
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from app.client import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from app.torture.history import FAIL, INFO, INVOKE, OK, HistoryWriter

log = logging.getLogger(__name__)

TOPIC = "torture"
COPY_TOPIC = "torture-copy"
PARTITIONS = 8
TXN_TIMEOUT_MS = 2000
# Per incarnation, values are numbered from incarnation * VALUE_BLOCK.
VALUE_BLOCK = 1_000_000
ABORT_P = 0.1
REASSIGN_P = 0.03
SEEK_P = 0.03
COMMIT_OFFSETS_P = 0.05
IMPATIENT_P = 0.15


def producer_config(url: str, transactional_id: str, client_id: str) -> dict[str, Any]:
    """A torture process's transactional producer: short transactions, and the riskiest
    sender setting, a lane per partition (several requests of one transaction in flight)."""
    return {
        "database.url": url,
        "transactional.id": transactional_id,
        "client.id": client_id,
        "transaction.timeout.ms": TXN_TIMEOUT_MS,
        "linger.ms": 2,
        "max.in.flight": 5,
    }


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def records_of(messages: Iterable[Message]) -> tuple[list[list[Any]], list[str]]:
    """(topic, partition, offset, value) of each record, and the error events apart."""
    records: list[list[Any]] = []
    errors: list[str] = []
    for m in messages:
        err = m.error()
        if err is not None:
            errors.append(str(err))
            continue
        raw = m.value()
        records.append(
            [m.topic(), m.partition(), m.offset(), None if raw is None else raw.decode()]
        )
    return records, errors


class StopFlag:
    """SIGTERM asks a role to finish its current transaction and exit; SIGUSR1 asks a
    worker to hold its next transaction open past the timeout (the slow-client fault)."""

    def __init__(self) -> None:
        self.stop = False
        self.stall = False
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGUSR1, self._on_usr1)

    def _on_term(self, _signum: int, _frame: FrameType | None) -> None:
        self.stop = True

    def _on_usr1(self, _signum: int, _frame: FrameType | None) -> None:
        self.stall = True


class Reconnecting(Protocol):
    """What the torture processes share: a history, a stop flag, and clients that are
    made again whenever a fault has taken them away."""

    hist: HistoryWriter
    flags: StopFlag
    producer: Any
    consumer: Any

    @property
    def incarnation(self) -> int: ...

    def _connect(self) -> None: ...

    def _disconnect(self) -> None: ...


def close_clients(w: Reconnecting) -> None:
    """Close both clients, whatever state a fault left them in: the next step makes them
    again."""
    for client in (w.producer, w.consumer):
        if client is None:
            continue
        try:
            client.close()
        except Exception as exc:
            log.info("close failed: %s", describe(exc))
    w.producer = w.consumer = None


def run_until_stopped(w: Reconnecting, step: Callable[[], None]) -> None:
    """Until stopped: (re)make the clients when there are none, then do one ``step``; the
    history is framed by start and stop events."""
    w.hist.record(OK, "start", incarnation=w.incarnation)
    while not w.flags.stop:
        if w.producer is None:
            try:
                w._connect()
            except Exception as exc:
                w.hist.record(INFO, "init", error=describe(exc))
                w._disconnect()
                time.sleep(0.5)
                continue
        step()
    w._disconnect()
    w.hist.record(OK, "stop")
    w.hist.close()


@dataclass
class ProcessArgs:
    """What a worker, racer or copier process is started with: its role's index, which
    restart of it this is, the run's seed (copiers draw nothing), the database and where
    the run's history goes."""

    index: int
    incarnation: int
    seed: int
    url: str
    out: Path


class Worker:
    def __init__(self, args: ProcessArgs) -> None:
        self.args = args
        self.name = f"w{args.index}"
        self.hist = HistoryWriter.of_incarnation(args.out, self.name, args.incarnation)
        self.rng = random.Random(args.seed * 7919 + args.index * 101 + args.incarnation)
        self.flags = StopFlag()
        self.next_value = args.incarnation * VALUE_BLOCK
        self.txns = 0
        self.producer: Producer | None = None
        self.consumer: Consumer | None = None
        self.all_partitions = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]

    @property
    def incarnation(self) -> int:
        return self.args.incarnation

    # ------------------------------------------------------------ clients
    def _connect(self) -> None:
        base = {"database.url": self.args.url}
        self.producer = Producer(
            producer_config(self.args.url, f"torture-{self.args.index}", f"torture-{self.name}")
        )
        self.hist.record(INVOKE, "init")
        self.producer.init_transactions(30)
        self.hist.record(OK, "init")
        self.consumer = Consumer(
            {
                **base,
                "group.id": f"torture-reader-{self.args.index}",
                "client.id": f"torture-{self.name}-c",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
            }
        )
        self._reassign()

    def _disconnect(self) -> None:
        close_clients(self)

    def _committed_starts(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        assert self.consumer is not None
        found = self.consumer.committed(partitions, timeout=10)
        return [
            TopicPartition(
                tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            )
            for tp in found
        ]

    @staticmethod
    def _starts(tps: list[TopicPartition]) -> list[list[Any]]:
        return [[tp.topic, tp.partition, max(tp.offset, 0)] for tp in tps]

    def _reassign(self) -> None:
        assert self.consumer is not None
        self.hist.record(INVOKE, "assign")
        starts = self._committed_starts(self.all_partitions)
        self.consumer.assign(starts)
        self.hist.record(OK, "assign", start=self._starts(starts))

    def _seek(self) -> None:
        assert self.consumer is not None
        tp = self.rng.choice(self.all_partitions)
        self.hist.record(INVOKE, "seek")
        (start,) = self._committed_starts([tp])
        self.consumer.seek(start)
        self.hist.record(OK, "seek", start=self._starts([start]))

    def _commit_offsets(self) -> None:
        assert self.consumer is not None
        positions = [tp for tp in self.consumer.position(self.all_partitions) if tp.offset >= 0]
        if positions:
            self.hist.record(INVOKE, "commit-offsets")
            self.consumer.commit(offsets=positions, asynchronous=False)
            self.hist.record(OK, "commit-offsets", offsets=self._starts(positions))

    # ------------------------------------------------------------ operations
    def _poll(self, txn: str) -> None:
        assert self.consumer is not None
        self.hist.record(INVOKE, "poll", txn=txn)
        records, errors = records_of(self.consumer.consume(self.rng.randint(1, 5), timeout=0.05))
        self.hist.record(OK, "poll", txn=txn, records=records, errors=errors)

    def _send(self, txn: str) -> None:
        assert self.producer is not None
        partition = self.rng.randrange(PARTITIONS)
        value = f"{self.name}-{self.next_value}"
        self.next_value += 1
        self.producer.produce(TOPIC, value.encode(), partition=partition)
        # Logged once produce() accepted it: a value that never reached the producer is
        # not part of the transaction.
        self.hist.record(INVOKE, "send", txn=txn, sends=[[TOPIC, partition, value]])

    def _transaction(self) -> None:
        assert self.producer is not None
        self.txns += 1
        txn = f"{self.name}-{self.args.incarnation}-{self.txns}"
        stall, self.flags.stall = self.flags.stall, False
        self.hist.record(INVOKE, "txn", txn=txn, stall=stall)
        try:
            self.producer.begin_transaction()
            for _ in range(self.rng.randint(1, 4)):
                if self.rng.random() < 0.6:
                    self._send(txn)
                else:
                    self._poll(txn)
            if stall:
                time.sleep(TXN_TIMEOUT_MS / 1000.0 * 1.5)
            if self.rng.random() < ABORT_P:
                self.producer.abort_transaction(10)
                self.hist.record(FAIL, "txn", txn=txn, error="deliberate abort")
                return
            self.hist.record(INVOKE, "commit", txn=txn)
            if self.rng.random() < IMPATIENT_P:
                self._impatient_commit(txn)
                return
            self.producer.commit_transaction(10)
            self.hist.record(OK, "txn", txn=txn)
        except KafkaException as exc:
            err = exc.args[0]
            if err.txn_requires_abort() and not err.fatal():
                try:
                    self.producer.abort_transaction(10)
                except Exception as abort_exc:
                    self._unknown(txn, abort_exc)
                    return
                self.hist.record(FAIL, "txn", txn=txn, error=describe(exc))
                return
            self._unknown(txn, exc)
        except Exception as exc:
            self._unknown(txn, exc)

    def _impatient_commit(self, txn: str) -> None:
        """Commit with almost no time (the sender may be sending the last batches with the
        EndTxn), and on a timeout try to abort: that must be refused, since the commit may
        have committed, and committing again must then complete it. A KafkaException of
        any other kind is left to ``_transaction``."""
        assert self.producer is not None
        time.sleep(self.rng.uniform(0, 0.004))  # let the sender take some batches first
        try:
            self.producer.commit_transaction(self.rng.uniform(0, 0.003))
        except KafkaException as exc:
            err = exc.args[0]
            if err.fatal() or err.txn_requires_abort() or not err.retriable():
                raise
        else:
            self.hist.record(OK, "txn", txn=txn)
            return
        self.hist.record(INVOKE, "abort-after-commit", txn=txn)
        try:
            self.producer.abort_transaction(10)
        except KafkaException as exc:
            err = exc.args[0]
            if err.fatal() or err.txn_requires_abort() or err.retriable():
                raise
            self.hist.record(FAIL, "abort-after-commit", txn=txn, error=describe(exc))
        else:
            # Refusing was the contract; what the application is told is then checked too.
            self.hist.record(OK, "abort-after-commit", txn=txn)
            self.hist.record(FAIL, "txn", txn=txn, error="aborted after a commit timed out")
            return
        self.producer.commit_transaction(10)
        self.hist.record(OK, "txn", txn=txn)

    def _unknown(self, txn: str, exc: BaseException) -> None:
        self.hist.record(INFO, "txn", txn=txn, error=describe(exc))
        self._disconnect()

    def _between(self) -> None:
        r = self.rng.random()
        try:
            if r < REASSIGN_P:
                self._reassign()
            elif r < REASSIGN_P + SEEK_P:
                self._seek()
            elif r < REASSIGN_P + SEEK_P + COMMIT_OFFSETS_P:
                self._commit_offsets()
        except Exception as exc:
            # The consumer may now be anywhere: start again from a fresh pair of clients.
            self.hist.record(INFO, "consumer", error=describe(exc))
            self._disconnect()

    def run(self) -> None:
        run_until_stopped(self, self._step)

    def _step(self) -> None:
        self._transaction()
        if self.producer is not None:
            self._between()
        time.sleep(self.rng.uniform(0.01, 0.08))
