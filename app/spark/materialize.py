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

Exactly once: Spark only ever appends to a staging table private to the run. One
PostgreSQL transaction then moves the staged rows (a plain INSERT; should a staged row
already be there, the move falls back to ``ON CONFLICT DO NOTHING``) and advances
``materialization_progress`` to the captured LSOs, so a run killed at any point
leaves the tables as they were or as they will be, and the next run starts from the
progress that committed. Staging tables of killed runs are recognised by name and by the
advisory lock their run no longer holds, and dropped.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, create_engine, pool, text
from sqlalchemy.exc import IntegrityError

from app.faults import crash_point
from app.spark import sql
from app.spark.jdbc import jdbc_url
from app.storage.engine import retry_conflicts, sqlstate

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# Rows the JDBC driver holds per round trip: reads stream instead of buffering a slice.
FETCH_SIZE = 10_000
# Rows per INSERT batch when Spark writes the staging table.
WRITE_BATCH_SIZE = 10_000
# Offsets per Spark task: small enough to spread a partition over the cores, large enough
# that per-task overhead does not dominate.
MIN_SLICE_OFFSETS = 20_000
MAX_SLICE_OFFSETS = 500_000
# Above this many aborted-index entries in range, let Spark pick the join strategy rather
# than broadcasting the index to every task.
BROADCAST_ABORTED_MAX = 1_000_000
UNIQUE_VIOLATION = "23505"

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
STAGES = ("capture", "read", "filter", "stage", "commit")
Progress = Callable[[str, str], None]


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
    spark: SparkSession, database_url: str, topics: Sequence[str] | None = None
) -> dict[tuple[str, int], int]:
    """Bring ``read_committed_records`` up to the current LSOs; new rows per partition."""
    results = run_materialization(spark, database_url, topics)
    return {(r.topic, r.partition): r.rows for r in results}


def run_materialization(
    spark: SparkSession,
    database_url: str,
    topics: Sequence[str] | None = None,
    progress: Progress | None = None,
) -> list[PartitionResult]:
    """The whole run, reporting each of ``STAGES`` to ``progress`` as it completes."""
    report = progress or (lambda _stage, _message: None)
    engine = create_engine(database_url, poolclass=pool.NullPool)
    try:
        drop_leftover_staging(engine)
        bounds = capture(engine, topics)
        pending = [b for b in bounds if b.start < b.lso]
        report(
            "capture",
            f"{len(bounds)} partitions, {sum(b.lso - b.start for b in pending)} offsets "
            f"to read in {len(pending)}",
        )
        counts: dict[tuple[str, int], int] = {}
        if pending:
            counts = _stage_and_commit(spark, engine, database_url, bounds, pending, report)
        else:
            _commit(engine, None, bounds)
            report("commit", "nothing new below the LSOs")
        return [
            PartitionResult(
                b.topic, b.partition, b.start, b.lso, counts.get((b.topic, b.partition), 0)
            )
            for b in bounds
        ]
    finally:
        engine.dispose()


def capture(engine: Engine, topics: Sequence[str] | None = None) -> list[PartitionBounds]:
    """Every selected partition's log start, LSO and committed progress, at one instant."""
    with engine.connect() as conn:
        rows = conn.execute(sql.CAPTURE, {"topics": list(topics) if topics else None}).all()
    return [PartitionBounds(*r) for r in rows]


def drop_leftover_staging(engine: Engine) -> list[str]:
    """Drop staging tables whose run is gone (its session, and so its lock, ended)."""
    dropped = []
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for (name,) in conn.execute(sql.LEFTOVER_STAGING).all():
            try:
                sql.check_staging_name(name)
            except ValueError:
                continue
            params = {"ns": sql.LOCK_NAMESPACE, "name": name}
            if not conn.execute(sql.TRY_LOCK_STAGING, params).scalar():
                continue  # a live run owns it
            try:
                conn.execute(text(sql.drop_staging(name)))
                dropped.append(name)
            finally:
                conn.execute(sql.UNLOCK_STAGING, params)
    return dropped


def _stage_and_commit(
    spark: SparkSession,
    engine: Engine,
    database_url: str,
    bounds: list[PartitionBounds],
    pending: list[PartitionBounds],
    report: Progress,
) -> dict[tuple[str, int], int]:
    staging = f"{sql.STAGING_PREFIX}{uuid.uuid4().hex}"
    params = {"ns": sql.LOCK_NAMESPACE, "name": staging}
    # The lock lives as long as this session: held for the whole run, released by a kill.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as owner:
        owner.execute(sql.LOCK_STAGING, params)
        try:
            owner.execute(text(sql.create_staging(staging)))
            url, props = jdbc_url(database_url)
            frame = committed_frame(spark, engine, url, props, pending, report)
            started = time.monotonic()
            frame.write.jdbc(
                url,
                staging,
                mode="append",
                properties={
                    **props,
                    "batchsize": str(WRITE_BATCH_SIZE),
                    "reWriteBatchedInserts": "true",
                },
            )
            report("stage", f"staging table written in {time.monotonic() - started:.1f}s")
            crash_point("spark.materialize.staged")
            counts = _commit(engine, staging, bounds)
            report(
                "commit",
                f"{sum(counts.values())} new rows; progress advanced on {len(bounds)} partitions",
            )
            return counts
        finally:
            owner.execute(text(sql.drop_staging(staging)))
            owner.execute(sql.UNLOCK_STAGING, params)


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
    engine: Engine, staging: str | None, bounds: list[PartitionBounds]
) -> dict[tuple[str, int], int]:
    """The one transaction that makes a run visible: rows and progress together, for the
    captured topics that are still the ones captured (a topic deleted and created again
    since starts over at the next run; nothing of its predecessor carries over)."""
    counts: dict[tuple[str, int], int] = {}
    with engine.begin() as conn:
        conn.execute(sql.LOCK_MOVE, {"ns": sql.LOCK_NAMESPACE, "key": sql.MOVE_LOCK})
        names = sorted({b.topic for b in bounds})
        rows = conn.execute(sql.CURRENT_TOPIC_IDS, {"topics": names}).all()
        current: dict[str, str] = {t: i for t, i in rows}
        captured = len(bounds)
        bounds = [
            b for b in bounds if b.topic_id is not None and current.get(b.topic) == b.topic_id
        ]
        params: dict[str, Any] = {
            "topics": [b.topic for b in bounds],
            "partitions": [b.partition for b in bounds],
            "log_starts": [b.log_start for b in bounds],
            "lsos": [b.lso for b in bounds],
        }
        conn.execute(sql.FORGET_UNTRACKED, params)
        conn.execute(sql.PRUNE_BELOW_LOG_START, params)
        if staging is not None:
            if len(bounds) < captured:  # a scan of the staged rows, only when it can matter
                conn.execute(text(sql.drop_staged_except(staging)), {"topics": params["topics"]})
            counts = _move(conn, staging)
        crash_point("spark.materialize.moving")
        conn.execute(sql.ADVANCE_PROGRESS, params)
        crash_point("spark.materialize.commit")
    return counts


def _move(conn: Connection, staging: str) -> dict[tuple[str, int], int]:
    """Staged rows into ``read_committed_records``; new rows per partition.

    The plain insert is the fast path. A unique violation means some staged row is
    already in the table or staged twice: the savepoint undoes the partial insert and the
    merge inserts only the new rows, so the outcome is the same either way.
    """
    try:
        with conn.begin_nested():
            counts = conn.execute(text(sql.count_staged(staging))).all()
            conn.execute(text(sql.insert_staged(staging)))
    except IntegrityError as exc:
        if sqlstate(exc) != UNIQUE_VIOLATION:
            raise
        counts = conn.execute(text(sql.merge_staged(staging))).all()
    return {(t, p): int(n) for t, p, n in counts}
