"""The group coordinator's offset handlers: OffsetCommit, OffsetFetch, and the group's
part of TxnOffsetCommit (``record_txn_offsets``; the handler is ``app.broker.offsets``).

Plain commits land in ``group_offsets`` at once. Transactional ones (KIP-98 §4.4) stay in
``pending_txn_offsets`` per producer until the COMMIT marker applies them or ABORT drops
them (``txn_offsets``); OffsetFetch with require_stable refuses to answer while any are
pending (KIP-447), so a new consumer never starts from an offset that may yet roll back.
Every commit is also an ``offset_commit_log`` event, from which the projection rebuilds.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from app.errors import KafkaError, KafkaException, fail
from app.groups import sql
from app.groups.membership import check_generation
from app.protocol import (
    OffsetAndMetadata,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    TopicPartitionKey,
    TxnOffsetCommitRequest,
)
from app.security import needs
from app.security.authorizer import authorize_all
from app.storage.context import BrokerContext
from app.storage.driver import WriteBehind, driver_sql, execute_or_queue
from app.storage.engine import retry_conflicts


def validate_offsets(group_id: object, offsets: dict[TopicPartitionKey, OffsetAndMetadata]) -> None:
    """Pure request checks: a group id, and offsets that are positions (>= 0)."""
    if not isinstance(group_id, str) or not group_id:
        raise fail(KafkaError.INVALID_GROUP_ID, "group id must be a non-empty string")
    for (topic, partition), om in offsets.items():
        if not isinstance(om.offset, int) or isinstance(om.offset, bool) or om.offset < 0:
            raise fail(
                KafkaError.INVALID_REQUEST,
                f"offset {om.offset!r} for {topic} [{partition}] must be >= 0",
            )
        if om.metadata is not None and len(om.metadata) > 4096:
            raise fail(
                KafkaError.OFFSET_METADATA_TOO_LARGE,
                f"metadata for {topic} [{partition}] exceeds 4096 characters",
            )


def _columns(offsets: dict[TopicPartitionKey, OffsetAndMetadata]) -> dict[str, list[Any]]:
    keys = sorted(offsets)
    return {
        "topics": [t for t, _ in keys],
        "partitions": [p for _, p in keys],
        "offsets": [offsets[k].offset for k in keys],
        "metadata": [offsets[k].metadata for k in keys],
    }


def _check_partitions_exist(conn: Connection, cols: dict[str, list[Any]]) -> None:
    found = {(r.topic, r.partition) for r in conn.execute(sql.EXISTING_PARTITIONS, cols)}
    missing = [tp for tp in zip(cols["topics"], cols["partitions"], strict=True) if tp not in found]
    if missing:
        raise fail(KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"unknown partitions: {missing}")


@retry_conflicts
def offset_commit(broker: BrokerContext, req: OffsetCommitRequest) -> OffsetCommitResponse:
    try:
        validate_offsets(req.group_id, req.offsets)
        if not req.offsets:
            return OffsetCommitResponse(KafkaError.NO_ERROR)
        cols = _columns(req.offsets)
        with broker.engine.begin() as conn:
            authorize_all(conn, broker, needs.offset_commit(req.group_id, req.offsets))
            _check_partitions_exist(conn, cols)
            check_generation(
                conn, req.group_id, req.member_id, req.generation_id, broker.clock.now_ms()
            )
            params = {**cols, "group_id": req.group_id, "now": broker.clock.now_ms()}
            # The projection first: its rows (locked, or inserted, which a concurrent insert
            # waits on) order concurrent commits of one offset, so the later event is the
            # one the projection keeps.
            conn.execute(sql.UPSERT_COMMITTED, params)
            conn.execute(
                sql.LOG_COMMITS,
                {**params, "kind": "commit", "producer_id": None, "producer_epoch": None},
            )
        return OffsetCommitResponse(KafkaError.NO_ERROR, dict.fromkeys(req.offsets, 0))
    except KafkaException as exc:
        code = exc.error.code()
        return OffsetCommitResponse(code, dict.fromkeys(req.offsets, code), exc.error.str())


def record_txn_offsets(
    conn: Connection, now_ms: int, req: TxnOffsetCommitRequest, writes: WriteBehind | None = None
) -> None:
    """The group's side of a TxnOffsetCommit: the offsets pending for their producer until
    its transaction ends (the transaction's own check is the coordinator's, in the same DB
    transaction: ``app.broker.offsets``). The checks run at once; the writes, whose
    results nothing reads, are queued on ``writes`` if given."""
    cols = _columns(req.offsets)
    _check_partitions_exist(conn, cols)
    check_generation(conn, req.group_id, req.member_id, req.generation_id, now_ms)
    params = {
        **cols, "group_id": req.group_id, "now": now_ms,
        "producer_id": req.producer_id, "producer_epoch": req.producer_epoch,
    }  # fmt: skip
    # The projection first, as in offset_commit.
    execute_or_queue(conn, writes, driver_sql(sql.UPSERT_PENDING), params)
    execute_or_queue(conn, writes, driver_sql(sql.LOG_COMMITS), {**params, "kind": "txn_pending"})


def offset_fetch(broker: BrokerContext, req: OffsetFetchRequest) -> OffsetFetchResponse:
    try:
        if not isinstance(req.group_id, str) or not req.group_id:
            raise fail(KafkaError.INVALID_GROUP_ID, "group id must be a non-empty string")
        wanted = None if req.partitions is None else set(req.partitions)
        with broker.engine.connect() as conn:
            authorize_all(conn, broker, needs.offset_fetch(req.group_id))
            if req.require_stable:
                pending = {
                    (r.topic, r.partition)
                    for r in conn.execute(sql.PENDING_FOR_GROUP, {"group_id": req.group_id})
                }
                unstable = pending if wanted is None else pending & wanted
                if unstable:
                    raise fail(
                        KafkaError.UNSTABLE_OFFSET_COMMIT,
                        f"transactional offsets pending for {sorted(unstable)}",
                    )
            rows = conn.execute(sql.FETCH_COMMITTED, {"group_id": req.group_id}).all()
        found = {
            (r.topic, r.partition): OffsetAndMetadata(r.committed_offset, r.metadata)
            for r in rows
            if wanted is None or (r.topic, r.partition) in wanted
        }
        if wanted is not None:
            for tp in wanted:
                found.setdefault(tp, OffsetAndMetadata(-1, None))
        return OffsetFetchResponse(KafkaError.NO_ERROR, found)
    except KafkaException as exc:
        return OffsetFetchResponse(exc.error.code(), error_message=exc.error.str())


def delete_topic_offsets(conn: Connection, topic: str, now_ms: int) -> None:
    """Forget every group's offsets of ``topic``, committed or pending, as Kafka does when
    a topic is deleted: a topic made again under the same name starts with none, so a
    group reads it from its ``auto.offset.reset`` rather than from offsets of records
    that are gone. Logged as 'delete' events, so a rebuild forgets them too."""
    conn.execute(sql.LOG_TOPIC_OFFSETS_DELETED, {"t": topic, "now": now_ms})
    for statement in sql.DELETE_TOPIC_OFFSETS:
        conn.execute(statement, {"t": topic})
