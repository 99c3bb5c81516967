"""A thin driver over the coordinator and log handlers, playing the client's part in tests
(the real client is tested separately; these tests aim at the broker's rules)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import text

from app.broker import Broker
from app.broker.produce import produce
from app.coordinator.handlers import add_offsets_to_txn, add_partitions_to_txn, end_txn
from app.coordinator.producer_id import init_producer_id
from app.log.fetch import fetch
from app.protocol import (
    EARLIEST_TIMESTAMP,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    RECORD_VALUE,
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    FetchRequest,
    InitProducerIdRequest,
    ListOffsetsRequest,
    ProduceBatchesRequest,
    ProduceBatchesResponse,
    ProduceRequest,
    ProduceResponse,
    RecordIn,
)


@dataclass
class TxnDriver:
    broker: Broker
    transactional_id: str
    timeout_ms: int = 60_000
    producer_id: int = -1
    producer_epoch: int = -1
    sequences: dict[tuple[str, int], int] = field(default_factory=dict)

    def init(self) -> int:
        r = init_producer_id(
            self.broker, InitProducerIdRequest(self.transactional_id, self.timeout_ms)
        )
        if r.error_code == 0:
            self.producer_id, self.producer_epoch = r.producer_id, r.producer_epoch
            self.sequences.clear()
        return r.error_code

    def add(self, *partitions: tuple[str, int]) -> int:
        req = AddPartitionsToTxnRequest(
            self.transactional_id, self.producer_id, self.producer_epoch, list(partitions)
        )
        return add_partitions_to_txn(self.broker, req).error_code

    def add_offsets(self, group_id: str) -> int:
        req = AddOffsetsToTxnRequest(
            self.transactional_id, self.producer_id, self.producer_epoch, group_id
        )
        return add_offsets_to_txn(self.broker, req).error_code

    def send(
        self, topic: str, partition: int, *values: str, register: bool = True
    ) -> ProduceResponse:
        records = [RecordIn(None, v.encode(), 0) for v in values]
        return self.send_records(topic, partition, records, register=register)

    def send_records(
        self, topic: str, partition: int, records: list[RecordIn], register: bool = True
    ) -> ProduceResponse:
        if register:
            assert self.add((topic, partition)) == 0
        seq = self.sequences.get((topic, partition), 0)
        r = produce(
            self.broker,
            ProduceRequest(
                topic, partition, records, producer_id=self.producer_id, producer_epoch=self.producer_epoch,
                base_sequence=seq, transactional_id=self.transactional_id, is_transactional=True,
            ),
        )  # fmt: skip
        if r.error_code == 0 and not r.duplicate:
            self.sequences[(topic, partition)] = seq + len(records)
        return r

    def requests(self, *batches: tuple[str, int, str]) -> list[ProduceRequest]:
        """One-record transactional batches (topic, partition, value), numbered after what
        this driver sent before (the numbers are not taken: see ``commit_with``)."""
        return [
            ProduceRequest(
                topic, partition, [RecordIn(None, value.encode(), 0)], self.producer_id,
                self.producer_epoch, self.sequences.get((topic, partition), 0),
                self.transactional_id, True,
            )
            for topic, partition, value in batches
        ]  # fmt: skip

    def commit_with(
        self, requests: list[ProduceRequest], register: list[tuple[str, int]] | None = None
    ) -> ProduceBatchesResponse:
        """The commit as one request carrying ``requests``, registering ``register``."""
        add = None
        if register:
            add = AddPartitionsToTxnRequest(
                self.transactional_id, self.producer_id, self.producer_epoch, register
            )
        end = EndTxnRequest(self.transactional_id, self.producer_id, self.producer_epoch, True)
        r = self.broker.handle(ProduceBatchesRequest(requests, add, end))
        assert r.end is not None
        if r.end.error_code == 0:
            self._ended(r.end.producer_id, r.end.producer_epoch)
        else:
            for req, b in zip(requests, r.batches, strict=True):
                if b.error_code == 0 and not b.duplicate:
                    self.sequences[(req.topic, req.partition)] = req.base_sequence + 1
        return r

    def end(self, commit: bool = True) -> int:
        r = end_txn(
            self.broker,
            EndTxnRequest(self.transactional_id, self.producer_id, self.producer_epoch, commit),
        )
        if r.error_code == 0:
            self._ended(r.producer_id, r.producer_epoch)
        return r.error_code

    def _ended(self, producer_id: int, producer_epoch: int) -> None:
        # KIP-890: the next transaction uses the identity EndTxn returned.
        if (producer_id, producer_epoch) != (self.producer_id, self.producer_epoch):
            self.sequences.clear()
        self.producer_id, self.producer_epoch = producer_id, producer_epoch


def read_values(broker: Broker, topic: str, partition: int, committed: bool = True) -> list[str]:
    """Every value of the partition from its log start, as a consumer reads them."""
    out: list[str] = []
    offset = broker.handle(ListOffsetsRequest(topic, partition, EARLIEST_TIMESTAMP)).offset
    level = READ_COMMITTED if committed else READ_UNCOMMITTED
    while True:
        r = fetch(broker, FetchRequest(topic, partition, offset, isolation_level=level))
        assert r.error_code == 0, r
        out.extend((rec[RECORD_VALUE] or b"").decode() for rec in r.records)
        if r.next_offset == offset:
            return out
        offset = r.next_offset


def partition_offsets(broker: Broker, topic: str, partition: int) -> tuple[int, int]:
    """(high watermark, last stable offset)."""
    with broker.engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT next_offset, last_stable_offset FROM partitions WHERE topic = :t AND partition = :p"
            ),
            {"t": topic, "p": partition},
        ).one()
    return int(row[0]), int(row[1])


def state_of(broker: Broker, transactional_id: str) -> str | None:
    with broker.engine.connect() as conn:
        return conn.execute(
            text("SELECT state FROM transactions WHERE transactional_id = :t"),
            {"t": transactional_id},
        ).scalar()


def produce_many(broker: Broker, requests: list[ProduceRequest]) -> list[ProduceResponse]:
    """Several partitions' batches in one produce request."""
    return broker.handle(ProduceBatchesRequest(requests)).batches


def produce_registering(
    broker: Broker, requests: list[ProduceRequest], add: AddPartitionsToTxnRequest
) -> tuple[AddPartitionsToTxnResponse | None, list[ProduceResponse]]:
    """One produce request that registers ``add``'s partitions with its batches (KIP-890)."""
    r = broker.handle(ProduceBatchesRequest(requests, add))
    return r.registered, r.batches


def batchwise(
    broker: Broker, handler: Callable[[Broker, ProduceRequest], ProduceResponse]
) -> Callable[[ProduceBatchesRequest], ProduceBatchesResponse]:
    """A producer transport that hands each batch of a request to ``handler`` on its own
    (fault injection per batch); for requests without registration or EndTxn."""

    def transport(request: ProduceBatchesRequest) -> ProduceBatchesResponse:
        assert request.add is None and request.end is None
        return ProduceBatchesResponse([handler(broker, batch) for batch in request.batches])

    return transport
