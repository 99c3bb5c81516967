"""The final state of the log, taken from the database once the run is quiet, and the
liveness probe: a fresh read_committed consumer that must reach the end in time."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Engine, text

from app.client import OFFSET_BEGINNING, Consumer, TopicPartition

PARTITIONS_SQL = text(
    """SELECT topic, partition, log_start_offset, next_offset, last_stable_offset
       FROM partitions WHERE topic = ANY(:topics) ORDER BY topic, partition"""
)
COMMITTED_SQL = text(
    """SELECT topic, partition, "offset", convert_from(value, 'UTF8') AS value
       FROM committed_records WHERE topic = ANY(:topics)
       ORDER BY topic, partition, "offset\""""
)
OFFSET_STATS_SQL = text(
    """SELECT topic, partition, count(*) AS rows, count(DISTINCT "offset") AS distinct,
              min("offset") AS min, max("offset") AS max
       FROM records WHERE topic = ANY(:topics) GROUP BY topic, partition"""
)
ABORTED_SQL = text(
    """SELECT topic, partition, producer_id, first_offset, last_offset, last_stable_offset
       FROM aborted_txns WHERE topic = ANY(:topics) ORDER BY topic, partition, first_offset"""
)
GROUP_OFFSETS_SQL = text(
    "SELECT group_id, topic, partition, committed_offset FROM group_offsets ORDER BY 1, 2, 3"
)
PENDING_SQL = text("SELECT count(*) FROM pending_txn_offsets")


def partition_bounds(engine: Engine, topics: list[str]) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(PARTITIONS_SQL, {"topics": topics})]


def group_offsets(engine: Engine) -> dict[str, list[list[Any]]]:
    found: dict[str, list[list[Any]]] = {}
    with engine.connect() as conn:
        for g, t, p, o in conn.execute(GROUP_OFFSETS_SQL):
            found.setdefault(g, []).append([t, int(p), int(o)])
    return found


def dump_log(engine: Engine, topics: list[str], copy: dict[str, Any]) -> dict[str, Any]:
    committed: dict[str, dict[str, list[list[Any]]]] = {t: {} for t in topics}
    with engine.connect() as conn:
        for t, p, o, v in conn.execute(COMMITTED_SQL, {"topics": topics}):
            committed[t].setdefault(str(p), []).append([int(o), v])
        offset_stats = [
            {k: int(v) if k != "topic" else v for k, v in r._mapping.items()}
            for r in conn.execute(OFFSET_STATS_SQL, {"topics": topics})
        ]
        aborted = [list(r) for r in conn.execute(ABORTED_SQL, {"topics": topics})]
        pending = int(conn.execute(PENDING_SQL).scalar_one())
    return {
        "partitions": partition_bounds(engine, topics),
        "committed": committed,
        "offset_stats": offset_stats,
        "aborted_txns": aborted,
        "group_offsets": group_offsets(engine),
        "pending_txn_offsets": pending,
        "copy": copy,
    }


def final_read(
    url: str, engine: Engine, topics: list[str], partitions: int, deadline_s: float
) -> dict[str, Any]:
    """Read every partition from the beginning with read_committed until each position
    reaches the partition's last stable offset (LSO = high watermark once quiet)."""
    ends = {
        (b["topic"], b["partition"]): b["last_stable_offset"]
        for b in partition_bounds(engine, topics)
    }
    started = time.monotonic()
    records: list[list[Any]] = []
    tps = [TopicPartition(t, p, OFFSET_BEGINNING) for t in topics for p in range(partitions)]
    with Consumer(
        {"database.url": url, "client.id": "torture-final", "isolation.level": "read_committed"}
    ) as consumer:
        consumer.assign(tps)
        while time.monotonic() - started < deadline_s:
            for m in consumer.consume(500, timeout=0.5):
                if m.error() is None:
                    raw = m.value()
                    records.append(
                        [
                            m.topic(),
                            m.partition(),
                            m.offset(),
                            None if raw is None else raw.decode(),
                        ]
                    )
            positions = consumer.position([TopicPartition(t, p) for t, p in ends])
            if all(tp.offset >= ends[(tp.topic, tp.partition)] for tp in positions):
                return {"complete": True, "seconds": time.monotonic() - started, "records": records}
    return {"complete": False, "seconds": time.monotonic() - started, "records": records}
