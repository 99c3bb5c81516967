"""Producer id allocation: an append-only table, so an id is never handed out twice.

Also what a partition asks before it takes a batch from a producer identity it has not
seen: was that (producer_id, producer_epoch) ever handed out? A forged identity (another
producer's id with a higher epoch) would otherwise fence the real producer's markers.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Connection

from app.errors import KafkaError, fail
from app.log import sql


def allocate_producer_id(conn: Connection, transactional_id: str | None, now_ms: int) -> int:
    """A fresh producer id; identity values are never reused, even after a rollback."""
    return int(
        conn.execute(
            sql.ALLOCATE_PRODUCER_ID, {"transactional_id": transactional_id, "now": now_ms}
        ).scalar_one()
    )


def issued_epochs(conn: Connection, producer_ids: Iterable[int]) -> dict[int, int]:
    """{producer_id: highest epoch handed out for it} for those of ``producer_ids`` that
    were ever allocated (-1: allocated, but its transactional id holds it no more); one
    statement for all of them."""
    wanted = sorted(set(producer_ids))
    if not wanted:
        return {}
    rows = conn.execute(sql.ISSUED_PRODUCER_EPOCHS, {"producer_ids": wanted})
    return {int(r.producer_id): int(r.issued_epoch) for r in rows}


def check_issued(producer_id: int, producer_epoch: int, issued: dict[int, int]) -> None:
    """Refuse an identity that was never handed out (``issued``: what ``issued_epochs``
    read). UNKNOWN_PRODUCER_ID: the broker knows no producer by that identity; the epoch is
    not stale (INVALID_PRODUCER_EPOCH) and no newer instance fenced the sender
    (PRODUCER_FENCED)."""
    epoch = issued.get(producer_id)
    if epoch is None:
        raise fail(KafkaError.UNKNOWN_PRODUCER_ID, f"producer id {producer_id} was never allocated")
    if producer_epoch > epoch:
        raise fail(
            KafkaError.UNKNOWN_PRODUCER_ID,
            f"epoch {producer_epoch} of producer id {producer_id} was never handed out"
            + (f" (its current epoch is {epoch})" if epoch >= 0 else ""),
        )
