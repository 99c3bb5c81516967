"""The Spark materialisation against real PostgreSQL: it holds exactly what read_committed
readers return up to the captured LSO, re-runs add only new rows, open transactions wait
for their outcome, and a run killed anywhere converges on the next run."""

from __future__ import annotations

import importlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import text

from app.broker import Broker
from app.broker.produce import produce
from app.client.consumer import Consumer
from app.client.message import TopicPartition, decode_headers, encode_headers
from app.log.fetch import fetch
from app.log.topics import create_topic, delete_topic
from app.protocol import READ_COMMITTED, FetchRequest, ProduceRequest, RecordIn
from app.spark import materialize
from app.spark import sql as spark_sql
from app.spark.materialize import (
    PartitionBounds,
    _commit,
    capture,
    run_materialization,
    slices,
)
from tests.txn_driver import TxnDriver

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROOT = Path(__file__).resolve().parents[1]
# The module (the package exports its function under the same name).
MATERIALIZE = importlib.import_module("app.spark.materialize")
TOPICS = {"orders": 3, "payments": 2}
Row = tuple[Any, ...]


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
    """What a read_committed Consumer returns from each log start until it has nothing
    more (the test stops traffic first, so that is the LSO)."""
    out: list[Row] = []
    config = {"database.url": db_url, "isolation.level": "read_committed"}
    with Consumer(config) as consumer:
        consumer.assign([TopicPartition(b.topic, b.partition, b.log_start) for b in bounds])
        while batch := consumer.consume(500, timeout=0.5):
            for m in batch:
                assert m.error() is None, m.error()
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


def staging_tables(broker: Broker) -> list[str]:
    with broker.engine.connect() as conn:
        return [r[0] for r in conn.execute(spark_sql.LEFTOVER_STAGING)]


@pytest.fixture
def broker(db_url: str) -> Broker:
    b = Broker.connect(db_url)
    for topic, n in TOPICS.items():
        create_topic(b, topic, n)
    return b


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


def test_staging_names_are_checked() -> None:
    with pytest.raises(ValueError):
        spark_sql.drop_staging("records; DROP TABLE records")
    assert spark_sql.literal("o'brien") == "'o''brien'"


def test_move_falls_back_when_a_staged_row_is_already_there(broker: Broker) -> None:
    """A row moved by a concurrent run and a row staged twice (a re-executed Spark task)
    make the plain insert fail; the merge still moves each new row once and counts it."""
    rng = random.Random(23)
    plain(broker, "orders", 0, 20, rng)
    plain(broker, "payments", 1, 7, rng)
    staging = f"{spark_sql.STAGING_PREFIX}{'ab' * 16}"
    columns = 'topic, partition, "offset", key, value, headers, "timestamp", producer_id'
    with broker.engine.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO read_committed_records ({columns}) SELECT {columns} "
                """FROM committed_records WHERE topic = 'orders' AND "offset" < 5"""
            )
        )
        conn.execute(
            text(
                "INSERT INTO materialization_progress (topic, partition, up_to_offset) "
                "VALUES ('orders', 0, 5)"
            )
        )
        conn.execute(text(spark_sql.create_staging(staging)))
        for condition in ("true", """topic = 'orders' AND "offset" = 10"""):
            conn.execute(
                text(
                    f'INSERT INTO {staging} SELECT topic, partition, "offset", key, value, '
                    'CAST(headers AS text), "timestamp", producer_id '
                    f"FROM committed_records WHERE {condition}"
                )
            )

    bounds = capture(broker.engine)
    counts = _commit(broker.engine, staging, bounds)

    assert counts == {("orders", 0): 15, ("payments", 1): 7}
    assert table(broker) == table(broker, "committed_records")
    assert progress(broker) == {(b.topic, b.partition): b.lso for b in bounds}


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
    assert staging_tables(broker) == []


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
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "KIP98_CRASH_AT": crash_at, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == -9, result.stderr[-3000:]


def _wait_for_sessions_to_end(broker: Broker) -> None:
    """The killed run's PostgreSQL sessions end a moment after it does."""
    deadline = time.monotonic() + 30
    query = text(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = CAST(:ns AS oid)"
    )
    while True:
        with broker.engine.connect() as conn:
            if conn.execute(query, {"ns": spark_sql.LOCK_NAMESPACE}).scalar_one() == 0:
                return
        assert time.monotonic() < deadline, "the killed run's sessions did not end"
        time.sleep(0.1)


@pytest.mark.spark
@pytest.mark.parametrize(
    "crash_at", ["spark.materialize.staged", "spark.materialize.moving", "spark.materialize.commit"]
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
    leftovers = staging_tables(broker)
    assert len(leftovers) == 1
    with broker.engine.connect() as conn:
        assert conn.execute(text(spark_sql.count_staging(leftovers[0]))).scalar_one() > 0

    counts = materialize(spark, db_url)
    rows = table(broker)
    assert rows == expected(broker, capture(broker.engine))
    assert sum(counts.values()) == len(rows) - len(before_rows)
    assert staging_tables(broker) == []


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
        if name == "spark.materialize.staged":
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
