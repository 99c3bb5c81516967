"""The demo's streaming step: transactional producers write ``demo-orders`` (one of their
transactions aborted), a Spark streaming query reads it read_committed through the
``kip98`` source, enriches each order, and writes ``demo-orders-enriched`` through the
exactly-once sink; then a read_committed consumer and the SQL views must each see every
committed order exactly once, and no aborted one."""

from __future__ import annotations

import shutil
import time
from collections import Counter
from typing import TYPE_CHECKING

from sqlalchemy import text

from app.admin import AdminClient, NewTopic
from app.client import Consumer, Producer
from app.storage.embedded import kip98_home
from app.storage.engine import get_engine

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ORDERS, ENRICHED = "demo-orders", "demo-orders-enriched"
PARTITIONS = 4
TRANSACTIONS, PER_TRANSACTION = 20, 50


def _topics(url: str) -> None:
    admin = AdminClient({"database.url": url})
    try:
        existing = admin.list_topics().topics
        for name in (ORDERS, ENRICHED):
            if name in existing:
                admin.delete_topics([name])[name].result()
            admin.create_topics([NewTopic(name, PARTITIONS)])[name].result()
    finally:
        admin.close()


def _orders(url: str) -> int:
    """Two transactional producers' orders; one transaction aborted. Returns the
    committed orders."""
    writers = [
        Producer({"database.url": url, "transactional.id": f"demo-orders-{i}"}) for i in range(2)
    ]
    try:
        for w in writers:
            w.init_transactions()
        for t in range(TRANSACTIONS):
            w = writers[t % 2]
            w.begin_transaction()
            for i in range(PER_TRANSACTION):
                w.produce(ORDERS, b"order %d-%d" % (t, i), key=b"customer-%d" % (i % 7))
            w.commit_transaction()
        writers[0].begin_transaction()
        for p in range(PARTITIONS):
            writers[0].produce(ORDERS, b"ABORTED", partition=p)
        writers[0].abort_transaction()
    finally:
        for w in writers:
            w.close()
    return TRANSACTIONS * PER_TRANSACTION


def _enrich(spark: SparkSession, url: str) -> tuple[str, float]:
    """Run the query until it has read everything committed; its id and seconds."""
    checkpoint = kip98_home() / "demo-streaming-checkpoint"
    shutil.rmtree(checkpoint, ignore_errors=True)  # the topics are new: so is the query
    started = time.monotonic()
    query = (
        spark.readStream.format("kip98")
        .option("database.url", url)
        .option("subscribe", ORDERS)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr(
            "key",
            "concat(upper(cast(value AS string)), ' (customer ', cast(key AS string), ')') "
            "AS value",
        )
        .writeStream.format("kip98")
        .option("database.url", url)
        .option("topic", ENRICHED)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return str(query.id), time.monotonic() - started


def _consumed(url: str, expected: int) -> Counter[bytes]:
    """What a read_committed consumer reads of the output (until it has ``expected`` or
    stays idle a few seconds)."""
    seen: Counter[bytes] = Counter()
    with Consumer(
        {"database.url": url, "group.id": "demo-enriched-reader", "auto.offset.reset": "earliest"}
    ) as consumer:
        consumer.subscribe([ENRICHED])
        idle_until = time.monotonic() + 10
        while sum(seen.values()) < expected and time.monotonic() < idle_until:
            for msg in consumer.consume(500, timeout=0.5):
                value = msg.value()
                if msg.error() is None and value is not None:
                    seen[value] += 1
                    idle_until = time.monotonic() + 10
    return seen


def streaming_step(spark: SparkSession, url: str) -> dict[str, object]:
    _topics(url)
    committed = _orders(url)
    query_id, elapsed = _enrich(spark, url)
    consumed = _consumed(url, committed)
    with get_engine(url).connect() as conn:
        view = conn.execute(
            text("SELECT count(*), count(DISTINCT value) FROM committed_records WHERE topic = :t"),
            {"t": ENRICHED},
        ).one()
        batches = conn.execute(
            text("SELECT count(*) FROM spark_sink_commits WHERE query_id = :q"), {"q": query_id}
        ).scalar_one()
    once = (
        len(consumed) == committed
        and set(consumed.values()) == {1}
        and not any(b"ABORTED" in v for v in consumed)
        and tuple(view) == (committed, committed)
    )
    return {
        "Spark streaming: orders enriched": sum(consumed.values()),
        "Spark streaming: micro-batches committed": batches,
        "Spark streaming: seconds": f"{elapsed:.1f}",
        "Spark streaming: exactly once (consumer and views)": once,
    }
