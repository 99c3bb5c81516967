"""Leader epochs: Kafka's count of leaderships of a partition, and where each began.

A partition's epoch is ``partitions.leader_epoch``; ``partition_leader_epochs`` keeps each
epoch with the offset its leader began at (Kafka's leader-epoch cache). Every request
that answers with an epoch reads it from there: Metadata (``topics.metadata``), Fetch (a
client's ``current_leader_epoch`` checked, each batch stamped with the epoch it was
written in), ListOffsets and OffsetForLeaderEpoch. With one database every node serves
every partition from the same rows, so the epoch changes only when leadership moves (a
change of the live nodes, or a topic's growth, ``app.cluster.registrations``):
``bump_leader_epoch(s)`` is that one call (docs/design.md rule 40). The rules here are pure
but for the two functions that read or write the rows.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection

from app.errors import KafkaError, KafkaException, fail
from app.log import sql
from app.log.naming import could_exist
from app.protocol import (
    EpochEndOffset,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
    epoch_at,
)
from app.security import needs
from app.security.authorizer import authorize_all
from app.storage.context import BrokerContext

__all__ = ["bump_leader_epoch", "bump_leader_epochs", "current_epoch_refusal", "end_offset_for", "epoch_at",
           "leader_epoch_history", "offset_for_leader_epoch"]  # fmt: skip

# Kafka's UNDEFINED_EPOCH and UNDEFINED_EPOCH_OFFSET.
NO_EPOCH = -1
NO_OFFSET = -1


def current_epoch_refusal(requested: int, leader_epoch: int) -> KafkaException | None:
    """A request's ``current_leader_epoch`` against the partition's (KIP-320): none given
    (-1) passes; a newer one than the partition's is UNKNOWN_LEADER_EPOCH (this node has
    not seen that leadership yet), an older one FENCED_LEADER_EPOCH (the client's
    metadata is stale). Both are retriable: the client refreshes its metadata."""
    if requested < 0 or requested == leader_epoch:
        return None
    if requested > leader_epoch:
        return fail(
            KafkaError.UNKNOWN_LEADER_EPOCH,
            f"leader epoch {requested} is newer than the partition's {leader_epoch}",
        )
    return fail(
        KafkaError.FENCED_LEADER_EPOCH,
        f"leader epoch {requested} is older than the partition's {leader_epoch}",
    )


def end_offset_for(
    history: Sequence[tuple[int, int]], requested: int, log_end_offset: int
) -> tuple[int, int]:
    """Kafka's answer to OffsetForLeaderEpoch (LeaderEpochFileCache.endOffsetFor): the
    largest epoch at or below ``requested`` and the offset where the epoch after it began
    (the log end for the latest), or (NO_EPOCH, NO_OFFSET) for an epoch newer than any
    the partition had. ``history``: (epoch, start offset), ascending."""
    if requested < 0 or not history:
        return NO_EPOCH, NO_OFFSET
    latest = history[-1][0]
    if requested == latest:
        return requested, log_end_offset
    after = next(((e, start) for e, start in history if e > requested), None)
    if after is None:
        return NO_EPOCH, NO_OFFSET
    before = [e for e, _ in history if e <= requested]
    return (before[-1] if before else requested), after[1]


def leader_epoch_history(conn: Connection, topic: str, partition: int) -> list[tuple[int, int]]:
    rows = conn.execute(sql.LEADER_EPOCHS, {"topic": topic, "partition": partition})
    return [(r.leader_epoch, r.start_offset) for r in rows]


def bump_leader_epoch(conn: Connection, topic: str, partition: int) -> int:
    """A new leadership of the partition: its epoch one higher, beginning at the log end.
    Takes the partition lock (so no append is half-way: the new epoch's first record is
    the next one written), in the caller's DB transaction; returns the new epoch."""
    row = conn.execute(sql.BUMP_LEADER_EPOCH, {"topic": topic, "partition": partition}).first()
    if row is None:
        raise fail(KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} [{partition}] does not exist")
    epoch: int = row.leader_epoch
    return epoch


def bump_leader_epochs(conn: Connection, partitions: Sequence[tuple[str, int]]) -> int:
    """``bump_leader_epoch`` for each of ``partitions`` ((topic, partition)) in one
    statement, their locks taken in one order; those no longer there are skipped. How many
    were bumped."""
    if not partitions:
        return 0
    rows = conn.execute(
        sql.BUMP_LEADER_EPOCHS,
        {"topics": [t for t, _ in partitions], "partitions": [p for _, p in partitions]},
    ).all()
    return len(rows)


def offset_for_leader_epoch(
    broker: BrokerContext, req: OffsetForLeaderEpochRequest
) -> OffsetForLeaderEpochResponse:
    """Kafka's OffsetForLeaderEpoch for a consumer (KIP-320): per partition, where the
    epoch asked about ended (``end_offset_for``), after the client's current epoch is
    checked against the partition's. Needs Describe on the topic, as in Kafka."""
    results = []
    with broker.engine.connect() as conn:
        for q in req.partitions:
            try:
                authorize_all(conn, broker, needs.list_offsets(q.topic))
                part = None
                if could_exist(q.topic):
                    part = conn.execute(
                        sql.PARTITION_OFFSETS, {"topic": q.topic, "partition": q.partition}
                    ).first()
                if part is None:
                    raise fail(
                        KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
                        f"{q.topic} [{q.partition}] does not exist",
                    )
                if refused := current_epoch_refusal(q.current_leader_epoch, part.leader_epoch):
                    raise refused
                history = leader_epoch_history(conn, q.topic, q.partition)
                epoch, end = end_offset_for(history, q.leader_epoch, part.next_offset)
            except KafkaException as exc:
                results.append(
                    EpochEndOffset(
                        q.topic, q.partition, exc.error.code(), error_message=exc.error.str()
                    )
                )
                continue
            results.append(EpochEndOffset(q.topic, q.partition, KafkaError.NO_ERROR, epoch, end))
    return OffsetForLeaderEpochResponse(results)
