"""Completing a prepared transaction: markers on every partition (set-based, partitions
locked in sorted order), the pending offsets, then COMPLETE_* — one DB transaction.

Used by EndTxn right after PREPARE, and as roll-forward by whoever next finds the
transaction PREPARE_* (InitProducerId, the coordinator loop): PREPARE durable means the
transaction completes that way, whoever finishes it (docs/design.md rule 2).
"""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy import Connection

from app.coordinator import machines as m
from app.coordinator.metadata import TxnMetadata, plan_complete
from app.coordinator.txn_log import Persist, persist
from app.faults import crash_point
from app.groups.txn_offsets import complete_pending_offsets
from app.log.markers import MarkerLocks, write_txn_markers
from app.protocol import CONTROL_ABORT, CONTROL_COMMIT
from app.storage.driver import WriteBehind


def complete_transaction(
    conn: Connection,
    meta: TxnMetadata,
    coordinator_epoch: int,
    now_ms: int,
    locked: MarkerLocks | None = None,
    record: Persist = persist,
    writes: WriteBehind | None = None,
) -> TxnMetadata:
    """``locked``: the transaction's partitions as this DB transaction already holds them
    and ``writes``: where to queue the markers (``markers.write_txn_markers``);
    ``record``: how COMPLETE_* is persisted."""
    if meta.state not in m.PREPARE:
        raise AssertionError(f"complete_transaction on {meta.state}")
    commit = meta.state == m.PREPARE_COMMIT
    producer_id, producer_epoch = meta.marker_identity
    control = CONTROL_COMMIT if commit else CONTROL_ABORT
    # A deleted topic has nothing left to mark; a fenced marker stops completion.
    write_txn_markers(
        conn, meta.partitions, producer_id, producer_epoch, coordinator_epoch, control, now_ms,
        skip_missing=True, locked=locked, writes=writes,
    )  # fmt: skip
    crash_point("complete.after_marker")
    if meta.has_offsets:
        complete_pending_offsets(conn, producer_id, commit, now_ms)
    crash_point("complete.before_complete")
    done = plan_complete(meta, now_ms)
    return record(conn, replace(done, coordinator_epoch=coordinator_epoch), "markers written")
