"""The Spark materialisation against real PostgreSQL: it holds exactly what read_committed
readers return up to the captured LSO, re-runs add only new rows, open transactions wait
for their outcome, and a run killed anywhere converges on the next run."""

from __future__ import annotations

import importlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import text

from app.broker import Broker
from app.broker.produce import produce
from app.client.consumer import Consumer
from app.client.message import TopicPartition, decode_headers, encode_headers
from app.errors import KafkaError
from app.log.fetch import fetch
from app.log.topics import create_topic, delete_topic
from app.protocol import READ_COMMITTED, FetchRequest, ProduceRequest, RecordIn
from app.spark import materialize
from app.spark import sql as spark_sql
from app.spark.compact import compact, plan
from app.spark.materialize import (
    PartitionBounds,
    RunTable,
    _commit,
    capture,
    run_materialization,
    slices,
)
from app.spark.partitions import Registered, wait_for_older_snapshots, work_engine
from tests.helpers.backends import ActiveHolder
from tests.helpers.cli_runner import run_kip98
from tests.helpers.txn_driver import TxnDriver

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROOT = Path(__file__).resolve().parents[1]
# The module (the package exports its function under the same name).
MATERIALIZE = importlib.import_module("app.spark.materialize")
TOPICS = {"orders": 3, "payments": 2}
Row = tuple[Any, ...]
COLUMNS = 'topic, partition, "offset", key, value, headers, "timestamp", producer_id'

pytestmark = pytest.mark.broker(topics=TOPICS)


# ---------------------------------------------------------------- workload and readers


def plain(broker: Broker, topic: str, partition: int, n: int, rng: random.Random) -> None:
    records = [
        RecordIn(
            None if rng.random() < 0.3 else f"k{rng.randrange(50)}".encode(),
            None if rng.random() < 0.05 else rng.randbytes(rng.randrange(1, 40)),
            0,
            encode_headers([("h", rng.randbytes(3)), ("empty", None)])
            if rng.random() < 0.3
            else None,
        )
        for _ in range(n)
    ]
    assert produce(broker, ProduceRequest(topic, partition, records)).error_code == 0


def workload(broker: Broker, rng: random.Random, rounds: int, drivers: list[TxnDriver]) -> None:
    """Interleaved transactions (committed and aborted, several partitions each) and plain
    batches; every driver's transaction is ended before returning."""
    targets = [(t, p) for t, n in TOPICS.items() for p in range(n)]
    for step in range(rounds):
        for d in drivers:
            for topic, partition in rng.sample(targets, rng.randint(1, 3)):
                values = [f"{d.transactional_id}-{step}-{i}" for i in range(rng.randint(1, 30))]
                assert d.send(topic, partition, *values).error_code == 0
            topic, partition = rng.choice(targets)
            plain(broker, topic, partition, rng.randint(1, 40), rng)
        for d in drivers:
            assert d.end(commit=rng.random() < 0.6) == 0


def drivers_for(broker: Broker, *names: str) -> list[TxnDriver]:
    out = [TxnDriver(broker, name) for name in names]
    for d in out:
        assert d.init() == 0
    return out


def fetch_committed(broker: Broker, topic: str, partition: int, start: int, end: int) -> list[Row]:
    """What the read_committed Fetch path returns from ``start``, up to ``end``."""
    rows: list[Row] = []
    offset = start
    while offset < end:
        r = fetch(broker, FetchRequest(topic, partition, offset, isolation_level=READ_COMMITTED))
        assert r.error_code == 0, r
        for offset, timestamp, key, value, headers, producer_id in r.records:
            if offset < end:
                # Fetch leaves headers as stored JSON text; the table's column reads as JSON.
                stored = None if headers is None else json.loads(headers)
                rows.append(
                    (topic, partition, offset, key, value, stored, timestamp, producer_id)
                )  # fmt: skip
        if r.next_offset == offset:
            break
        offset = r.next_offset
    return rows


def consumed(db_url: str, bounds: list[PartitionBounds]) -> list[Row]:
    """What a read_committed Consumer returns from each log start until it is at the end
    of every partition (the test stops traffic first, so that is the LSO)."""
    out: list[Row] = []
    config = {
        "database.url": db_url,
        "isolation.level": "read_committed",
        "enable.partition.eof": True,
    }
    with Consumer(config) as consumer:
        consumer.assign([TopicPartition(b.topic, b.partition, b.log_start) for b in bounds])
        at_end: set[tuple[str, int]] = set()
        deadline = time.monotonic() + 300
        while at_end != {(b.topic, b.partition) for b in bounds}:  # read to each one's end
            assert time.monotonic() < deadline, f"no end of {at_end}"
            for m in consumer.consume(500, timeout=0.5):
                err = m.error()
                if err is not None:
                    assert err.code() == KafkaError._PARTITION_EOF, err
                    at_end.add((m.topic() or "", m.partition() or 0))
                    continue
                out.append(
                    (m.topic(), m.partition(), m.offset(), m.key(), m.value(), m.headers(),
                     m.timestamp()[1])
                )  # fmt: skip
    return sorted(out, key=lambda r: (r[0], r[1], r[2]))


def as_consumed(rows: list[Row]) -> list[Row]:
    """Materialised rows in the shape a Consumer's messages take (headers decoded)."""
    return [(*r[:5], decode_headers(r[5]) or None, r[6]) for r in rows]


def expected(broker: Broker, bounds: list[PartitionBounds]) -> list[Row]:
    out: list[Row] = []
    for b in bounds:
        out.extend(fetch_committed(broker, b.topic, b.partition, b.log_start, b.lso))
    return sorted(out, key=lambda r: (r[0], r[1], r[2]))


def table(broker: Broker, name: str = "read_committed_records") -> list[Row]:
    with broker.engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                text(
                    'SELECT topic, partition, "offset", key, value, headers, "timestamp", '
                    f'producer_id FROM {name} ORDER BY topic, partition, "offset"'
                )
            )
        ]


def progress(broker: Broker) -> dict[tuple[str, int], int]:
    with broker.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT topic, partition, up_to_offset FROM materialization_progress")
        )
        return {(t, p): o for t, p, o in rows}


def lsos(broker: Broker) -> dict[tuple[str, int], int]:
    return {(b.topic, b.partition): b.lso for b in capture(broker.engine)}


def leftover_tables(broker: Broker) -> list[str]:
    with broker.engine.connect() as conn:
        return [r[0] for r in conn.execute(spark_sql.LEFTOVER_TABLES)]


def attached(broker: Broker) -> dict[str, tuple[str, int, int, int]]:
    """Partitions of read_committed_records as the catalog has them, each with the bound
    its registry row states, after checking the two agree and each partition's rows lie
    within its bound."""
    with broker.engine.connect() as conn:
        in_catalog = {
            r[0]
            for r in conn.execute(
                text(
                    "SELECT CAST(inhrelid AS regclass)::text FROM pg_inherits "
                    "WHERE inhparent = CAST('read_committed_records' AS regclass)"
                )
            )
        }
        registry = {
            r[0]: tuple(r[1:5]) for r in conn.execute(spark_sql.REGISTERED)
        }  # fmt: skip
        for name, (topic, partition, start, end) in registry.items():
            outside = conn.execute(
                text(
                    f"SELECT count(*) FROM {name} WHERE NOT (topic = :t AND partition = :p "
                    'AND "offset" >= :s AND "offset" < :e)'
                ),
                {"t": topic, "p": partition, "s": start, "e": end},
            ).scalar_one()
            assert outside == 0
    assert in_catalog == set(registry)
    return registry  # type: ignore[return-value]


# ---------------------------------------------------------------- without Spark


def test_slices_cover_each_captured_range_exactly() -> None:
    pending = [
        PartitionBounds("a", 0, 0, 45_000, None),
        PartitionBounds("b", 1, 10, 100, 50),
    ]
    predicates = slices(pending, parallelism=2)
    assert predicates == [
        """topic = 'a' AND partition = 0 AND "offset" >= 0 AND "offset" < 20000""",
        """topic = 'a' AND partition = 0 AND "offset" >= 20000 AND "offset" < 40000""",
        """topic = 'a' AND partition = 0 AND "offset" >= 40000 AND "offset" < 45000""",
        """topic = 'b' AND partition = 1 AND "offset" >= 50 AND "offset" < 100""",
    ]


def test_start_never_leaves_the_log() -> None:
    assert PartitionBounds("a", 0, 5, 9, None).start == 5
    assert PartitionBounds("a", 0, 5, 9, 7).start == 7
    assert PartitionBounds("a", 0, 5, 9, 2).start == 5  # retention passed the progress
    assert PartitionBounds("a", 0, 5, 9, 12).start == 9


def test_table_names_are_checked() -> None:
    with pytest.raises(ValueError):
        spark_sql.drop_work("records; DROP TABLE records")
    with pytest.raises(ValueError):
        spark_sql.drop_child("read_committed_records")
    with pytest.raises(ValueError):
        spark_sql.drop_work(f"rc_run_{'ab' * 16}_0")  # a partition, never dropped as a run's
    assert spark_sql.literal("o'brien") == "'o''brien'"


def sql_run(broker: Broker, topics: list[str] | None = None) -> dict[tuple[str, int], int]:
    """A run as the materialisation makes one, with PostgreSQL writing the run's table from
    ``committed_records`` where Spark would: for tests of what happens around the write."""
    bounds = capture(broker.engine, topics)
    pending = [b for b in bounds if b.start < b.lso]
    run = RunTable.new(pending)
    with broker.engine.begin() as conn:
        conn.execute(text(spark_sql.create_run_table(run.name)))
        for b in pending:
            child = run.children[(b.topic, b.partition)]
            conn.execute(
                text(
                    spark_sql.create_run_child(
                        run.name, child, b.topic, b.partition, b.start, b.lso
                    )
                )
            )
            conn.execute(
                text(
                    f"INSERT INTO {run.name} SELECT {COLUMNS} FROM committed_records "
                    'WHERE topic = :t AND partition = :p AND "offset" >= :s AND "offset" < :e'
                ),
                {"t": b.topic, "p": b.partition, "s": b.start, "e": b.lso},
            )
        written = {(t, p): n for t, p, n in conn.execute(text(spark_sql.count_run(run.name)))}
    return _commit(broker.engine, run, bounds, written)


def test_a_run_overtaken_by_another_leaves_those_partitions_to_it(broker: Broker) -> None:
    """Two runs captured the same progress; the first to commit materialises a partition,
    the second then finds its progress moved and attaches nothing there (its range would
    overlap rows already in), while its other partitions attach as usual."""
    rng = random.Random(23)
    plain(broker, "orders", 0, 20, rng)
    plain(broker, "payments", 1, 7, rng)
    bounds = capture(broker.engine)
    pending = [b for b in bounds if b.start < b.lso]
    late = RunTable.new(pending)
    with broker.engine.begin() as conn:
        conn.execute(text(spark_sql.create_run_table(late.name)))
        for b in pending:
            child = late.children[(b.topic, b.partition)]
            conn.execute(
                text(
                    spark_sql.create_run_child(
                        late.name, child, b.topic, b.partition, b.start, b.lso
                    )
                )
            )
        conn.execute(text(f"INSERT INTO {late.name} SELECT {COLUMNS} FROM committed_records"))

    assert sql_run(broker, ["orders"]) == {("orders", 0): 20}
    counts = _commit(broker.engine, late, bounds, {("orders", 0): 20, ("payments", 1): 7})

    assert counts == {("payments", 1): 7}
    assert table(broker) == table(broker, "committed_records")
    assert sorted(attached(broker).values()) == [("orders", 0, 0, 20), ("payments", 1, 0, 7)]
    assert progress(broker) == {(b.topic, b.partition): b.lso for b in bounds}
    assert leftover_tables(broker) == []


def test_compaction_merges_small_partitions_and_keeps_every_row(broker: Broker) -> None:
    rng = random.Random(31)
    drivers = drivers_for(broker, "c1", "c2")
    for _ in range(6):
        workload(broker, rng, rounds=1, drivers=drivers)
        sql_run(broker)
    before = table(broker)
    parts = attached(broker)
    assert len(parts) > 10

    merges = compact(broker.engine.url.render_as_string(hide_password=False), small_rows=100_000)

    after = attached(broker)
    assert table(broker) == before == table(broker, "committed_records")
    assert sum(len(m.parts) for m in merges) - len(merges) == len(parts) - len(after)
    # One partition per topic partition is left, covering what its old ones covered.
    by_partition: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for topic, partition, start, end in parts.values():
        by_partition.setdefault((topic, partition), []).append((start, end))
    assert sorted(after.values()) == sorted(
        (t, p, min(s for s, _ in spans), max(e for _, e in spans))
        for (t, p), spans in by_partition.items()
    )
    assert leftover_tables(broker) == []
    # Runs go on from the progress, next to the merged partitions.
    workload(broker, rng, rounds=1, drivers=drivers)
    sql_run(broker)
    assert table(broker) == table(broker, "committed_records")
    attached(broker)


def test_compaction_plan_groups_consecutive_small_partitions() -> None:
    def part(name: str, topic: str, start: int, end: int, rows: int) -> Registered:
        return Registered(name, topic, 0, start, end, rows)

    parts = [
        part("a1", "a", 0, 10, 10),
        part("a2", "a", 10, 20, 10),
        part("a3", "a", 20, 500, 480),  # large: not merged, and it separates its neighbours
        part("a4", "a", 500, 510, 10),
        part("b1", "b", 0, 10, 10),
        part("b2", "b", 12, 20, 8),
        part("b3", "b", 20, 30, 10),
        part("b4", "b", 30, 40, 10),
    ]
    merges = plan(parts, small_rows=25)
    assert [[p.table_name for p in m.parts] for m in merges] == [
        ["a1", "a2"],
        ["b1", "b2", "b3"],  # closed at 28 rows
    ]
    assert (merges[1].from_offset, merges[1].to_offset, merges[1].rows) == (0, 30, 28)


def _killed_at(crash_at: str, code: str, timeout: float) -> None:
    """Run ``code`` in a child process that the crash point ``crash_at`` SIGKILLs."""
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "KIP98_CRASH_AT": crash_at, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == -9, result.stderr[-3000:]


def _compact_killed(crash_at: str) -> None:
    code = (
        "import os\n"
        "from app.spark.compact import compact\n"
        "compact(os.environ['KIP98_DATABASE_URL'], small_rows=100_000)\n"
    )
    _killed_at(crash_at, code, 120)


@pytest.mark.parametrize("crash_at", ["spark.compact.copied", "spark.compact.swap"])
def test_killed_compaction_leaves_partitions_as_before_and_next_one_converges(
    broker: Broker, crash_at: str
) -> None:
    rng = random.Random(crash_at)
    for _ in range(3):
        plain(broker, "orders", 0, 15, rng)
        plain(broker, "payments", 1, 15, rng)
        sql_run(broker)
    before_rows, before_parts = table(broker), attached(broker)

    _compact_killed(crash_at)
    _wait_for_sessions_to_end(broker)
    assert table(broker) == before_rows
    assert attached(broker) == before_parts
    assert len(leftover_tables(broker)) == 1

    merges = compact(broker.engine.url.render_as_string(hide_password=False), small_rows=100_000)
    assert len(merges) == 2
    assert table(broker) == before_rows
    assert sorted(attached(broker).values()) == [("orders", 0, 0, 45), ("payments", 1, 0, 45)]
    assert leftover_tables(broker) == []


def test_kip98_spark_compact_lists_its_merges(broker: Broker) -> None:
    rng = random.Random(5)
    for _ in range(3):
        plain(broker, "orders", 0, 10, rng)
        sql_run(broker)
    before = table(broker)
    url = broker.engine.url.render_as_string(hide_password=False)
    env = {"KIP98_DATABASE_URL": url}

    result = run_kip98("spark", "compact", "--small-rows", "1000", "--output", "json", env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [
        {
            "topic": "orders",
            "partition": 0,
            "from_offset": 0,
            "to_offset": 30,
            "merged_partitions": 3,
        }
    ]
    assert table(broker) == before
    assert sorted(attached(broker).values()) == [("orders", 0, 0, 30)]
    # Nothing left to merge: an empty listing, still a success.
    again = run_kip98("spark", "compact", "--output", "json", env=env)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == []
    refused = run_kip98("spark", "compact", "--small-rows", "0", env=env)
    assert refused.returncode != 0
    assert "small-rows" in refused.stderr


# ---------------------------------------------------------------- with Spark


@pytest.mark.spark
def test_materialised_rows_equal_read_committed(
    spark: SparkSession, db_url: str, broker: Broker
) -> None:
    rng = random.Random(98)
    drivers = drivers_for(broker, "alpha", "beta", "gamma")
    workload(broker, rng, rounds=14, drivers=drivers)
    # Left open: its records, and everything after its first offset, stay unmaterialised.
    open_txn = drivers_for(broker, "open")[0]
    assert open_txn.send("orders", 1, "pending-1", "pending-2").error_code == 0
    plain(broker, "orders", 1, 25, rng)
    plain(broker, "payments", 0, 25, rng)

    bounds = capture(broker.engine)
    counts = materialize(spark, db_url)

    rows = table(broker)
    want = expected(broker, bounds)
    assert len(want) > 1000
    assert rows == want
    assert rows == table(broker, "committed_records")
    assert as_consumed(rows) == consumed(db_url, bounds)
    assert counts == {
        (b.topic, b.partition): sum(1 for r in want if r[:2] == (b.topic, b.partition))
        for b in bounds
    }
    assert progress(broker) == {(b.topic, b.partition): b.lso for b in bounds}
    assert not any(r[4] in (b"pending-1", b"pending-2") for r in rows)
    assert leftover_tables(broker) == []


@pytest.mark.spark
def test_reruns_add_only_new_rows_and_pick_up_ended_transactions(
    spark: SparkSession, db_url: str, broker: Broker
) -> None:
    rng = random.Random(447)
    drivers = drivers_for(broker, "one", "two")
    workload(broker, rng, rounds=3, drivers=drivers)
    open_txn = drivers_for(broker, "late")[0]
    assert open_txn.send("payments", 1, "late-1", "late-2", "late-3").error_code == 0
    plain(broker, "payments", 1, 10, rng)

    first = materialize(spark, db_url)
    held_back = lsos(broker)[("payments", 1)]
    assert progress(broker)[("payments", 1)] == held_back
    assert not any(r[4].startswith(b"late-") for r in table(broker) if r[4])

    before = table(broker)
    assert open_txn.end(commit=True) == 0
    workload(broker, rng, rounds=2, drivers=drivers)

    second = materialize(spark, db_url)
    after = table(broker)
    assert after == expected(broker, capture(broker.engine))
    old = {r[:3]: r for r in before}
    assert all(old[r[:3]] == r for r in after if r[:3] in old)
    assert len(old) == len(before) <= len(after)
    new = [r for r in after if r[:3] not in old]
    assert sum(second.values()) == len(new) > 0
    for key, n in second.items():
        assert n == sum(1 for r in new if r[:2] == key)
    late = [r[4] for r in after if r[:2] == ("payments", 1) and r[4] and r[4].startswith(b"late")]
    assert late == [b"late-1", b"late-2", b"late-3"]
    assert sum(first.values()) + sum(second.values()) == len(after)

    assert set(materialize(spark, db_url).values()) == {0}
    assert table(broker) == after


@pytest.mark.spark
def test_topic_selection_leaves_other_topics_alone(
    spark: SparkSession, db_url: str, broker: Broker
) -> None:
    rng = random.Random(5)
    plain(broker, "orders", 0, 30, rng)
    plain(broker, "payments", 0, 30, rng)
    counts = materialize(spark, db_url, topics=["payments"])
    assert set(counts) == {("payments", 0), ("payments", 1)}
    assert {r[0] for r in table(broker)} == {"payments"}
    assert set(progress(broker)) == {("payments", 0), ("payments", 1)}


def _run_killed(crash_at: str) -> None:
    code = (
        "import os\n"
        "from app.spark.materialize import materialize\n"
        "from app.spark.session import build_spark_session\n"
        "materialize(build_spark_session('kip98-crash'), os.environ['KIP98_DATABASE_URL'])\n"
    )
    _killed_at(crash_at, code, 240)


def _wait_for_sessions_to_end(broker: Broker) -> None:
    """The killed run's PostgreSQL sessions end a moment after it does."""
    deadline = time.monotonic() + 30
    query = text(
        "SELECT (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
        "        AND classid = CAST(:ns AS oid)) "
        "     + (SELECT count(*) FROM pg_stat_activity WHERE application_name = :app)"
    )
    while True:
        with broker.engine.connect() as conn:
            params = {"ns": spark_sql.LOCK_NAMESPACE, "app": spark_sql.APPLICATION_NAME}
            if conn.execute(query, params).scalar_one() == 0:
                return
        assert time.monotonic() < deadline, "the killed run's sessions did not end"
        time.sleep(0.1)


@pytest.mark.spark
@pytest.mark.parametrize(
    "crash_at",
    ["spark.materialize.written", "spark.materialize.attached", "spark.materialize.commit"],
)
def test_killed_run_leaves_tables_as_before_and_next_run_converges(
    spark: SparkSession, db_url: str, broker: Broker, crash_at: str
) -> None:
    rng = random.Random(crash_at)
    drivers = drivers_for(broker, "p", "q")
    workload(broker, rng, rounds=2, drivers=drivers)
    materialize(spark, db_url)
    before_rows, before_progress = table(broker), progress(broker)
    workload(broker, rng, rounds=2, drivers=drivers)

    _run_killed(crash_at)
    _wait_for_sessions_to_end(broker)
    assert table(broker) == before_rows
    assert progress(broker) == before_progress
    leftovers = leftover_tables(broker)
    assert len(leftovers) == 1
    with broker.engine.connect() as conn:
        assert conn.execute(text(spark_sql.count_rows(leftovers[0]))).scalar_one() > 0

    counts = materialize(spark, db_url)
    rows = table(broker)
    assert rows == expected(broker, capture(broker.engine))
    assert sum(counts.values()) == len(rows) - len(before_rows)
    assert leftover_tables(broker) == []


@pytest.mark.spark
def test_more_aborted_entries_than_it_broadcasts(
    spark: SparkSession, db_url: str, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the broadcast limit the aborted index is joined as an ordinary table (Spark's
    own broadcasting off too): the rows are the same."""
    rng = random.Random(664)
    drivers = drivers_for(broker, "a", "b", "c")
    for step in range(6):
        for d in drivers:
            assert d.send("orders", step % 3, f"{d.transactional_id}{step}").error_code == 0
            plain(broker, "orders", step % 3, 3, rng)
        for i, d in enumerate(drivers):
            assert d.end(commit=(step + i) % 2 == 0) == 0
    monkeypatch.setattr(MATERIALIZE, "BROADCAST_ABORTED_MAX", 2)
    before = spark.conf.get("spark.sql.autoBroadcastJoinThreshold")
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
    said: list[str] = []
    try:
        run_materialization(spark, db_url, progress=lambda _stage, message: said.append(message))
    finally:
        spark.conf.set("spark.sql.autoBroadcastJoinThreshold", before)
    with broker.engine.connect() as conn:
        n_aborted = conn.execute(text("SELECT count(*) FROM aborted_txns")).scalar_one()
    assert n_aborted > 2
    assert any(f"{n_aborted} aborted-index entries" in m for m in said), said
    assert table(broker) == expected(broker, capture(broker.engine))
    assert table(broker) == table(broker, "committed_records")


@pytest.mark.spark
def test_a_topic_created_again_between_runs_starts_over(
    spark: SparkSession, db_url: str, broker: Broker
) -> None:
    rng = random.Random(516)
    plain(broker, "payments", 0, 40, rng)
    materialize(spark, db_url, topics=["payments"])
    assert progress(broker)[("payments", 0)] == 40
    delete_topic(broker, "payments")
    create_topic(broker, "payments", 2)
    plain(broker, "payments", 0, 5, rng)
    counts = materialize(spark, db_url, topics=["payments"])
    assert counts[("payments", 0)] == 5
    assert table(broker) == table(broker, "committed_records")
    assert progress(broker)[("payments", 0)] == 5


@pytest.mark.spark
def test_a_topic_created_again_during_a_run_gets_nothing_of_it(
    spark: SparkSession, db_url: str, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deleted and created again after the capture, while the run stages: the run moves
    none of the old log's rows and records no progress for the new log, which the next
    run materialises from its start."""
    rng = random.Random(890)
    plain(broker, "payments", 0, 40, rng)
    plain(broker, "orders", 0, 10, rng)

    def recreate(name: str) -> None:
        if name == "spark.materialize.written":
            delete_topic(broker, "payments")
            create_topic(broker, "payments", 2)
            plain(broker, "payments", 0, 5, rng)

    monkeypatch.setattr(MATERIALIZE, "crash_point", recreate)
    counts = materialize(spark, db_url)
    assert counts[("orders", 0)] == 10
    assert not any(r[0] == "payments" for r in table(broker))
    assert ("payments", 0) not in progress(broker)

    monkeypatch.undo()
    counts = materialize(spark, db_url)
    assert counts[("payments", 0)] == 5
    assert table(broker) == table(broker, "committed_records")
    assert progress(broker)[("payments", 0)] == 5


def _bulk(broker: Broker, topic: str, partition: int, n: int) -> None:
    for start in range(0, n, 1000):
        records = [RecordIn(f"k{i}".encode(), b"v" * 50, 0) for i in range(start, start + 1000)]
        assert produce(broker, ProduceRequest(topic, partition, records)).error_code == 0


@pytest.mark.spark
def test_run_killed_while_spark_writes_leaves_tables_as_before(
    spark: SparkSession, db_url: str, broker: Broker
) -> None:
    """SIGKILL of the driver while Spark's tasks write: some tasks have committed their
    rows into the run's table, one is held mid-write (a lock this test takes on its
    partition of the run's table). Nothing of it reaches read_committed_records; the
    next run drops the run's table and materialises everything once."""
    rng = random.Random(77)
    plain(broker, "orders", 0, 30, rng)
    materialize(spark, db_url)
    before_rows, before_progress = table(broker), progress(broker)
    _bulk(broker, "orders", 0, 25_000)
    _bulk(broker, "orders", 1, 25_000)

    code = (
        "import os\n"
        "from app.spark.materialize import materialize\n"
        "from app.spark.session import build_spark_session\n"
        "materialize(build_spark_session('kip98-killed'), os.environ['KIP98_DATABASE_URL'])\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    holder: ActiveHolder | None = None
    try:
        deadline = time.monotonic() + 180
        run_name = None
        while run_name is None:  # the run's tables exist before Spark starts reading
            assert child.poll() is None and time.monotonic() < deadline
            names = leftover_tables(broker)
            run_name = names[0] if names else None
            time.sleep(0.01)
        children = {}
        while len(children) < 2:
            assert time.monotonic() < deadline
            with broker.engine.connect() as conn:
                children = {
                    p: n
                    for n, p in conn.execute(
                        text(
                            "SELECT CAST(c.inhrelid AS regclass)::text, "
                            "  substring(pg_get_expr(k.relpartbound, k.oid) from ', (\\d+),') "
                            "FROM pg_inherits c JOIN pg_class k ON k.oid = c.inhrelid "
                            "WHERE c.inhparent = CAST(:t AS regclass)"
                        ),
                        {"t": run_name},
                    )
                }
        # Held by an active session: neither an idle bound nor the run's watch for stalled
        # sessions ends it, however long the tasks take to get to it.
        holder = ActiveHolder(db_url, f"LOCK TABLE {children['1']} IN SHARE MODE")
        while True:  # orders[0]'s tasks commit; orders[1]'s wait for the lock
            assert child.poll() is None and time.monotonic() < deadline
            with broker.engine.connect() as conn:
                if conn.execute(text(f"SELECT count(*) FROM {children['0']}")).scalar_one():
                    break
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        if holder is not None:
            holder.close()
        if child.poll() is None:
            child.kill()
    _wait_for_sessions_to_end(broker)

    assert table(broker) == before_rows
    assert progress(broker) == before_progress
    assert leftover_tables(broker) == [run_name]
    with broker.engine.connect() as conn:
        assert conn.execute(text(spark_sql.count_rows(run_name))).scalar_one() > 0

    counts = materialize(spark, db_url)
    assert counts[("orders", 0)] == counts[("orders", 1)] == 25_000
    assert table(broker) == expected(broker, capture(broker.engine))
    assert leftover_tables(broker) == []
    attached(broker)


def test_attaching_waits_for_transactions_holding_older_snapshots(
    db_url: str, broker: Broker
) -> None:
    """A REPEATABLE READ transaction holding a snapshot when a run is about to attach is
    waited for (its snapshot may predate some of Spark's commits); kip98's own sessions
    and sessions without a snapshot are not."""
    engine = work_engine(db_url)
    reader = broker.engine.connect().execution_options(isolation_level="REPEATABLE READ")
    ours = engine.connect().execution_options(isolation_level="REPEATABLE READ")
    idle = broker.engine.connect()
    try:
        reader.execute(text("SELECT count(*) FROM read_committed_records"))
        ours.execute(text("SELECT count(*) FROM read_committed_records"))
        said: list[str] = []
        waiting = threading.Event()

        def report(_stage: str, message: str) -> None:
            said.append(message)
            waiting.set()

        waited: list[int] = []
        thread = threading.Thread(
            target=lambda: waited.append(wait_for_older_snapshots(engine, report, "commit"))
        )
        thread.start()
        assert waiting.wait(timeout=30)
        assert thread.is_alive()  # it reported the reader and waits for it to end
        assert said == ["waiting for 1 transactions older than the rows to end"]
        reader.commit()
        thread.join(timeout=30)
        assert not thread.is_alive()
        assert waited == [1]
    finally:
        for conn in (reader, ours, idle):
            conn.close()
        engine.dispose()
