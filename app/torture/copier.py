"""The copier process: consume-transform-produce from ``torture`` to ``torture-copy`` with
the input offsets in the transaction, as a group (``torture-copiers``) so that kills and
restarts move partitions between copiers.

It records its reads and transactions like a worker does; the exactly-once property of
its output is judged from the final log against the group's committed offsets. Each
output goes to the input's partition number, upper-cased, so output order per partition
must equal input order.
"""

from __future__ import annotations

from typing import Any

from app.client import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from app.torture.history import FAIL, INFO, INVOKE, OK, HistoryWriter
from app.torture.workload import (
    COPY_TOPIC,
    TOPIC,
    ProcessArgs,
    StopFlag,
    close_clients,
    describe,
    producer_config,
    records_of,
    run_until_stopped,
)

GROUP = "torture-copiers"
BATCH = 50


def transform(value: str) -> str:
    return value.upper()


class TortureCopier:
    def __init__(self, args: ProcessArgs) -> None:
        self.args = args
        self.name = f"c{args.index}"
        self.hist = HistoryWriter.of_incarnation(args.out, self.name, args.incarnation)
        self.flags = StopFlag()
        self.txns = 0
        self.producer: Producer | None = None
        self.consumer: Consumer | None = None

    @property
    def incarnation(self) -> int:
        return self.args.incarnation

    def _connect(self) -> None:
        base = {"database.url": self.args.url}
        tid = f"torture-copier-{self.args.index}"
        self.producer = Producer(producer_config(self.args.url, tid, f"torture-{self.name}"))
        self.hist.record(INVOKE, "init")
        self.producer.init_transactions(30)
        self.hist.record(OK, "init")
        self.consumer = Consumer(
            {
                **base,
                "group.id": GROUP,
                "group.instance.id": tid,
                "client.id": f"torture-{self.name}-c",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 500,
            }
        )
        self.consumer.subscribe([TOPIC], on_assign=self._on_assign, on_revoke=self._on_revoke)

    def _on_assign(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        # Where a partition starts is the group's business: no start is claimed here.
        self.hist.record(OK, "assign", start=[[tp.topic, tp.partition, None] for tp in partitions])

    def _on_revoke(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self.hist.record(OK, "revoke", partitions=[[tp.topic, tp.partition] for tp in partitions])

    def _disconnect(self) -> None:
        close_clients(self)

    def _rewind(self) -> None:
        """After an abort, read again from the committed offsets."""
        assert self.consumer is not None
        assignment = self.consumer.assignment()
        if not assignment:
            return
        starts = []
        for tp in self.consumer.committed(assignment, timeout=10):
            offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            self.consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
            starts.append([tp.topic, tp.partition, max(offset, 0)])
        self.hist.record(OK, "seek", start=starts)

    def _copy_once(self) -> None:
        assert self.consumer is not None and self.producer is not None
        self.hist.record(INVOKE, "poll")
        records, errors = records_of(self.consumer.consume(BATCH, timeout=0.2))
        self.hist.record(OK, "poll", records=records, errors=errors)
        if not records:
            return
        self.txns += 1
        txn = f"{self.name}-{self.args.incarnation}-{self.txns}"
        sends = [[COPY_TOPIC, p, transform(v)] for _t, p, _o, v in records]
        self.hist.record(INVOKE, "txn", txn=txn)
        try:
            self.producer.begin_transaction()
            for topic, partition, value in sends:
                self.producer.produce(topic, value.encode(), partition=partition)
            self.hist.record(INVOKE, "send", txn=txn, sends=sends)
            positions = self.consumer.position(self.consumer.assignment())
            self.producer.send_offsets_to_transaction(
                positions, self.consumer.consumer_group_metadata(), 10
            )
            offsets = [[tp.topic, tp.partition, tp.offset] for tp in positions]
            self.hist.record(INVOKE, "commit", txn=txn, offsets=offsets)
            self.producer.commit_transaction(10)
            self.hist.record(OK, "txn", txn=txn)
        except KafkaException as exc:
            err = exc.args[0]
            if err.txn_requires_abort() and not err.fatal():
                self._abort(txn, exc)
            else:
                self._unknown(txn, exc)
        except Exception as exc:
            self._unknown(txn, exc)

    def _abort(self, txn: str, cause: BaseException) -> None:
        assert self.producer is not None
        try:
            self.producer.abort_transaction(10)
        except Exception as exc:
            self._unknown(txn, exc)
            return
        self.hist.record(FAIL, "txn", txn=txn, error=describe(cause))
        self._rewind()

    def _unknown(self, txn: str, exc: BaseException) -> None:
        self.hist.record(INFO, "txn", txn=txn, error=describe(exc))
        self._disconnect()

    def run(self) -> None:
        run_until_stopped(self, self._step)

    def _step(self) -> None:
        try:
            self._copy_once()
        except Exception as exc:  # a failed poll or rewind: start again from the group
            self.hist.record(INFO, "consumer", error=describe(exc))
            self._disconnect()
