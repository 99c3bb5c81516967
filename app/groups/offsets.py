"""The group coordinator's offset handlers: OffsetCommit, OffsetFetch, and the group's
part of TxnOffsetCommit (``record_txn_offsets``; the handler is ``app.broker.offsets``).

Plain commits land in ``group_offsets`` at once. Transactional ones (KIP-98 §4.4) stay in
``pending_txn_offsets`` per producer until the COMMIT marker applies them or ABORT drops
them (``txn_offsets``); OffsetFetch with require_stable refuses to answer while any are
pending (KIP-447), so a new consumer never starts from an offset that may yet roll back.
Every commit is also an ``offset_commit_log`` event, from which the projection rebuilds.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection

from app.errors import KafkaError, KafkaException, fail
from app.groups import sql
from app.groups.consumer import check_fetch_member
from app.groups.membership import check_generation
from app.log.naming import could_exist
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
from app.security.authorizer import authorize_all, denied_checks, refusal_of
from app.storage.context import BrokerContext
from app.storage.driver import WriteBehind, driver_sql, execute_or_queue
from app.storage.engine import retry_conflicts


def check_group_id(group_id: object) -> None:
    """A group id kip98 can hold: a non-empty string without NUL (which Kafka allows and
    PostgreSQL's text cannot store)."""
    if not isinstance(group_id, str) or not group_id or "\x00" in group_id:
        raise fail(KafkaError.INVALID_GROUP_ID, "group id must be a non-empty string without NUL")


def metadata_length(metadata: str) -> int:
    """A metadata string's length as Kafka's offset.metadata.max.bytes counts it: Java's
    String.length(), UTF-16 code units (a character beyond the BMP counts two)."""
    return len(metadata) + sum(1 for c in metadata if ord(c) > 0xFFFF)


def offset_refusal(om: OffsetAndMetadata, max_metadata: int) -> KafkaException | None:
    """Pure checks of one partition's offset: a position (>= 0), a leader epoch (-1 for
    none, KIP-320), and metadata that is a
    string Kafka's wire can carry (any, NUL included) within offset.metadata.max.bytes."""
    if not isinstance(om.offset, int) or isinstance(om.offset, bool) or om.offset < 0:
        return fail(KafkaError.INVALID_REQUEST, f"offset {om.offset!r} must be >= 0")
    epoch = om.leader_epoch
    if not isinstance(epoch, int) or isinstance(epoch, bool) or not -1 <= epoch < 2**31:
        return fail(KafkaError.INVALID_REQUEST, f"leader epoch {epoch!r} must be an int32 >= -1")
    metadata = om.metadata
    if metadata is None:
        return None
    if not isinstance(metadata, str):
        return fail(KafkaError.INVALID_REQUEST, f"metadata must be a string, got {metadata!r}")
    if metadata_length(metadata) > max_metadata:
        return fail(
            KafkaError.OFFSET_METADATA_TOO_LARGE,
            f"metadata of {metadata_length(metadata)} characters exceeds "
            f"offset.metadata.max.bytes={max_metadata}",
        )
    try:
        metadata.encode()
    except UnicodeEncodeError:
        return fail(KafkaError.INVALID_REQUEST, "metadata holds a lone surrogate, not UTF-8")
    return None


def stored_metadata(metadata: str | None) -> bytes | None:
    """Metadata as the offset tables keep it: the UTF-8 of the string, exactly (``bytea``:
    a Kafka string may hold NUL, which PostgreSQL's text cannot)."""
    return None if metadata is None else metadata.encode()


def metadata_of_stored(stored: bytes | memoryview | None) -> str | None:
    return None if stored is None else bytes(stored).decode()


def refused_partitions(
    conn: Connection, broker: BrokerContext, offsets: dict[TopicPartitionKey, OffsetAndMetadata]
) -> dict[TopicPartitionKey, KafkaException]:
    """What each partition of an offset commit is refused with, as Kafka answers each on
    its own: a bad offset or metadata, no Read on its topic, or no such partition. The
    partitions that exist are held FOR KEY SHARE to the commit's COMMIT (rule 31)."""
    max_metadata = broker.settings.offset_metadata_max_bytes
    refused = {tp: why for tp, om in offsets.items() if (why := offset_refusal(om, max_metadata))}
    refused.update(unreadable_partitions(conn, broker, [tp for tp in offsets if tp not in refused]))
    return refused


def unreadable_partitions(
    conn: Connection, broker: BrokerContext, partitions: list[TopicPartitionKey]
) -> dict[TopicPartitionKey, KafkaException]:
    """Those of ``partitions`` a group's offsets cannot be kept for, each with why: no Read
    on its topic (TOPIC_AUTHORIZATION_FAILED), or no such partition. The ones that exist
    are held FOR KEY SHARE to the DB transaction's end (rule 31)."""
    denied = {c.name: refusal_of(broker, c) for c in denied_checks(
        conn, broker, needs.offset_topics(partitions)
    )}  # fmt: skip
    refused: dict[TopicPartitionKey, KafkaException] = {}
    for tp in partitions:
        if tp[0] in denied:
            refused[tp] = denied[tp[0]]
        elif not could_exist(tp[0]):
            refused[tp] = fail(
                KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"{tp[0]} [{tp[1]}] does not exist"
            )
    left = [tp for tp in partitions if tp not in refused]
    if left:
        found = {(r.topic, r.partition) for r in conn.execute(sql.EXISTING_PARTITIONS, _keys(left))}
        for tp in left:
            if tp not in found:
                refused[tp] = fail(
                    KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"{tp[0]} [{tp[1]}] does not exist"
                )
    return refused


def _keys(partitions: list[TopicPartitionKey]) -> dict[str, list[Any]]:
    return {"topics": [t for t, _ in partitions], "partitions": [p for _, p in partitions]}


def _columns(offsets: dict[TopicPartitionKey, OffsetAndMetadata]) -> dict[str, list[Any]]:
    keys = sorted(offsets)
    return {
        "topics": [t for t, _ in keys],
        "partitions": [p for _, p in keys],
        "offsets": [offsets[k].offset for k in keys],
        "metadata": [stored_metadata(offsets[k].metadata) for k in keys],
        "leader_epochs": [offsets[k].leader_epoch for k in keys],
    }


def partition_codes(
    offsets: dict[TopicPartitionKey, OffsetAndMetadata],
    refused: dict[TopicPartitionKey, KafkaException],
) -> dict[TopicPartitionKey, int]:
    return {
        tp: refused[tp].error.code() if tp in refused else KafkaError.NO_ERROR for tp in offsets
    }


def first_refusal(refused: dict[TopicPartitionKey, KafkaException]) -> str | None:
    return None if not refused else refused[min(refused)].error.str()


def refused_whole(
    exc: KafkaException, partitions: Iterable[TopicPartitionKey]
) -> tuple[int, dict[TopicPartitionKey, int], str]:
    """A request refused whole, as Kafka answers it: the response's error code, every
    partition's the same, and the message (an offset response's three fields)."""
    code = exc.error.code()
    return code, dict.fromkeys(partitions, code), exc.error.str()


@retry_conflicts
def offset_commit(broker: BrokerContext, req: OffsetCommitRequest) -> OffsetCommitResponse:
    """Each partition answered on its own: the ones refused (``refused_partitions``) say
    why, the others are committed. A refusal of the whole request (the group's id, its
    ACL, the member's generation) is the response's ``error_code`` and every partition's."""
    try:
        check_group_id(req.group_id)
        if not req.offsets:
            return OffsetCommitResponse(KafkaError.NO_ERROR)
        now = broker.clock.now_ms()
        with broker.engine.begin() as conn:
            authorize_all(conn, broker, needs.offset_commit(req.group_id))
            refused = refused_partitions(conn, broker, req.offsets)
            check_generation(
                conn, req.group_id, req.member_id, req.generation_id, now, req.group_instance_id,
                before_member_epochs=req.before_member_epochs, partitions=req.offsets.keys(),
            )  # fmt: skip
            accepted = {tp: om for tp, om in req.offsets.items() if tp not in refused}
            if accepted:
                params = {**_columns(accepted), "group_id": req.group_id, "now": now}
                # The projection first: its rows (locked, or inserted, which a concurrent
                # insert waits on) order concurrent commits of one offset, so the later
                # event is the one the projection keeps.
                conn.execute(sql.UPSERT_COMMITTED, params)
                conn.execute(
                    sql.LOG_COMMITS,
                    {**params, "kind": "commit", "producer_id": None, "producer_epoch": None},
                )
        return OffsetCommitResponse(
            KafkaError.NO_ERROR, partition_codes(req.offsets, refused), first_refusal(refused)
        )
    except KafkaException as exc:
        return OffsetCommitResponse(*refused_whole(exc, req.offsets))


def record_txn_offsets(
    conn: Connection,
    now_ms: int,
    req: TxnOffsetCommitRequest,
    accepted: dict[TopicPartitionKey, OffsetAndMetadata],
    writes: WriteBehind | None = None,
) -> None:
    """The group's side of a TxnOffsetCommit: the ``accepted`` offsets (those
    ``refused_partitions`` let through) pending for their producer until its transaction
    ends (the transaction's own check is the coordinator's, in the same DB transaction:
    ``app.broker.offsets``). The generation is checked at once; the writes, whose results
    nothing reads, are queued on ``writes`` if given."""
    check_generation(
        conn, req.group_id, req.member_id, req.generation_id, now_ms, req.group_instance_id,
        transactional=True, partitions=accepted.keys(),
    )  # fmt: skip
    params = {
        **_columns(accepted), "group_id": req.group_id, "now": now_ms,
        "producer_id": req.producer_id, "producer_epoch": req.producer_epoch,
    }  # fmt: skip
    # The projection first, as in offset_commit.
    execute_or_queue(conn, writes, driver_sql(sql.UPSERT_PENDING), params)
    execute_or_queue(conn, writes, driver_sql(sql.LOG_COMMITS), {**params, "kind": "txn_pending"})


def offset_fetch(broker: BrokerContext, req: OffsetFetchRequest) -> OffsetFetchResponse:
    """The group's committed offsets. Under ``require_stable`` (KIP-447) a partition with
    a transactional commit pending is answered UNSTABLE_OFFSET_COMMIT on its own, with no
    offset, and the others with theirs, as Kafka's coordinator answers; a fetch of all the
    group's offsets lists only the partitions that have one. A consumer group's member,
    if named (OffsetFetch v9), must be one at its epoch (``check_fetch_member``)."""
    try:
        check_group_id(req.group_id)
        wanted = None if req.partitions is None else set(req.partitions)
        with broker.engine.connect() as conn:
            authorize_all(conn, broker, needs.offset_fetch(req.group_id))
            check_fetch_member(conn, req.group_id, req.member_id, req.member_epoch)
            pending: set[TopicPartitionKey] = set()
            if req.require_stable:
                pending = {
                    (r.topic, r.partition)
                    for r in conn.execute(sql.PENDING_FOR_GROUP, {"group_id": req.group_id})
                }
            rows = conn.execute(sql.FETCH_COMMITTED, {"group_id": req.group_id}).all()
        found = {
            (r.topic, r.partition): OffsetAndMetadata(
                r.committed_offset, metadata_of_stored(r.metadata), r.committed_leader_epoch
            )
            for r in rows
            if wanted is None or (r.topic, r.partition) in wanted
        }
        if wanted is not None:
            for tp in wanted:
                found.setdefault(tp, OffsetAndMetadata(-1, None))
        unstable = {tp: KafkaError.UNSTABLE_OFFSET_COMMIT for tp in found if tp in pending}
        for tp in unstable:
            found[tp] = OffsetAndMetadata(-1, None)
        if unstable:
            return OffsetFetchResponse(
                KafkaError.UNSTABLE_OFFSET_COMMIT, found,
                f"transactional offsets pending for {sorted(unstable)}", unstable,
            )  # fmt: skip
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
