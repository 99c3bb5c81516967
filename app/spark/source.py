"""The ``kip98`` source: ``spark.read.format("kip98")`` and ``spark.readStream``.

Planning runs on the driver (in Spark's Python planning worker): it reads every
subscribed partition's log start, high watermark and LSO in one statement and turns the
options into offset ranges ``[start, end)``, each end at most the partition's LSO
(read_committed) or high watermark (read_uncommitted), so nothing of an open or aborted
transaction is ever in range (docs/design.md rule 8). Spark's tasks read their ranges
with ADBC's PostgreSQL driver in the Python workers, as Arrow batches (docs/design.md
§9, "Reading": why not JDBC). Below a captured LSO nothing is added any more, so a range reads
the same whenever a task (or its retry, or a replay of the micro-batch) reads it; only
the cleaner may have removed records meanwhile, as for any consumer.

Data loss is Spark's Kafka source's: a start below the log start (retention moved past
it), a partition gone, a new partition that does not start at 0, offsets gone backwards
(a topic made again): with ``failOnDataLoss`` (the default) an error naming the option,
otherwise the source goes on from what is there.
"""

from __future__ import annotations

import atexit
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from app.errors import KafkaError, fail
from app.protocol import TopicPartitionKey, headers_of_stored
from app.spark import sql
from app.spark.offsets import (
    EARLIEST,
    LATEST,
    OffsetRange,
    Positions,
    bad_option,
    from_json,
    pack_ranges,
    rate_limit,
    split_ranges,
    to_json,
)
from app.spark.options import SourceOptions, Subscription
from app.storage.driver import libpq_conninfo

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

APPLICATION_NAME = "kip98-spark-source"
# Kafka's timestampType: records carry the producer's CreateTime.
CREATE_TIME = 0

# Spark's Kafka source's columns.
SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField(
            "headers",
            ArrayType(
                StructType([StructField("key", StringType()), StructField("value", BinaryType())])
            ),
        ),
    ]
)


def connect(database_url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(
        libpq_conninfo(database_url, application_name=APPLICATION_NAME), autocommit=True
    )


@dataclass(frozen=True)
class Bounds:
    """One partition's offsets as captured."""

    log_start: int
    high_watermark: int
    last_stable_offset: int

    def end(self, read_committed: bool) -> int:
        """How far a query may read: never at or past the LSO in read_committed."""
        return self.last_stable_offset if read_committed else self.high_watermark


def current_bounds(
    conn: psycopg.Connection[Any], subscription: Subscription
) -> dict[TopicPartitionKey, Bounds]:
    rows = conn.execute(sql.SOURCE_PARTITIONS).fetchall()
    return {(t, p): Bounds(s, hw, lso) for t, p, s, hw, lso in rows if subscription.wants(t, p)}


def check_topics(conn: psycopg.Connection[Any], subscription: Subscription) -> None:
    """Topics named by ``subscribe`` or ``assign`` must exist (a pattern may match none)."""
    named = list(subscription.named_topics)
    if not named:
        return
    found = {r[0] for r in conn.execute(sql.EXISTING_TOPICS, {"topics": named})}
    missing = [t for t in named if t not in found]
    if missing:
        option = "assign" if subscription.kind == "assign" else "subscribe"
        raise fail(
            KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
            f"option '{option}': no such topic: {', '.join(missing)}",
        )
    if subscription.kind == "assign":
        rows = conn.execute(sql.SOURCE_PARTITIONS).fetchall()
        exists = {(t, p) for t, p, *_ in rows}
        absent = [f"{t}-{p}" for t, p in subscription.assigned if (t, p) not in exists]
        if absent:
            raise fail(
                KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
                f"option 'assign': no such partition: {', '.join(absent)}",
            )


def resolve(
    conn: psycopg.Connection[Any],
    name: str,
    spec: str | Positions,
    bounds: Mapping[TopicPartitionKey, Bounds],
    read_committed: bool,
    timestamp: int | None = None,
) -> Positions:
    """Positions from ``startingOffsets``/``endingOffsets``/``startingTimestamp``."""
    if timestamp is not None:
        out: Positions = {}
        for (topic, partition), b in bounds.items():
            end = b.end(read_committed)
            row = conn.execute(
                sql.OFFSET_FOR_TIMESTAMP,
                {
                    "topic": topic,
                    "partition": partition,
                    "from_offset": b.log_start,
                    "to_offset": end,
                    "timestamp": timestamp,
                },
            ).fetchone()
            if row is None or row[0] is None:
                raise bad_option(
                    "startingTimestamp",
                    f"no record of {topic}-{partition} has a timestamp at or after {timestamp}",
                )
            out[(topic, partition)] = int(row[0])
        return out
    if spec == "earliest":
        return {tp: b.log_start for tp, b in bounds.items()}
    if spec == "latest":
        return {tp: b.end(read_committed) for tp, b in bounds.items()}
    assert isinstance(spec, dict)
    if set(spec) != set(bounds):
        missing = sorted(f"{t}-{p}" for t, p in set(bounds) - set(spec))
        extra = sorted(f"{t}-{p}" for t, p in set(spec) - set(bounds))
        raise bad_option(
            name,
            "specific offsets must name every subscribed partition, and only those "
            f"(-2 for earliest, -1 for latest); missing: {missing or 'none'}, "
            f"not subscribed: {extra or 'none'}",
        )
    resolved: Positions = {}
    for tp, offset in spec.items():
        b = bounds[tp]
        if offset == EARLIEST:
            resolved[tp] = b.log_start
        elif offset == LATEST:
            resolved[tp] = b.end(read_committed)
        else:
            resolved[tp] = offset
    return resolved


def data_loss(fail_on_data_loss: bool, message: str) -> None:
    """Spark's Kafka source's way: fail, or warn and go on."""
    if fail_on_data_loss:
        raise fail(
            KafkaError.OFFSET_OUT_OF_RANGE,
            f"{message}. Some data may have been lost: retention removed it, or the topic was "
            "deleted. Set the source option 'failOnDataLoss' to 'false' to go on regardless",
        )
    log.warning("%s; going on (failOnDataLoss is false)", message)


@dataclass(frozen=True)
class ReadSettings:
    """What a task needs besides its range (pickled with the reader to the workers)."""

    database_url: str
    read_committed: bool
    fail_on_data_loss: bool


class RangePartition(InputPartition):
    """One Spark task: offsets ``[start, end)`` of one topic partition or more, read one
    range after the other (``pack_ranges``)."""

    def __init__(self, ranges: tuple[OffsetRange, ...]) -> None:
        super().__init__(ranges)
        self.ranges = ranges


def range_partitions(ranges: list[OffsetRange], min_partitions: int | None) -> list[InputPartition]:
    return [
        RangePartition(t) for t in pack_ranges(split_ranges(ranges, min_partitions), min_partitions)
    ]


def read_ranges(
    settings: ReadSettings, ranges: tuple[OffsetRange, ...]
) -> Iterator[pa.RecordBatch]:
    for r in ranges:
        yield from read_range(settings, r)


def read_range(settings: ReadSettings, r: OffsetRange) -> Iterator[pa.RecordBatch]:
    """The range's records as Arrow batches in the source's schema, in offset order.

    The few small statements (the partition's log start, the aborted transactions in
    range) go through psycopg, which also renders the range's read with its parameters;
    the read itself goes through ADBC's PostgreSQL driver, which streams the rows as Arrow
    batches decoded in C++ (docs/design.md §9, "Reading": three times as fast as psycopg's
    rows made into Arrow in Python)."""
    params: dict[str, Any] = {"topic": r.topic, "partition": r.partition, "to_offset": r.end}
    conn, reader = worker_connections(settings.database_url)
    now = conn.execute(sql.PARTITION_NOW, params).fetchone()
    start = r.start
    if now is None:
        data_loss(settings.fail_on_data_loss, f"{r.topic}-{r.partition} no longer exists")
        return
    if start < now[0]:
        data_loss(
            settings.fail_on_data_loss,
            f"{r.topic}-{r.partition}: offsets {start} to {now[0]} are gone (log start {now[0]})",
        )
        start = now[0]
    if start >= r.end:
        return
    params["from_offset"] = start
    statement = sql.READ_RANGE_UNCOMMITTED
    if settings.read_committed:
        pids, firsts, lasts = conn.execute(sql.ABORTED_IN_RANGE, params).fetchone() or (
            None,
            None,
            None,
        )
        params |= {
            "aborted_pids": pids or [],
            "aborted_firsts": firsts or [],
            "aborted_lasts": lasts or [],
        }
        statement = sql.READ_RANGE_COMMITTED
    query = psycopg.ClientCursor(conn).mogrify(statement, params)
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(SCHEMA, timezone="UTC")
    with reader.cursor() as cur:
        cur.execute(query)
        for batch in cur.fetch_record_batch():
            if batch.num_rows:
                yield _arrow_batch(schema, r, batch)


# A Python worker's connections, kept from one task to the next (Spark reuses its Python
# workers): ADBC's connect reads the server's types first, ~40 ms, as long as reading
# 60,000 rows. Checked with a round trip before each range, so a connection the server
# dropped (a restart, a failover) is replaced instead of failing the task.
_WORKER_CONNECTIONS: dict[str, tuple[psycopg.Connection[Any], Any]] = {}


@atexit.register
def _close_worker_connections() -> None:
    """Closed while the interpreter still works: ADBC's finaliser fails at shutdown."""
    while _WORKER_CONNECTIONS:
        _close(_WORKER_CONNECTIONS.popitem()[1])


def worker_connections(database_url: str) -> tuple[psycopg.Connection[Any], Any]:
    """This worker's psycopg and ADBC connections to ``database_url``, alive."""
    import adbc_driver_postgresql.dbapi as adbc

    kept = _WORKER_CONNECTIONS.pop(database_url, None)
    if kept is not None:
        try:
            kept[0].execute("SELECT 1")
            with kept[1].cursor() as cur:
                cur.execute("SELECT 1")
                cur.fetchall()
        except Exception:
            _close(kept)
            kept = None
    if kept is None:
        conninfo = libpq_conninfo(database_url, application_name=APPLICATION_NAME)
        conn = connect(database_url)
        try:
            kept = (conn, adbc.connect(conninfo, autocommit=True))
        except BaseException:
            conn.close()
            raise
    _WORKER_CONNECTIONS[database_url] = kept
    return kept


def _close(connections: tuple[psycopg.Connection[Any], Any]) -> None:
    for c in connections:
        try:
            c.close()
        except Exception:
            pass  # already broken: nothing to release


def _arrow_batch(schema: pa.Schema, r: OffsetRange, rows: pa.RecordBatch) -> pa.RecordBatch:
    """The read's columns (key, value, offset, timestamp in ms, headers as stored JSON) as
    the source's: constants for topic, partition and timestampType, the timestamp in
    Spark's microseconds, headers decoded only where a record has some."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = rows.num_rows
    key, value, offset, timestamp, headers = rows.columns
    header_type = schema.field("headers").type
    if headers.null_count == n:
        decoded = pa.nulls(n, header_type)
    else:
        decoded = pa.array(
            [
                None if h is None else [{"key": k, "value": v} for k, v in headers_of_stored(h)]
                for h in headers.to_pylist()
            ],
            header_type,
        )
    columns = [
        key.cast(pa.binary()),
        value.cast(pa.binary()),
        pa.repeat(r.topic, n).cast(pa.string()),
        pa.repeat(pa.scalar(r.partition, pa.int32()), n),
        offset.cast(pa.int64()),
        pc.multiply(timestamp.cast(pa.int64()), 1000).cast(schema.field("timestamp").type),
        pa.repeat(pa.scalar(CREATE_TIME, pa.int32()), n),
        decoded,
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


class BatchReader(DataSourceReader):
    """``spark.read.format("kip98")``: one range per partition, or more with
    ``minPartitions``, from ``startingOffsets`` (or ``startingTimestamp``) to
    ``endingOffsets``, each capped at what the isolation level may see."""

    def __init__(self, options: SourceOptions, database_url: str) -> None:
        self.options = options
        self.settings = ReadSettings(
            database_url, options.read_committed, options.fail_on_data_loss
        )

    def partitions(self) -> list[InputPartition]:
        o = self.options
        with connect(self.settings.database_url) as conn:
            check_topics(conn, o.subscription)
            bounds = current_bounds(conn, o.subscription)
            start = resolve(
                conn, "startingOffsets", o.starting, bounds, o.read_committed, o.starting_timestamp
            )
            end = resolve(conn, "endingOffsets", o.ending, bounds, o.read_committed)
        ranges = []
        for tp, b in bounds.items():
            s, e = start[tp], min(end[tp], b.end(o.read_committed))
            if e < s and isinstance(o.ending, dict):
                raise bad_option(
                    "endingOffsets", f"{tp[0]}-{tp[1]}: ends at {end[tp]}, before its start {s}"
                )
            ranges.append(OffsetRange(tp[0], tp[1], s, e))
        return range_partitions(ranges, o.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        return read_ranges(self.settings, partition.ranges)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("kip98")``. Offsets are Spark's Kafka source's positions,
    checkpointed by Spark; each micro-batch ends, per partition, at most at its LSO
    (read_committed), within ``maxOffsetsPerTrigger`` shared among the partitions as
    Spark's Kafka source shares it. Partitions and topics that appear are picked up, from
    offset 0."""

    def __init__(self, options: SourceOptions, database_url: str) -> None:
        self.options = options
        self.settings = ReadSettings(
            database_url, options.read_committed, options.fail_on_data_loss
        )
        self._conn: psycopg.Connection[Any] | None = None
        self._target: Positions | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Pickled to the workers that read: no connection goes along.
        return {**self.__dict__, "_conn": None}

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.settings.database_url)
        return self._conn

    def _ends(self) -> Positions:
        conn = self._connection()
        bounds = current_bounds(conn, self.options.subscription)
        return {tp: b.end(self.options.read_committed) for tp, b in bounds.items()}

    def initialOffset(self) -> dict[str, Any]:
        o = self.options
        conn = self._connection()
        check_topics(conn, o.subscription)
        bounds = current_bounds(conn, o.subscription)
        start = resolve(
            conn, "startingOffsets", o.starting, bounds, o.read_committed, o.starting_timestamp
        )
        return to_json(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: read up to what is visible now, and no further."""
        self._target = self._ends()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = from_json(start)
        ends = self._ends()
        fail_on_loss = self.options.fail_on_data_loss
        for tp in sorted(set(begin) - set(ends)):
            data_loss(fail_on_loss, f"{tp[0]}-{tp[1]} no longer exists")
        for tp, e in sorted(ends.items()):
            if tp in begin and e < begin[tp]:
                data_loss(
                    fail_on_loss, f"{tp[0]}-{tp[1]}'s offsets went back from {begin[tp]} to {e}"
                )
        if self._target is not None:
            ends = {tp: min(e, self._target[tp]) for tp, e in ends.items() if tp in self._target}
        if isinstance(limit, ReadMaxRows):
            ends = rate_limit(limit.max_rows, begin, ends)
        return to_json(ends)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return to_json(self._ends())

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin, finish = from_json(start), from_json(end)
        ranges = [
            OffsetRange(t, p, begin.get((t, p), 0), e)
            for (t, p), e in sorted(finish.items())
            if e > begin.get((t, p), 0)
        ]
        return range_partitions(ranges, self.options.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        return read_ranges(self.settings, partition.ranges)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the offsets are Spark's to checkpoint, and the log keeps its
        records for every reader alike."""

    def stop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
