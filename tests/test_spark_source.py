"""The kip98 source with real Spark: a batch read returns exactly what read_committed
readers return (never an open or aborted transaction's record), in Spark's Kafka
columns; each option does what Spark's Kafka source does; a streaming query stops each
micro-batch at the LSO, keeps to maxOffsetsPerTrigger and picks up new topics; data
loss fails or is skipped as failOnDataLoss says; bad options fail before anything runs."""

from __future__ import annotations

import datetime
import json
from typing import TYPE_CHECKING, Any

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException

from app.admin import AdminClient, NewTopic
from app.broker import Broker
from app.cleaner.cleaner import clean, partitions_to_clean
from app.spark.offsets import OffsetRange
from app.spark.source import APPLICATION_NAME, ReadSettings, read_range, worker_connections
from tests.helpers.client_helpers import create_topics
from tests.helpers.spark_data import committed, plain, sql_rows, transactional, write_transaction

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark

Row = tuple[Any, ...]


def read(spark: SparkSession, db_url: str, **options: str) -> DataFrame:
    return spark.read.format("kip98").option("database.url", db_url).options(**options).load()


def rows_of(df: DataFrame) -> list[Row]:
    return sorted(
        (r.topic, r.partition, r.offset, None if r.key is None else bytes(r.key), bytes(r.value))
        for r in df.collect()
    )


@pytest.fixture
def log(db_url: str) -> Any:
    """``orders`` (3 partitions): committed and aborted transactions, plain records, and a
    transaction left open on every partition, with committed ones after it."""
    create_topics(db_url, {"orders": 3, "payments": 1})
    writer = transactional(db_url, "writer")
    write_transaction(writer, "orders", [b"c1-%d" % i for i in range(9)], 3)
    write_transaction(writer, "orders", [b"a1-%d" % i for i in range(6)], 3, "abort")
    plain(db_url, "orders", [b"plain-%d" % i for i in range(4)], 1)
    plain(db_url, "payments", [b"pay-%d" % i for i in range(3)])
    stuck = transactional(db_url, "stuck")
    write_transaction(stuck, "orders", [b"open-%d" % i for i in range(3)], 3, "open")
    write_transaction(writer, "orders", [b"c2-%d" % i for i in range(6)], 3)
    yield writer, stuck
    writer.close()
    stuck.close()


def test_a_batch_read_is_what_read_committed_readers_return(
    spark: SparkSession, db_url: str, log: Any
) -> None:
    df = read(spark, db_url, subscribe="orders")
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("key", "binary"), ("value", "binary"), ("topic", "string"), ("partition", "int"),
        ("offset", "bigint"), ("timestamp", "timestamp"), ("timestampType", "int"),
        ("headers", "array<struct<key:string,value:binary>>"),
    ]  # fmt: skip
    got = rows_of(df)
    assert got == committed(db_url, ["orders"])
    values = {v for *_, v in got}
    assert not any(v.startswith((b"a1-", b"open-", b"c2-")) for v in values)  # c2 is past the LSO
    first = df.where("value = cast('c1-0' AS binary)").collect()[0]
    assert [(h.key, None if h.value is None else bytes(h.value)) for h in first.headers] == [
        ("h", b"c1-0"),
        ("n", None),
    ]
    assert first.timestampType == 0
    ts = sql_rows(db_url, """SELECT "timestamp" FROM records WHERE value = 'c1-0'""")[0][0]
    assert first.timestamp == datetime.datetime.fromtimestamp(ts / 1000, datetime.UTC).replace(
        tzinfo=None
    )

    # The transaction ends: its records and those after it become visible, not before.
    _, stuck = log
    stuck.abort_transaction()
    after = {v for *_, v in rows_of(read(spark, db_url, subscribe="orders"))}
    assert {b"c2-%d" % i for i in range(6)} <= after and not any(
        v.startswith(b"open-") for v in after
    )


def test_read_uncommitted_reads_up_to_the_high_watermark(
    spark: SparkSession, db_url: str, log: Any
) -> None:
    got = rows_of(
        read(spark, db_url, subscribe="orders", **{"isolation.level": "read_uncommitted"})
    )
    want = sql_rows(
        db_url,
        """SELECT topic, partition, "offset", key, value FROM records
           WHERE topic = 'orders' AND NOT is_control ORDER BY 1, 2, 3""",
    )
    assert got == want  # aborted and open records too, never a marker


def test_assign_pattern_offsets_timestamp_and_min_partitions(
    spark: SparkSession, db_url: str, log: Any
) -> None:
    visible = committed(db_url, ["orders", "payments"])
    assigned = rows_of(read(spark, db_url, assign='{"orders": [1], "payments": [0]}'))
    assert assigned == [r for r in visible if (r[0], r[1]) in {("orders", 1), ("payments", 0)}]
    assert rows_of(read(spark, db_url, subscribePattern="pay.*")) == [
        r for r in visible if r[0] == "payments"
    ]
    ranged = rows_of(
        read(
            spark, db_url, subscribe="payments",
            startingOffsets='{"payments": {"0": 1}}', endingOffsets='{"payments": {"0": 2}}',
        )
    )  # fmt: skip
    assert [r[2] for r in ranged] == [1]
    # startingTimestamp: from the first record at or after it, per partition.
    ts = sql_rows(db_url, """SELECT "timestamp" FROM records WHERE value = 'pay-2'""")[0][0]
    first = sql_rows(
        db_url,
        """SELECT min("offset") FROM records WHERE topic = 'payments' AND "timestamp" >= %(ts)s""",
        {"ts": ts},
    )[0][0]
    since = rows_of(read(spark, db_url, subscribe="payments", startingTimestamp=str(ts)))
    assert since == [r for r in visible if r[0] == "payments" and r[2] >= first]
    assert since[-1][4] == b"pay-2"
    df = read(spark, db_url, subscribe="orders", minPartitions="7")
    assert df.rdd.getNumPartitions() >= 7
    assert rows_of(df) == [r for r in visible if r[0] == "orders"]


def test_data_loss_fails_or_is_skipped_as_failondataloss_says(
    spark: SparkSession, db_url: str
) -> None:
    admin = AdminClient({"database.url": db_url})
    admin.create_topics([NewTopic("lossy", 1, config={"retention.ms": "1000"})])["lossy"].result()
    admin.close()
    for i in range(5):
        plain(db_url, "lossy", [b"old-%d" % i])
    broker = Broker.connect()
    clean(broker, partitions_to_clean(broker, "lossy"), now_ms=broker.clock.now_ms() + 3_600_000)
    broker.engine.dispose()
    plain(db_url, "lossy", [b"new"])
    log_start = sql_rows(db_url, "SELECT log_start_offset FROM partitions WHERE topic = 'lossy'")
    assert log_start[0][0] > 0
    start = '{"lossy": {"0": 0}}'
    with pytest.raises((PySparkException, Py4JJavaError), match="failOnDataLoss"):
        read(spark, db_url, subscribe="lossy", startingOffsets=start).collect()
    skipped = rows_of(
        read(spark, db_url, subscribe="lossy", startingOffsets=start, failOnDataLoss="false")
    )
    assert [r[4] for r in skipped] == [v for *_, v in committed(db_url, ["lossy"])]


def test_a_stream_stops_at_the_lso_keeps_to_its_limit_and_finds_new_topics(
    spark: SparkSession, db_url: str, log: Any
) -> None:
    stream = (
        spark.readStream.format("kip98")
        .option("database.url", db_url)
        .option("subscribePattern", "orders.*")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "4")
        .load()
    )
    query = stream.writeStream.format("memory").queryName("kip98_stream").start()
    try:
        query.processAllAvailable()
        seen = lambda: rows_of(spark.table("kip98_stream"))  # noqa: E731
        assert seen() == committed(db_url, ["orders"])  # up to the LSO, nothing open
        for p in query.recentProgress:
            if p["numInputRows"]:
                source = p["sources"][0]
                start, end = (
                    json.loads(o) if isinstance(o, str) else o
                    for o in (source["startOffset"], source["endOffset"])
                )
                moved = sum(
                    end["orders"][k] - (start or {}).get("orders", {}).get(k, 0)
                    for k in end["orders"]
                )
                assert moved <= 4 + 3  # the limit, each partition's share rounded up once

        writer, stuck = log
        stuck.commit_transaction()
        create_topics(db_url, {"orders-eu": 2})
        write_transaction(writer, "orders-eu", [b"eu-%d" % i for i in range(4)], 2)
        query.processAllAvailable()
        assert seen() == committed(db_url, ["orders", "orders-eu"])
    finally:
        query.stop()


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"subscribe": "orders", "kafka.bootstrap.servers": "x:9092"}, "kafka.bootstrap.servers"),
        ({}, "subscribe"),
        ({"subscribe": "orders", "assign": '{"orders": [0]}'}, "subscribe"),
        ({"subscribe": "nowhere"}, "nowhere"),
        ({"assign": '{"orders": [9]}'}, "orders-9"),
        ({"subscribe": "orders", "isolation.level": "dirty"}, "isolation.level"),
        ({"subscribe": "orders", "startingOffsets": '{"orders": {"0": '}, "startingOffsets"),
    ],
)
def test_bad_source_options_fail_before_anything_runs(
    spark: SparkSession, db_url: str, options: dict[str, str], named: str
) -> None:
    create_topics(db_url, {"orders": 1})
    with pytest.raises((PySparkException, Py4JJavaError)) as info:
        read(spark, db_url, **options).collect()
    assert named.lower() in str(info.value).lower()
    with pytest.raises((PySparkException, Py4JJavaError)) as info:
        query = (
            spark.readStream.format("kip98").option("database.url", db_url).options(**options)
            .load().writeStream.format("memory").queryName("never").start()
        )  # fmt: skip
        try:
            query.processAllAvailable()
        finally:
            query.stop()
    assert named.lower() in str(info.value).lower()


def test_a_workers_kept_connections_are_replaced_when_the_server_drops_them(
    db_url: str,
) -> None:
    """A Python worker keeps its connections from one range to the next; ended by the
    server in between (a restart, a failover, an administrator), they are made again and
    the next range reads whole, instead of failing its task."""
    create_topics(db_url, {"kept": 1})
    plain(db_url, "kept", [b"v%d" % i for i in range(30)])
    settings = ReadSettings(db_url, read_committed=True, fail_on_data_loss=True)

    def values(start: int, end: int) -> list[bytes]:
        r = OffsetRange("kept", 0, start, end)
        return [v for batch in read_range(settings, r) for v in batch.column("value").to_pylist()]

    assert values(0, 10) == [b"v%d" % i for i in range(10)]
    first = worker_connections(db_url)
    assert values(10, 20) == [b"v%d" % i for i in range(10, 20)]
    assert worker_connections(db_url) is first  # kept, not made again
    ended = sql_rows(
        db_url,
        "SELECT pg_terminate_backend(pid, 30000) FROM pg_stat_activity WHERE application_name = %(a)s",
        {"a": APPLICATION_NAME},
    )
    assert len(ended) == 2
    assert values(20, 30) == [b"v%d" % i for i in range(20, 30)]
    assert worker_connections(db_url) is not first
