"""The kip98 sink with real Spark: a write visible whole or not at all, each micro-batch
exactly once (a replayed batch writes nothing), a task killed after writing retried and
its first attempt fenced, a driver SIGKILLed between its tasks' writes and the batch
commit and restarted, a query killed three times mid-run; and bad input refused before
anything runs, leaving nothing written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException

from app.client.partitioner import murmur2_partition
from app.spark.sink import query_prefix
from tests.helpers.client_helpers import create_topics
from tests.helpers.spark_data import (
    committed,
    plain,
    sql_rows,
    transactional,
    wait_for,
    write_transaction,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ROOT = Path(__file__).resolve().parents[1]
CHILD = [sys.executable, "-m", "tests.children.spark_stream_child"]

pytestmark = pytest.mark.spark


def frame(spark: SparkSession, rows: list[tuple[Any, ...]], schema: str) -> DataFrame:
    return spark.createDataFrame(rows, schema)


def open_sink_transactions(db_url: str) -> list[tuple[Any, ...]]:
    return sql_rows(
        db_url,
        "SELECT transactional_id FROM transactions WHERE state <> 'COMPLETE_COMMIT' "
        "AND state <> 'COMPLETE_ABORT' AND state <> 'EMPTY' AND starts_with(transactional_id, 'kip98-spark-')",
    )


# ---------------------------------------------------------------- batch writes


def test_a_batch_write_is_visible_whole_with_every_column(spark: SparkSession, db_url: str) -> None:
    create_topics(db_url, {"out": 3, "other": 1})
    rows = [
        (
            f"k{i}",
            f"v{i}".encode(),
            "other" if i % 5 == 0 else "out",
            0 if i % 5 == 0 else i % 3,
            [("h", b"x")],
        )
        for i in range(40)
    ]
    df = frame(
        spark,
        rows,
        "key string, value binary, topic string, partition int, "
        "headers array<struct<key: string, value: binary>>",
    ).repartition(3)
    df.write.format("kip98").option("database.url", db_url).mode("append").save()
    got = sql_rows(
        db_url,
        "SELECT topic, partition, key, value, headers FROM committed_records ORDER BY value",
    )
    want = sorted((t, p, k.encode(), v) for k, v, t, p, _ in rows)
    assert sorted((t, p, bytes(k), bytes(v)) for t, p, k, v, _ in got) == want
    assert all(h == [{"key": "h", "value": "eA=="}] for *_, h in got)
    assert open_sink_transactions(db_url) == []


def test_rows_go_to_the_partitions_kafkas_producer_chooses(
    spark: SparkSession, db_url: str
) -> None:
    """A key's row on murmur2's partition (as every Kafka producer puts it), a row's own
    partition when it has one (a negative one is the partitioner's), keyless rows all
    written, each on a partition of the topic."""
    create_topics(db_url, {"keyed": 5})
    rows = [
        (
            None if i % 4 == 0 else f"key-{i}".encode(),
            f"v{i}".encode(),
            (i % 5) if i % 7 == 0 else (-1 if i % 11 == 0 else None),
        )
        for i in range(300)
    ]
    df = frame(spark, rows, "key binary, value binary, partition int").repartition(2)
    df.write.format("kip98").option("database.url", db_url).option("topic", "keyed").mode(
        "append"
    ).save()
    got = {
        bytes(v): p
        for p, v in sql_rows(
            db_url, "SELECT partition, value FROM committed_records WHERE topic = 'keyed'"
        )
    }
    assert len(got) == len(rows)
    for key, value, partition in rows:
        if partition is not None and partition >= 0:
            assert got[value] == partition
        elif key is not None:
            assert got[value] == murmur2_partition(key, 5)
        else:
            assert 0 <= got[value] < 5


def test_the_topic_option_overrides_the_column(spark: SparkSession, db_url: str) -> None:
    create_topics(db_url, {"out": 1, "elsewhere": 1})
    df = frame(spark, [("elsewhere", b"a"), (None, b"b")], "topic string, value binary")
    df.write.format("kip98").option("database.url", db_url).option("topic", "out").mode(
        "append"
    ).save()
    assert [r[0] for r in committed(db_url, ["out", "elsewhere"])] == ["out", "out"]


def test_a_missing_topic_is_created_as_a_kafka_producer_has_it(
    spark: SparkSession, db_url: str
) -> None:
    """The broker's one decision (KIP98_AUTO_CREATE_TOPICS, on here) for the ``topic``
    option and for a row's own topic alike, as Spark's Kafka sink's producer has them
    created."""
    df = frame(spark, [(b"a",)], "value binary")
    df.write.format("kip98").option("database.url", db_url).option("topic", "made").mode(
        "append"
    ).save()
    rows = frame(spark, [("made-by-row", b"b")], "topic string, value binary")
    rows.write.format("kip98").option("database.url", db_url).mode("append").save()
    found = committed(db_url, ["made", "made-by-row"])
    assert [(r[0], bytes(r[4])) for r in found] == [("made", b"a"), ("made-by-row", b"b")]


# ---------------------------------------------------------------- streaming writes


def checkpoint_batches(checkpoint: Path) -> dict[int, dict[str, Any]]:
    """Spark's offset log: batch id -> the source's end offset (Spark's Kafka JSON)."""
    out = {}
    for f in (checkpoint / "offsets").iterdir():
        if f.name.isdigit():
            out[int(f.name)] = json.loads(f.read_text().strip().splitlines()[-1])
    return out


def run_copy(spark: SparkSession, db_url: str, checkpoint: Path) -> None:
    source = (
        spark.readStream.format("kip98")
        .option("database.url", db_url)
        .option("subscribe", "orders")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "10")
        .load()
    )
    (
        source.selectExpr("key", "value", "partition")
        .writeStream.format("kip98")
        .option("database.url", db_url)
        .option("topic", "copied")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
        .awaitTermination()
    )


def test_each_micro_batch_once_and_a_replayed_batch_writes_nothing(
    spark: SparkSession, db_url: str, tmp_path: Path
) -> None:
    create_topics(db_url, {"orders": 2, "copied": 2})
    producer = transactional(db_url, "input")
    for n in range(3):
        write_transaction(producer, "orders", [b"in-%d-%d" % (n, i) for i in range(8)], 2)
    producer.close()
    checkpoint = tmp_path / "ck"
    run_copy(spark, db_url, checkpoint)
    values = lambda: sorted(bytes(r[4]) for r in committed(db_url, ["copied"]))  # noqa: E731
    want = sorted(bytes(r[4]) for r in committed(db_url, ["orders"]))
    assert values() == want
    batches = sql_rows(db_url, "SELECT batch_id, row_count FROM spark_sink_commits ORDER BY 1")
    assert len(batches) >= 3  # 24 offsets and markers, 10 offsets a trigger
    assert sum(n for _, n in batches) == len(want)

    # Spark replays a batch whose end its commit log does not record (a driver killed
    # after the sink committed): the sink finds the batch committed and writes nothing.
    last = max(checkpoint_batches(checkpoint))
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    run_copy(spark, db_url, checkpoint)
    assert values() == want
    assert sql_rows(db_url, "SELECT count(*) FROM spark_sink_commits")[0][0] == len(batches)
    assert open_sink_transactions(db_url) == []


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("options", "schema", "rows", "named"),
    [
        ({"topic": "out", "bogus": "1"}, "value binary", [(b"v",)], "bogus"),
        ({"topic": "out"}, "key binary", [(b"k",)], "value"),
        ({}, "value binary", [(b"v",)], "topic"),
        ({"topic": "bad name"}, "value binary", [(b"v",)], "bad name"),
        ({"topic": "out"}, "value binary, partition string", [(b"v", "x")], "partition"),
        ({"topic": "out"}, "value binary, headers array<string>", [(b"v", ["x"])], "headers"),
        (
            {"topic": "out", "transaction.timeout.ms": "soon"},
            "value binary",
            [(b"v",)],
            "transaction.timeout.ms",
        ),
    ],
)
def test_bad_sink_input_is_refused_before_anything_runs(
    spark: SparkSession,
    db_url: str,
    options: dict[str, str],
    schema: str,
    rows: list[tuple[Any, ...]],
    named: str,
) -> None:
    create_topics(db_url, {"out": 1})
    df = frame(spark, rows, schema)
    with pytest.raises((PySparkException, Py4JJavaError)) as info:
        df.write.format("kip98").option("database.url", db_url).options(**options).mode(
            "append"
        ).save()
    assert named in str(info.value)
    assert committed(db_url, ["out"]) == []
    assert sql_rows(db_url, "SELECT count(*) FROM transactions")[0][0] == 0


def test_a_row_without_a_topic_fails_the_write_and_nothing_is_visible(
    spark: SparkSession, db_url: str
) -> None:
    create_topics(db_url, {"out": 2})
    rows = [("out", b"%d" % i) for i in range(30)] + [(None, b"lost")]
    df = frame(spark, rows, "topic string, value binary").repartition(2)
    with pytest.raises((PySparkException, Py4JJavaError)) as info:
        df.write.format("kip98").option("database.url", db_url).mode("append").save()
    assert "no topic" in str(info.value)
    # Some tasks' transactions were written, none visible, none left open.
    assert committed(db_url, ["out"]) == []
    assert open_sink_transactions(db_url) == []
    assert (
        sql_rows(
            db_url,
            "SELECT count(*) FROM partition_status WHERE high_watermark <> last_stable_offset",
        )[0][0]
        == 0
    )


# ---------------------------------------------------------------- killed processes


def start_child(
    db_url: str, checkpoint: Path, mode: str, master: str = "local[2]", **env: str
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*CHILD, db_url, str(checkpoint), master, mode],
        cwd=ROOT,
        env={**os.environ, **env},
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def session_processes(sid: int) -> list[tuple[int, str]]:
    """(pid, state) of every process of session ``sid``: the driver, its JVM, and the
    Python workers (which leave the driver's process group, not its session)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) == sid:
            found.append((int(entry.name), fields[0]))
    return found


def kill_session(child: subprocess.Popen[bytes]) -> None:
    """SIGKILL the driver and everything it started, as a machine losing it would."""
    for pid, _ in session_processes(child.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    child.wait(timeout=60)
    wait_for(lambda: not session_processes(child.pid), "the killed driver's processes to go")


def sink_batches(db_url: str) -> int:
    return int(sql_rows(db_url, "SELECT count(*) FROM spark_sink_commits")[0][0])


def inputs(db_url: str, producer: Any, rounds: range) -> None:
    """Committed transactions with an aborted one between them, and plain records."""
    for n in rounds:
        write_transaction(producer, "orders", [b"o-%d-%d" % (n, i) for i in range(12)], 2)
        write_transaction(producer, "orders", [b"x-%d-%d" % (n, i) for i in range(4)], 2, "abort")
    plain(db_url, "orders", [b"p-%d" % rounds.start], 1)


# Hang guards only: four Spark drivers in turn, each starting a JVM, on a busy machine.
@pytest.mark.timeout(1800)
def test_a_query_killed_three_times_writes_every_input_exactly_once(
    db_url: str, tmp_path: Path
) -> None:
    create_topics(db_url, {"orders": 2, "enriched": 2})
    producer = transactional(db_url, "orders-writer")
    inputs(db_url, producer, range(0, 3))
    checkpoint = tmp_path / "ck"

    # 1: killed between its tasks' writes and the batch's commit (its commit stops there).
    child = start_child(db_url, checkpoint, "run", KIP98_STOP_AT="spark.sink.commit")
    try:
        wait_for(
            lambda: any(s == "T" for _, s in session_processes(child.pid)),
            "the first batch's commit to stop",
            timeout=600,
        )
        assert open_sink_transactions(db_url), "the tasks' transactions are open"
        assert committed(db_url, ["enriched"]) == []  # nothing of the batch visible
    finally:
        kill_session(child)

    # 2 and 3: killed mid-run, once a few more batches have committed.
    for more in (2, 3):
        inputs(db_url, producer, range(more * 10, more * 10 + 2))
        before = sink_batches(db_url)
        child = start_child(db_url, checkpoint, "run")
        try:
            wait_for(
                lambda: sink_batches(db_url) >= before + 2,  # noqa: B023 (called in the loop)
                "two more batches",
                timeout=600,
            )
        finally:
            kill_session(child)
    producer.close()

    # The restarted query drains what is left.
    child = start_child(db_url, checkpoint, "drain")
    assert child.wait(timeout=600) == 0

    want = Counter(bytes(r[4]) + b"!" for r in committed(db_url, ["orders"]))
    got = Counter(bytes(r[4]) for r in committed(db_url, ["enriched"]))
    assert got == want  # every input once: none lost, none twice, nothing aborted
    assert open_sink_transactions(db_url) == []

    # The source's checkpointed offsets agree with the sink's batches: each committed
    # batch wrote exactly the read_committed records between its offsets and the last.
    offsets = checkpoint_batches(checkpoint)
    previous: dict[tuple[str, int], int] = {}
    for batch_id, row_count in sql_rows(
        db_url, "SELECT batch_id, row_count FROM spark_sink_commits ORDER BY 1"
    ):
        end = {("orders", int(p)): o for p, o in offsets[batch_id]["orders"].items()}
        if batch_id - 1 in offsets:
            previous = {("orders", int(p)): o for p, o in offsets[batch_id - 1]["orders"].items()}
        in_range = [
            r
            for r in committed(db_url, ["orders"])
            if previous.get((r[0], r[1]), 0) <= r[2] < end[(r[0], r[1])]
        ]
        assert row_count == len(in_range), batch_id
    assert set(offsets) - {
        b for (b,) in sql_rows(db_url, "SELECT batch_id FROM spark_sink_commits")
    } <= {max(offsets)}


@pytest.mark.timeout(900)
def test_a_task_killed_after_writing_is_retried_and_its_first_attempt_fenced(
    db_url: str, tmp_path: Path
) -> None:
    create_topics(db_url, {"orders": 2, "enriched": 2})
    producer = transactional(db_url, "orders-writer")
    inputs(db_url, producer, range(0, 2))
    producer.close()
    once = tmp_path / "once"
    once.mkdir()
    child = start_child(
        db_url,
        tmp_path / "ck",
        "drain",
        master="local[2,2]",  # a failed task is tried again once
        KIP98_CRASH_AT="spark.sink.prepared",
        KIP98_CRASH_ONCE_DIR=str(once),
    )
    assert child.wait(timeout=600) == 0
    assert (once / "spark.sink.prepared").exists()  # one task attempt died, once
    want = Counter(bytes(r[4]) + b"!" for r in committed(db_url, ["orders"]))
    assert Counter(bytes(r[4]) for r in committed(db_url, ["enriched"])) == want
    fenced = sql_rows(
        db_url,
        "SELECT transactional_id FROM transaction_log WHERE reason = %(r)s",
        {"r": "InitProducerId: fenced the previous instance"},
    )
    assert len(fenced) == 1 and fenced[0][0].startswith("kip98-spark-sink-")
    assert open_sink_transactions(db_url) == []


def test_query_prefix_is_the_sink_ids_prefix() -> None:
    assert query_prefix("q") == "kip98-spark-sink-q-"


def test_the_demos_streaming_step_sees_every_order_once(spark: SparkSession, db_url: str) -> None:
    from app.cli.demo_streaming import streaming_step

    summary = streaming_step(spark, db_url)
    assert summary["Spark streaming: exactly once (consumer and views)"] is True
    assert summary["Spark streaming: orders enriched"] == 1000
