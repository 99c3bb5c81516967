"""Producer state per (partition, producer_id): the pure rules behind idempotence.

These functions decide whether a batch is a duplicate, out of order, fenced, or fine, and
fold batches and markers into the next state. The append handler and the rebuild from the
log both use them, which is what makes ``producer_states`` a true projection of ``records``.
The rules follow Kafka's ProducerStateManager (after KIP-360): duplicates are recognised
among the last five batches of the current epoch; a new epoch starts at sequence 0; a
producer with no state (new, or expired) may start at any sequence.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from app.errors import KafkaError
from app.protocol import INT32_MAX, increment_sequence

BATCHES_KEPT = 5


@dataclass(frozen=True)
class BatchMeta:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int

    def to_json(self) -> list[int]:
        return [self.first_seq, self.last_seq, self.first_offset, self.last_offset]

    @classmethod
    def from_json(cls, raw: list[int]) -> BatchMeta:
        return cls(*raw)


@dataclass(frozen=True)
class AppendedBatch:
    """A data batch the partition accepted, as its producer's state takes it."""

    producer_id: int
    producer_epoch: int
    meta: BatchMeta
    max_timestamp: int
    is_transactional: bool


@dataclass(frozen=True)
class Marker:
    """One transaction's control record, the same on each of its partitions: whose
    transaction it closes, which coordinator epoch wrote it (rule 7), COMMIT or ABORT."""

    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    control_type: int
    timestamp_ms: int


@dataclass(frozen=True)
class ProducerEntry:
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_offset: int
    last_timestamp: int
    batches: tuple[BatchMeta, ...]
    coordinator_epoch: int = -1
    txn_first_offset: int | None = None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> ProducerEntry:
        """From the columns of producer_states / producer_snapshots, in their order
        (producer_id, producer_epoch, last_sequence, last_offset, last_timestamp, batches,
        coordinator_epoch, txn_first_offset)."""
        pid, epoch, last_sequence, last_offset, last_timestamp, batches, coord, first = row
        return cls(
            pid,
            epoch,
            last_sequence,
            last_offset,
            last_timestamp,
            tuple(BatchMeta.from_json(b) for b in batches),
            coord,
            first,
        )

    def batches_json(self) -> str:
        """The ``batches`` column as stored (JSON)."""
        return json.dumps([b.to_json() for b in self.batches])


@dataclass(frozen=True)
class Verdict:
    """Outcome of validating a batch: an error, a duplicate of a kept batch, or accept."""

    error_code: int = KafkaError.NO_ERROR
    message: str | None = None
    duplicate_of: BatchMeta | None = None

    @property
    def ok(self) -> bool:
        return self.error_code == KafkaError.NO_ERROR and self.duplicate_of is None


ACCEPT = Verdict()


def in_sequence(last_sequence: int, next_sequence: int) -> bool:
    return next_sequence == last_sequence + 1 or (next_sequence == 0 and last_sequence == INT32_MAX)


def is_expired(entry: ProducerEntry, now_ms: int, expiration_ms: int) -> bool:
    """Idle state may be forgotten, but never while a transaction is open on the partition."""
    return entry.txn_first_offset is None and now_ms - entry.last_timestamp >= expiration_ms


def validate_append(
    entry: ProducerEntry | None,
    producer_epoch: int,
    first_seq: int,
    last_seq: int,
    is_transactional: bool,
) -> Verdict:
    """Decide what to do with a data batch of an idempotent producer (docs/design.md rules 4-6)."""
    if entry is None:
        # New producer, or its state expired: any sequence is accepted (KIP-360).
        return ACCEPT
    if producer_epoch < entry.producer_epoch:
        return Verdict(
            KafkaError.INVALID_PRODUCER_EPOCH,
            f"epoch {producer_epoch} is older than the current epoch {entry.producer_epoch}",
        )
    if producer_epoch == entry.producer_epoch:
        for batch in entry.batches:
            if batch.first_seq == first_seq and batch.last_seq == last_seq:
                return Verdict(duplicate_of=batch)
        if not in_sequence(entry.last_sequence, first_seq):
            return Verdict(
                KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"expected sequence {increment_sequence(entry.last_sequence, 1)}, got {first_seq}",
            )
    elif first_seq != 0:
        return Verdict(
            KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
            f"a new epoch {producer_epoch} must start at sequence 0, got {first_seq}",
        )
    if entry.txn_first_offset is not None and not is_transactional:
        return Verdict(
            KafkaError.INVALID_TXN_STATE,
            "non-transactional write from a producer with an open transaction",
        )
    return ACCEPT


def apply_append(entry: ProducerEntry | None, appended: AppendedBatch) -> ProducerEntry:
    """The state after an accepted data batch."""
    batch = appended.meta
    if entry is None or appended.producer_epoch != entry.producer_epoch:
        kept: tuple[BatchMeta, ...] = (batch,)
    else:
        kept = (*entry.batches, batch)[-BATCHES_KEPT:]
    txn_first = entry.txn_first_offset if entry is not None else None
    if appended.is_transactional and txn_first is None:
        txn_first = batch.first_offset
    max_timestamp = appended.max_timestamp
    return ProducerEntry(
        producer_id=appended.producer_id,
        producer_epoch=appended.producer_epoch,
        last_sequence=batch.last_seq,
        last_offset=batch.last_offset,
        last_timestamp=max_timestamp if entry is None else max(entry.last_timestamp, max_timestamp),
        batches=kept,
        coordinator_epoch=entry.coordinator_epoch if entry is not None else -1,
        txn_first_offset=txn_first,
    )


def validate_marker(entry: ProducerEntry | None, marker: Marker) -> Verdict:
    """A transaction marker from the coordinator: fenced if its epochs are stale (rule 7)."""
    if entry is None:
        return ACCEPT
    if marker.producer_epoch < entry.producer_epoch:
        return Verdict(
            KafkaError.INVALID_PRODUCER_EPOCH,
            f"marker epoch {marker.producer_epoch} is older than the producer's epoch "
            f"{entry.producer_epoch}",
        )
    if marker.coordinator_epoch < entry.coordinator_epoch:
        return Verdict(
            KafkaError.TRANSACTION_COORDINATOR_FENCED,
            f"coordinator epoch {marker.coordinator_epoch} is older than {entry.coordinator_epoch}",
        )
    return ACCEPT


def apply_marker(entry: ProducerEntry | None, marker: Marker, offset: int) -> ProducerEntry:
    """The state after a COMMIT/ABORT marker: the open transaction (if any) is closed.

    A marker in a new epoch (the coordinator fenced the producer) resets the sequence, as
    the producer's next batch in that epoch starts at 0.
    """
    timestamp = marker.timestamp_ms
    if entry is None or marker.producer_epoch != entry.producer_epoch:
        return ProducerEntry(
            producer_id=marker.producer_id,
            producer_epoch=marker.producer_epoch,
            last_sequence=-1,
            last_offset=offset,
            last_timestamp=timestamp if entry is None else max(entry.last_timestamp, timestamp),
            batches=(),
            coordinator_epoch=marker.coordinator_epoch,
            txn_first_offset=None,
        )
    return replace(
        entry,
        last_timestamp=max(entry.last_timestamp, timestamp),
        coordinator_epoch=marker.coordinator_epoch,
        txn_first_offset=None,
    )
