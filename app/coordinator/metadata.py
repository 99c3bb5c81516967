"""Transaction metadata and the pure rules of each coordinator request.

Every function here takes the current metadata (as loaded under the transactional id's
row lock) and returns either an error or the next metadata to persist; the handlers do the
I/O. Kafka's TransactionMetadata/TransactionCoordinator are the reference, with KIP-890's
"one (producer_id, epoch) per transaction": ending a transaction bumps the epoch, and the
bumped identity is what EndTxn returns.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace

from app.coordinator import machines as m
from app.errors import KafkaError, fail
from app.protocol import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, TopicPartitionKey


def txn_partition_for(transactional_id: str, partitions: int) -> int:
    """The transaction-log partition of an id: a stable hash, like Kafka's partitionFor."""
    return zlib.crc32(transactional_id.encode()) % partitions


@dataclass(frozen=True)
class TxnMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    last_producer_id: int
    last_producer_epoch: int
    state: str
    partitions: tuple[TopicPartitionKey, ...]
    has_offsets: bool
    timeout_ms: int
    txn_start_ms: int
    updated_ms: int
    coordinator_epoch: int
    txn_partition: int

    def transition(self, trigger: str, **changes: object) -> TxnMetadata:
        """The next metadata after ``trigger``; the status machine must allow it."""
        state = m.txn_transition(self.state, trigger)
        return replace(self, state=state, **changes)  # type: ignore[arg-type]

    @property
    def marker_identity(self) -> tuple[int, int]:
        """(producer_id, epoch) the markers of a PREPARE_* transaction carry.

        The transaction's data was written by ``last_producer_id``; markers carry the bumped
        epoch when the id did not rotate, so the marker itself fences late writes.
        """
        if self.producer_id == self.last_producer_id:
            return self.producer_id, self.producer_epoch
        return self.last_producer_id, self.last_producer_epoch


@dataclass(frozen=True)
class Identity:
    producer_id: int
    producer_epoch: int
    needs_new_id: bool


def bumped_identity(producer_id: int, producer_epoch: int) -> Identity:
    """Bump the epoch; past the maximum the producer id must rotate (epoch 0 on a new id)."""
    if m.identity_after_bump(producer_epoch) == m.EXHAUSTED:
        return Identity(NO_PRODUCER_ID, 0, needs_new_id=True)
    return Identity(producer_id, producer_epoch + 1, needs_new_id=False)


def validate_timeout(timeout_ms: int, max_timeout_ms: int) -> None:
    if (
        isinstance(timeout_ms, bool)
        or not isinstance(timeout_ms, int)
        or not 0 < timeout_ms <= max_timeout_ms
    ):
        raise fail(
            KafkaError.INVALID_TRANSACTION_TIMEOUT,
            f"transaction.timeout.ms={timeout_ms!r} must be in (0, {max_timeout_ms}]",
        )


def check_producer(meta: TxnMetadata | None, producer_id: int, producer_epoch: int) -> TxnMetadata:
    """The identity checks every transactional request makes (KIP-588 error codes)."""
    if meta is None or meta.state == m.DEAD:
        raise fail(
            KafkaError.INVALID_PRODUCER_ID_MAPPING,
            "no producer id is assigned to this transactional id",
        )
    if producer_id != meta.producer_id:
        if producer_id == meta.last_producer_id and producer_epoch <= meta.last_producer_epoch:
            raise fail(KafkaError.PRODUCER_FENCED, "producer id was rotated by a newer instance")
        raise fail(
            KafkaError.INVALID_PRODUCER_ID_MAPPING,
            f"producer id {producer_id} is not assigned to this transactional id",
        )
    if producer_epoch < meta.producer_epoch:
        raise fail(
            KafkaError.PRODUCER_FENCED,
            f"epoch {producer_epoch} is fenced by epoch {meta.producer_epoch}",
        )
    if producer_epoch > meta.producer_epoch:
        raise fail(
            KafkaError.INVALID_PRODUCER_EPOCH,
            f"epoch {producer_epoch} is newer than the coordinator's {meta.producer_epoch}",
        )
    return meta


def plan_add(
    meta: TxnMetadata, partitions: list[TopicPartitionKey], has_offsets: bool, now_ms: int
) -> TxnMetadata:
    """AddPartitionsToTxn / AddOffsetsToTxn: start the transaction or widen it."""
    if meta.state in m.PREPARE:
        raise fail(KafkaError.CONCURRENT_TRANSACTIONS, f"transaction is completing ({meta.state})")
    if not m.txn_allows(meta.state, "add_partitions"):
        raise fail(
            KafkaError.INVALID_TXN_STATE, f"cannot add to a transaction in state {meta.state}"
        )
    starting = meta.state != m.BEGIN
    merged = tuple(sorted(set(() if starting else meta.partitions) | set(partitions)))
    return meta.transition(
        "add_partitions",
        partitions=merged,
        has_offsets=(False if starting else meta.has_offsets) or has_offsets,
        txn_start_ms=now_ms if starting else meta.txn_start_ms,
        updated_ms=now_ms,
    )


def plan_register(
    meta: TxnMetadata, partitions: list[TopicPartitionKey], now_ms: int
) -> TxnMetadata | None:
    """AddPartitionsToTxn's transition, or None if there is none to make: no partition, or
    every one already in the ongoing transaction."""
    if not partitions or (meta.state == m.BEGIN and set(partitions) <= set(meta.partitions)):
        return None
    return plan_add(meta, partitions, False, now_ms)


def plan_end(
    meta: TxnMetadata, commit: bool, producer_id: int, producer_epoch: int, now_ms: int
) -> TxnMetadata:
    """EndTxn from BEGIN: PREPARE_* with the next identity (the point of no return)."""
    return meta.transition(
        "end_commit" if commit else "end_abort",
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        last_producer_id=meta.producer_id,
        last_producer_epoch=meta.producer_epoch,
        updated_ms=now_ms,
    )


def end_retry_outcome(
    meta: TxnMetadata, producer_id: int, producer_epoch: int, commit: bool
) -> bool:
    """Is this EndTxn a retry of the one that already ended (or is ending) the transaction?

    True: same outcome, answer OK with the current identity. Raises INVALID_TXN_STATE for a
    retry asking the opposite outcome. False: not a retry at all.
    """
    ended = meta.state in (*m.PREPARE, *m.COMPLETE)
    if not (
        ended
        and producer_id == meta.last_producer_id
        and producer_epoch == meta.last_producer_epoch
    ):
        return False
    committed = meta.state in (m.PREPARE_COMMIT, m.COMPLETE_COMMIT)
    if committed != commit:
        raise fail(
            KafkaError.INVALID_TXN_STATE,
            f"transaction already ended as {meta.state}, cannot {'commit' if commit else 'abort'}",
        )
    return True


def after_coordinator_abort(meta: TxnMetadata, producer_id: int, producer_epoch: int) -> bool:
    """Is ``(producer_id, producer_epoch)`` the identity the coordinator's own abort (a
    timeout, ``plan_fence_abort`` without a rotated id) bumped past? Kafka's transaction
    version 2 takes the client's EndTxn at that epoch as a retry of the abort
    (``EndTxnRequest.after_abort_is_retry``; docs/design.md rule 65)."""
    return (
        meta.state in (m.PREPARE_ABORT, m.COMPLETE_ABORT)
        and meta.last_producer_epoch == NO_PRODUCER_EPOCH
        and producer_id == meta.producer_id == meta.last_producer_id
        and producer_epoch == meta.producer_epoch - 1
    )


def plan_complete(meta: TxnMetadata, now_ms: int) -> TxnMetadata:
    trigger = "complete_commit" if meta.state == m.PREPARE_COMMIT else "complete_abort"
    return meta.transition(trigger, partitions=(), has_offsets=False, updated_ms=now_ms)


def plan_fence_abort(
    meta: TxnMetadata, producer_id: int, producer_epoch: int, now_ms: int
) -> TxnMetadata:
    """Abort an ongoing transaction on the coordinator's own initiative (timeout, or a new
    producer instance) with a bumped identity, so the old instance is fenced."""
    return meta.transition(
        "fence_abort",
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        last_producer_id=meta.producer_id,
        # As Kafka's epoch fence: no "last" epoch, so the fenced instance's EndTxn can never
        # pass as a retry. Only a rotated id must remember the old identity for its markers.
        last_producer_epoch=meta.producer_epoch
        if producer_id != meta.producer_id
        else NO_PRODUCER_EPOCH,
        updated_ms=now_ms,
    )


def is_timed_out(meta: TxnMetadata, now_ms: int) -> bool:
    return meta.state == m.BEGIN and now_ms > meta.txn_start_ms + meta.timeout_ms


def is_expirable(meta: TxnMetadata, now_ms: int, expiration_ms: int) -> bool:
    return m.txn_allows(meta.state, "expire") and now_ms > meta.updated_ms + expiration_ms
