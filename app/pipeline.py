"""The exactly-once consume-transform-produce loop, in the shape of confluent-kafka's
eos_transactions.py: read a batch, write its transformation, commit the input offsets in
the same transaction. Used by ``kip98 demo`` and by the crash tests, which SIGKILL it.

Each output record goes to the input record's partition number, so per-partition order
carries over and can be checked.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from app.client import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from app.settings import BrokerSettings

log = logging.getLogger(__name__)

Transform = Callable[[bytes | None], bytes | None]


def upper(value: bytes | None) -> bytes | None:
    return None if value is None else value.upper()


@dataclass
class CopierStats:
    transactions: int = 0
    aborted: int = 0
    records: int = 0
    started: float = field(default_factory=time.monotonic)
    # When the group first gave the copier partitions (its first rebalance may wait
    # group.initial.rebalance.delay.ms for more members); None until then.
    assigned: float | None = None


@dataclass
class Copier:
    input_topic: str
    output_topic: str
    group_id: str
    transactional_id: str
    database_url: str | None = None
    transform: Transform = upper
    batch_size: int = 500
    transaction_timeout_ms: int = 10_000
    extra_config: dict[str, object] = field(default_factory=dict)  # the consumer's
    producer_config: dict[str, object] = field(default_factory=dict)
    stats: CopierStats = field(default_factory=CopierStats)
    _running: bool = True

    def _configs(self) -> tuple[dict[str, object], dict[str, object]]:
        common: dict[str, object] = {"database.url": self.database_url} if self.database_url else {}
        consumer = {
            **common,
            "group.id": self.group_id,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "client.id": f"{self.transactional_id}-consumer",
            # Static membership: a restarted copier takes its old place at once (KIP-345).
            "group.instance.id": self.transactional_id,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            **self.extra_config,
        }
        producer = {
            **common,
            "transactional.id": self.transactional_id,
            "linger.ms": 5,
            "client.id": self.transactional_id,
            # A copier that dies mid-transaction holds its input offsets pending (KIP-447:
            # the partition's next owner waits for them) until the transaction times out.
            "transaction.timeout.ms": self.transaction_timeout_ms,
            **self.producer_config,
        }
        return consumer, producer

    def stop(self) -> None:
        self._running = False

    def run(self, idle_exit_s: float | None = None) -> CopierStats:
        """Copy until stopped, or until nothing arrived for ``idle_exit_s`` seconds once the
        group gave it partitions."""
        consumer_cfg, producer_cfg = self._configs()
        consumer = Consumer(consumer_cfg)
        producer = Producer(producer_cfg)
        try:
            producer.init_transactions()
            consumer.subscribe([self.input_topic])
            # Not idle while the group's first rebalance waits for more members.
            idle_since = time.monotonic() + BrokerSettings.from_env().initial_rebalance_delay_s
            while self._running:
                msgs = [
                    m for m in consumer.consume(self.batch_size, timeout=0.2) if m.error() is None
                ]
                if self.stats.assigned is None and consumer.assignment():
                    self.stats.assigned = idle_since = time.monotonic()
                if not msgs:
                    if idle_exit_s is not None and time.monotonic() - idle_since > idle_exit_s:
                        break
                    continue
                idle_since = time.monotonic()
                self._copy(consumer, producer, msgs)
        finally:
            producer.close()
            consumer.close()
        return self.stats

    def _copy(self, consumer: Consumer, producer: Producer, msgs: list[Message]) -> None:
        producer.begin_transaction()
        try:
            for m in msgs:
                producer.produce(
                    self.output_topic,
                    self.transform(m.value()),
                    m.key(),
                    partition=m.partition() or 0,
                    headers=m.headers(),
                )
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()), consumer.consumer_group_metadata()
            )
            self._commit(producer)
            self.stats.transactions += 1
            self.stats.records += len(msgs)
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if err.fatal() or not (err.txn_requires_abort() or err.retriable()):
                raise
            log.info("transaction failed (%s); aborting and rewinding", err)
            producer.abort_transaction()
            self.stats.aborted += 1
            self._rewind(consumer)

    def _commit(self, producer: Producer) -> None:
        """commit_transaction(), again while it fails retriably: a commit whose outcome is
        unknown may have committed, so it can only be completed, never aborted."""
        while True:
            try:
                producer.commit_transaction()
                return
            except KafkaException as exc:
                err: KafkaError = exc.args[0]
                if err.fatal() or err.txn_requires_abort() or not err.retriable():
                    raise
                if not self._running:
                    raise  # stopping: the transaction is left to time out or be fenced
                log.info("commit not completed (%s); committing again", err)

    def _rewind(self, consumer: Consumer) -> None:
        """After an abort, read again from the committed offsets."""
        assignment = consumer.assignment()
        if not assignment:
            return
        for tp in consumer.committed(assignment, timeout=30):
            consumer.seek(
                TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else -2)
            )


def main(argv: list[str] | None = None) -> int:
    """``python -m app.pipeline INPUT OUTPUT GROUP TRANSACTIONAL_ID``: copy until SIGTERM or idle."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("input_topic")
    parser.add_argument("output_topic")
    parser.add_argument("group_id")
    parser.add_argument("transactional_id")
    parser.add_argument("--idle-exit", type=float, default=None)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument(
        "--max-in-flight", type=int, default=None, help="the producer's max.in.flight"
    )
    args = parser.parse_args(argv)
    extra = {} if args.max_in_flight is None else {"max.in.flight": args.max_in_flight}
    copier = Copier(
        args.input_topic,
        args.output_topic,
        args.group_id,
        args.transactional_id,
        batch_size=args.batch_size,
        producer_config=extra,
    )
    signal.signal(signal.SIGTERM, lambda *_: copier.stop())
    stats = copier.run(idle_exit_s=args.idle_exit)
    print(
        f"copied {stats.records} records in {stats.transactions} transactions ({stats.aborted} aborted)",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
