"""Shared helpers of the Spark data source tests: a log with committed, aborted, open and
plain records, and what read_committed readers return of it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg

from app.client import Producer
from app.storage.driver import libpq_conninfo

Row = tuple[Any, ...]


def sql_rows(db_url: str, query: str, params: dict[str, Any] | None = None) -> list[Row]:
    with psycopg.connect(libpq_conninfo(db_url)) as conn:
        return [tuple(r) for r in conn.execute(query, params or {}).fetchall()]


def committed(db_url: str, topics: list[str]) -> list[Row]:
    """What read_committed readers return of ``topics``: (topic, partition, offset, key,
    value), from the ``committed_records`` view."""
    return sql_rows(
        db_url,
        """SELECT topic, partition, "offset", key, value FROM committed_records
           WHERE topic = ANY(%(t)s) ORDER BY 1, 2, 3""",
        {"t": topics},
    )


def transactional(db_url: str, tid: str, timeout_ms: int = 60_000) -> Producer:
    p = Producer(
        {"database.url": db_url, "transactional.id": tid, "transaction.timeout.ms": timeout_ms}
    )
    p.init_transactions()
    return p


def write_transaction(
    producer: Producer, topic: str, values: list[bytes], partitions: int, end: str = "commit"
) -> None:
    """One transaction of ``values`` spread over the topic's partitions, then committed,
    aborted, or left open (``end``)."""
    producer.begin_transaction()
    for i, v in enumerate(values):
        producer.produce(
            topic, v, key=b"k%d" % i, partition=i % partitions, headers=[("h", v), ("n", None)]
        )
    if end == "commit":
        producer.commit_transaction()
    elif end == "abort":
        producer.flush()
        producer.abort_transaction()
    else:
        producer.flush()


def plain(db_url: str, topic: str, values: list[bytes], partition: int = 0) -> None:
    p = Producer({"database.url": db_url})
    try:
        for v in values:
            p.produce(topic, v, partition=partition)
        p.flush()
    finally:
        p.close()


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    """A hang guard only: the condition decides."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)
