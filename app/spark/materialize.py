"""Materialise what read_committed consumers see into ``read_committed_records``.

Spark's JDBC tasks each read with their own connection and snapshot, so nothing makes
them agree except the data itself: the driver captures every partition's log start and
LSO in one statement, and every read is bounded by those values. Below a captured LSO
nothing is ever added (the aborted-index entries that matter were written with their
abort markers), so any snapshot taken later returns the same rows — or fewer, where the
log cleaner has since compacted or deleted some: a task may miss a record compaction
removed meanwhile (as a consumer reading a compacted topic may), but never returns an
aborted one, since an aborted-index entry outlives its transaction's records by
delete.retention.ms.

Exactly once, each row written once: ``read_committed_records`` is partitioned by range
of ``(topic, partition, "offset")``. A run creates its own table, partitioned the same
way, with one logged partition per topic partition it reads, each created with a CHECK
constraint equal to its future bound; Spark appends the rows there. One PostgreSQL
transaction then detaches those partitions from the run's table, attaches them to
``read_committed_records`` (the CHECK spares PostgreSQL a validating scan; the attach
takes no lock that blocks readers), registers them in ``read_committed_partitions`` and
advances ``materialization_progress`` to the captured LSOs. So a run killed at any
point leaves the tables as they were or as they will be; the next run starts from the
progress that committed, and drops the tables of killed runs, recognised by name and by
the advisory lock their run no longer holds. ``app.spark.compact`` merges the small
partitions many runs leave behind.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, text

from app.faults import crash_point
from app.spark import sql
from app.spark.jdbc import jdbc_url
from app.spark.partitions import Progress, drop_leftovers, wait_for_older_snapshots, work_engine
from app.storage.engine import retry_conflicts

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# Rows the JDBC driver holds per round trip: reads stream instead of buffering a slice.
FETCH_SIZE = 10_000
# Rows per INSERT batch when Spark writes the run's table.
WRITE_BATCH_SIZE = 10_000
# Offsets per Spark task: small enough to spread a partition over the cores, large enough
# that per-task overhead does not dominate.
MIN_SLICE_OFFSETS = 20_000
MAX_SLICE_OFFSETS = 500_000
# Above this many aborted-index entries in range, let Spark pick the join strategy rather
# than broadcasting the index to every task.
BROADCAST_ABORTED_MAX = 1_000_000

OUTPUT_COLUMNS = (
    "topic",
    "partition",
    "offset",
    "key",
    "value",
    "headers",
    "timestamp",
    "producer_id",
)
STAGES = ("capture", "read", "filter", "write", "commit")


@dataclass(frozen=True)
class PartitionBounds:
    """One partition as captured at the start of a run."""

    topic: str
    partition: int
    log_start: int
    lso: int
    progress: int | None
    topic_id: str | None = None  # the topic's incarnation at capture

    @property
    def start(self) -> int:
        """Where this run reads from: past what earlier runs committed, never below the log
        start (retention removed those records) nor above the LSO."""
        done = self.log_start if self.progress is None else self.progress
        return min(max(done, self.log_start), self.lso)


@dataclass(frozen=True)
class PartitionResult:
    topic: str
    partition: int
    from_offset: int
    up_to_offset: int
    rows: int


def materialize(
    spark: SparkSession,
    database_url: str,
    topics: Sequence[str] | None = None,
    replica_url: str | None = None,
) -> dict[tuple[str, int], int]:
    """Bring ``read_committed_records`` up to the current LSOs; new rows per partition."""
    results = run_materialization(spark, database_url, topics, replica_url=replica_url)
    return {(r.topic, r.partition): r.rows for r in results}


def run_materialization(
    spark: SparkSession,
    database_url: str,
    topics: Sequence[str] | None = None,
    progress: Progress | None = None,
    replica_url: str | None = None,
) -> list[PartitionResult]:
    """The whole run, reporting each of ``STAGES`` to ``progress`` as it completes.

    ``replica_url``: a standby of the database, where the LSOs are captured and the
    records read (docs/design.md rule 44); the run's table, its attachment and the
    progress are written on the primary. A standby's snapshot is one the primary had, so
    the rows below an LSO captured there are final there as on the primary; its progress
    may lag the primary's, and a partition another run advanced since is left to the next
    run, as on the primary."""
    report = progress or (lambda _stage, _message: None)
    engine = work_engine(database_url)
    reader = engine if replica_url is None else work_engine(replica_url)
    try:
        drop_leftovers(engine)
        bounds = capture(reader, topics)
        pending = [b for b in bounds if b.start < b.lso]
        report(
            "capture",
            f"{len(bounds)} partitions, {sum(b.lso - b.start for b in pending)} offsets "
            f"to read in {len(pending)}",
        )
        counts: dict[tuple[str, int], int] = {}
        if pending:
            counts = _write_and_attach(
                spark, engine, database_url, bounds, pending, report, reader, replica_url
            )
        else:
            _commit(engine, None, bounds, {})
            report("commit", "nothing new below the LSOs")
        return [
            PartitionResult(
                b.topic, b.partition, b.start, b.lso, counts.get((b.topic, b.partition), 0)
            )
            for b in bounds
        ]
    finally:
        engine.dispose()
        reader.dispose()


def capture(engine: Engine, topics: Sequence[str] | None = None) -> list[PartitionBounds]:
    """Every selected partition's log start, LSO and committed progress, at one instant."""
    with engine.connect() as conn:
        rows = conn.execute(sql.CAPTURE, {"topics": list(topics) if topics else None}).all()
    return [PartitionBounds(*r) for r in rows]


@dataclass(frozen=True)
class RunTable:
    """A run's table and its partition for each topic partition it reads."""

    name: str
    children: dict[tuple[str, int], str]

    @classmethod
    def new(cls, pending: Sequence[PartitionBounds]) -> RunTable:
        name = f"{sql.RUN_PREFIX}{uuid.uuid4().hex}"
        return cls(name, {(b.topic, b.partition): f"{name}_{i}" for i, b in enumerate(pending)})


def _write_and_attach(
    spark: SparkSession,
    engine: Engine,
    database_url: str,
    bounds: list[PartitionBounds],
    pending: list[PartitionBounds],
    report: Progress,
    reader: Engine,
    replica_url: str | None,
) -> dict[tuple[str, int], int]:
    run = RunTable.new(pending)
    params = {"ns": sql.LOCK_NAMESPACE, "name": run.name}
    # The lock lives as long as this session: held for the whole run, released by a kill.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as owner:
        owner.execute(sql.LOCK_TABLE, params)
        try:
            owner.execute(text(sql.create_run_table(run.name)))
            for b in pending:
                child = run.children[(b.topic, b.partition)]
                owner.execute(
                    text(
                        sql.create_run_child(run.name, child, b.topic, b.partition, b.start, b.lso)
                    )
                )
            url, props = jdbc_url(database_url)
            read_url, read_props = jdbc_url(replica_url or database_url)
            frame = committed_frame(spark, reader, read_url, read_props, pending, report)
            started = time.monotonic()
            frame.write.jdbc(
                url,
                run.name,
                mode="append",
                properties={
                    **props,
                    "batchsize": str(WRITE_BATCH_SIZE),
                    "reWriteBatchedInserts": "true",
                    # headers arrive as strings; the server takes them as the column's jsonb
                    "stringtype": "unspecified",
                    "ApplicationName": sql.APPLICATION_NAME,
                },
            )
            report("write", f"rows written once, in {time.monotonic() - started:.1f}s")
            crash_point("spark.materialize.written")
            written = {
                (t, p): int(n) for t, p, n in owner.execute(text(sql.count_run(run.name))).all()
            }
            wait_for_older_snapshots(engine, report, "commit")
            counts = _commit(engine, run, bounds, written)
            report(
                "commit",
                f"{sum(counts.values())} new rows in {sum(1 for n in counts.values() if n)} "
                f"attached partitions; progress advanced on {len(bounds)} partitions",
            )
            return counts
        finally:
            owner.execute(text(sql.drop_work(run.name)))
            owner.execute(sql.UNLOCK_TABLE, params)


def slices(pending: Iterable[PartitionBounds], parallelism: int) -> list[str]:
    """JDBC predicates, one per Spark task, splitting each partition's captured range."""
    pending = list(pending)
    total = sum(b.lso - b.start for b in pending)
    size = min(MAX_SLICE_OFFSETS, max(MIN_SLICE_OFFSETS, math.ceil(total / (4 * parallelism))))
    out = []
    for b in pending:
        for start in range(b.start, b.lso, size):
            out.append(sql.range_predicate(b.topic, b.partition, start, min(start + size, b.lso)))
    return out


def committed_frame(
    spark: SparkSession,
    engine: Engine,
    url: str,
    props: dict[str, str],
    pending: list[PartitionBounds],
    report: Progress,
) -> DataFrame:
    """The read_committed rows of the captured ranges, in read_committed_records' columns
    (headers still as text). Nothing is read until the frame is written."""
    from pyspark.sql import functions as F

    read_props = {**props, "fetchsize": str(FETCH_SIZE)}
    predicates = slices(pending, spark.sparkContext.defaultParallelism)
    records = spark.read.jdbc(
        url, sql.records_table(), predicates=predicates, properties=read_props
    )
    aborted_query = sql.aborted_query((b.topic, b.partition, b.start, b.lso) for b in pending)
    # Counted on the driver (one small query) to choose the join, not by a Spark job.
    with engine.connect() as conn:
        n_aborted = conn.execute(text(sql.count_of(aborted_query))).scalar_one()
    report(
        "read",
        f"{len(predicates)} JDBC slices of records; {n_aborted} aborted-index entries in range",
    )

    r = records.where(~F.col("is_control")).alias("r")
    if n_aborted:
        aborted = spark.read.jdbc(url, sql.aborted_table(aborted_query), properties=read_props)
        a = (F.broadcast(aborted) if n_aborted <= BROADCAST_ABORTED_MAX else aborted).alias("a")
        in_aborted_txn = (
            F.col("r.is_transactional")
            & (F.col("r.topic") == F.col("a.topic"))
            & (F.col("r.partition") == F.col("a.partition"))
            & (F.col("r.producer_id") == F.col("a.producer_id"))
            & F.col("r.offset").between(F.col("a.first_offset"), F.col("a.last_offset"))
        )
        r = r.join(a, in_aborted_txn, "left_anti")
        how = "control records and aborted transactions dropped (range anti-join)"
    else:
        how = "control records dropped; no aborted transactions in range"
    kept = r.select(*(F.col(f"r.{c}") for c in OUTPUT_COLUMNS))
    report("filter", how)
    return kept


@retry_conflicts
def _commit(
    engine: Engine,
    run: RunTable | None,
    bounds: list[PartitionBounds],
    written: dict[tuple[str, int], int],
) -> dict[tuple[str, int], int]:
    """The one transaction that makes a run visible: its partitions, their registration
    and the progress that covers them, together.

    Only for captured partitions that are still as captured: the topic is the same
    incarnation (one deleted and created again starts over at the next run; nothing of
    its predecessor carries over) and no other run has advanced the partition meanwhile
    (its rows are there already, so this run's would overlap them).
    """
    counts: dict[tuple[str, int], int] = {}
    with engine.begin() as conn:
        conn.execute(sql.LOCK_MOVE, {"ns": sql.LOCK_NAMESPACE, "key": sql.MOVE_LOCK})
        names = sorted({b.topic for b in bounds})
        rows = conn.execute(sql.CURRENT_TOPIC_IDS, {"topics": names}).all()
        current: dict[str, str] = {t: i for t, i in rows}
        now = {(t, p): o for t, p, o in conn.execute(sql.PROGRESS_NOW, {"topics": names}).all()}
        bounds = [
            b
            for b in bounds
            if b.topic_id is not None
            and current.get(b.topic) == b.topic_id
            and now.get((b.topic, b.partition)) == b.progress
        ]
        params: dict[str, Any] = {
            "topics": [b.topic for b in bounds],
            "partitions": [b.partition for b in bounds],
            "log_starts": [b.log_start for b in bounds],
            "lsos": [b.lso for b in bounds],
        }
        obsolete = [r[0] for r in conn.execute(sql.OBSOLETE_PARTITIONS, params).all()]
        for name in obsolete:
            conn.execute(text(sql.drop_child(name)))
        conn.execute(sql.UNREGISTER, {"names": obsolete})
        conn.execute(sql.PRUNE_BELOW_LOG_START, params)
        if run is not None:
            for b in bounds:
                key = (b.topic, b.partition)
                n = written.get(key, 0)
                if key not in run.children or not n:
                    continue  # nothing read, or only aborted and control records
                child = run.children[key]
                conn.execute(text(sql.detach(run.name, child)))
                conn.execute(text(sql.attach(child, b.topic, b.partition, b.start, b.lso)))
                conn.execute(
                    sql.REGISTER,
                    {
                        "table_name": child,
                        "topic": b.topic,
                        "partition": b.partition,
                        "from_offset": b.start,
                        "to_offset": b.lso,
                        "row_count": n,
                    },
                )
                counts[key] = n
            # The run's table and the partitions it kept (topics gone, empty ranges).
            conn.execute(text(sql.drop_work(run.name)))
        crash_point("spark.materialize.attached")
        conn.execute(sql.ADVANCE_PROGRESS, params)
        crash_point("spark.materialize.commit")
    return counts
