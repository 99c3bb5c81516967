"""Completing a prepared transaction: markers on every partition (set-based, partitions
locked in sorted order), the pending offsets, then COMPLETE_* — one DB transaction.

Used by EndTxn right after PREPARE, and as roll-forward by whoever next finds the
transaction PREPARE_* (InitProducerId, the coordinator loop): PREPARE durable means the
transaction completes that way, whoever finishes it (docs/design.md rule 2).
"""

from __future__ import annotations

from sqlalchemy import Connection

from app.coordinator import machines as m
from app.coordinator.metadata import TxnMetadata, plan_complete
from app.coordinator.txn_log import Persist, persist
from app.faults import crash_point
from app.groups.txn_offsets import complete_pending_offsets
from app.log.markers import Marker, MarkerLocks, write_txn_markers
from app.protocol import CONTROL_ABORT, CONTROL_COMMIT


def complete_transaction(
    conn: Connection,
    meta: TxnMetadata,
    now_ms: int,
    *,
    locked: MarkerLocks | None = None,
    record: Persist = persist,
) -> TxnMetadata:
    """Complete ``meta``, prepared, with markers stamped with its ``coordinator_epoch``
    (the caller's lease epoch: a coordinator whose lease moved on is fenced by the
    partitions, rule 7). ``locked``: the transaction's partitions as this DB transaction
    already holds them, and where it queues its writes (``markers.write_txn_markers``);
    ``record``: how COMPLETE_* is persisted."""
    if meta.state not in m.PREPARE:
        raise AssertionError(f"complete_transaction on {meta.state}")
    commit = meta.state == m.PREPARE_COMMIT
    producer_id, producer_epoch = meta.marker_identity
    control = CONTROL_COMMIT if commit else CONTROL_ABORT
    marker = Marker(producer_id, producer_epoch, meta.coordinator_epoch, control, now_ms)
    # A deleted topic has nothing left to mark; a fenced marker stops completion.
    write_txn_markers(conn, meta.partitions, marker, skip_missing=True, locked=locked)
    crash_point("complete.after_marker")
    if meta.has_offsets:
        writes = None if locked is None else locked.writes
        complete_pending_offsets(conn, producer_id, commit, now_ms, writes)
    crash_point("complete.before_complete")
    return record(conn, plan_complete(meta, now_ms), "markers written")
