"""TxnOffsetCommit, where the transaction coordinator and the group coordinator meet: in
one DB transaction the coordinator checks that the offsets' transaction is ongoing and
has added them (or, for a commit of KIP-890's transaction version 2, adds them itself, as
AddOffsetsToTxn would), and the group records them pending (docs/design.md rule 9).
Composed here, so neither package reaches into the other's tables."""

from __future__ import annotations

from app.broker.work import Work
from app.coordinator.guard import check_txn_offsets
from app.coordinator.handlers import add_offsets_in
from app.coordinator.txn_log import TransitionBatch, remember_txn, txn_version_read
from app.errors import KafkaError, KafkaException
from app.groups.offsets import (
    check_group_id,
    partition_codes,
    record_txn_offsets,
    refused_partitions,
)
from app.protocol import TxnOffsetCommitRequest, TxnOffsetCommitResponse
from app.security import needs
from app.security.authorizer import authorize_all
from app.storage.context import BrokerContext
from app.storage.driver import WriteBehind
from app.storage.engine import retry_conflicts


@retry_conflicts
def txn_offset_commit(
    broker: BrokerContext, req: TxnOffsetCommitRequest
) -> TxnOffsetCommitResponse:
    """Each partition answered on its own, as Kafka does: a refused one
    (``groups.offsets.refused_partitions``) says why and the others go pending. The
    response's ``error_code`` is the first refusal (the whole request's, if it was refused
    as a whole), so a native transaction that lost any of its offsets is abortable."""
    try:
        check_group_id(req.group_id)
        if not req.offsets:
            return TxnOffsetCommitResponse(KafkaError.NO_ERROR)
        added, version = None, None
        with broker.engine.begin() as conn:
            authorize_all(conn, broker, needs.txn_offset_commit(req.transactional_id, req.group_id))
            refused = refused_partitions(conn, broker, req.offsets)
            accepted = {tp: om for tp, om in req.offsets.items() if tp not in refused}
            if accepted:
                # The checks read at once; the writes go together, then COMMIT.
                work = Work(broker, conn, transitions=TransitionBatch(), writes=WriteBehind())
                now_ms = broker.clock.now_ms()
                if req.add_offsets:
                    # KIP-890's transaction version 2: the AddOffsetsToTxn this commit
                    # implies, which leaves the transaction ongoing with offsets or refuses
                    # (its checks are the ones below); a refusal of the offsets takes it
                    # back with them.
                    added = add_offsets_in(conn, req, now_ms, work.record)
                else:
                    check_txn_offsets(
                        conn, req.transactional_id, req.producer_id, req.producer_epoch
                    )
                record_txn_offsets(conn, now_ms, req, accepted, work.writes)
                read = None if added is None else txn_version_read(req.transactional_id)
                row = work.send(read)
                version = None if row is None else str(row[0])
        if added is not None and version is not None:
            # The id's row as this commit left it: the transaction's commit, decided on it
            # and on the partitions the last commit left, may then go in one query string
            # (docs/design.md §3.11).
            remember_txn(conn, version, added)
        codes = partition_codes(req.offsets, refused)
        if refused:
            first = refused[min(refused)].error
            return TxnOffsetCommitResponse(first.code(), codes, first.str())
        return TxnOffsetCommitResponse(KafkaError.NO_ERROR, codes)
    except KafkaException as exc:
        code = exc.error.code()
        return TxnOffsetCommitResponse(code, dict.fromkeys(req.offsets, code), exc.error.str())
