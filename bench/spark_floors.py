"""The kip98 data source's floors: what its speed could reach at most on this machine.

- source: a Python data source handing Spark ready Arrow batches of the source's schema
  from memory, in the tasks the kip98 source would plan for the same partitions; nothing
  read from PostgreSQL. What is left is Spark's Python data source path itself (the
  workers, their tasks, Arrow into the JVM's rows);
- sink: the Produce handler alone writing the same rows, no Spark and no Producer, in as
  many processes as the sink has tasks, each its share over the partitions in batches of
  5,000 records, as the sink's Producer sends them at most. What is left is kip98's write
  (the offsets' advance, the rows' COPY).

The memory source is registered with the bench's SparkSession; Spark's Python workers
import it from here (they start in the bench's working directory, the repository's root).
"""

from __future__ import annotations

import multiprocessing
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from app.broker import Broker
from app.broker.produce import produce
from app.log.topics import create_topic, delete_topic
from app.protocol import ProduceRequest, RecordIn
from app.spark.offsets import OffsetRange, pack_ranges
from app.spark.source import SCHEMA

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

MEMORY_FORMAT = "kip98-bench-memory"
VALUE_BYTES = 100
BATCH_ROWS = 10_000
HANDLER_BATCH = 5_000
_BATCHES: dict[int, Any] = {}


def _batch(rows: int) -> pa.RecordBatch:
    """One Arrow batch of the source's schema (made once per worker and size)."""
    if rows not in _BATCHES:
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        schema = to_arrow_schema(SCHEMA, timezone="UTC")
        columns = [
            pa.array([b"k%d" % i for i in range(rows)], pa.binary()),
            pa.array([b"x" * VALUE_BYTES] * rows, pa.binary()),
            pa.repeat("t", rows).cast(pa.string()),
            pa.repeat(pa.scalar(0, pa.int32()), rows),
            pa.array(range(rows), pa.int64()),
            pa.repeat(pa.scalar(0, pa.int64()), rows).cast(schema.field("timestamp").type),
            pa.repeat(pa.scalar(0, pa.int32()), rows),
            pa.nulls(rows, schema.field("headers").type),
        ]
        _BATCHES[rows] = pa.RecordBatch.from_arrays(columns, schema=schema)
    return _BATCHES[rows]


class _Task(InputPartition):
    def __init__(self, rows: int) -> None:
        super().__init__(rows)
        self.rows = rows


class _MemoryStream(DataSourceStreamReader):
    def __init__(self, records: int, partitions: int) -> None:
        self.records = records
        self.partitions_ = partitions

    def initialOffset(self) -> dict[str, int]:
        return {"rows": 0}

    def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:
        return {"rows": self.records}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        if end["rows"] <= start["rows"]:
            return []
        share = self.records // self.partitions_
        ranges = [OffsetRange("t", p, 0, share) for p in range(self.partitions_)]
        return [_Task(sum(r.size for r in t)) for t in pack_ranges(ranges, None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Task)
        full, rest = divmod(partition.rows, BATCH_ROWS)
        for _ in range(full):
            yield _batch(BATCH_ROWS)
        if rest:
            yield _batch(rest)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to keep."""


class MemorySource(DataSource):
    """``readStream.format("kip98-bench-memory")``: ``records`` rows over ``partitions``."""

    @classmethod
    def name(cls) -> str:
        return MEMORY_FORMAT

    def schema(self) -> Any:
        return SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _MemoryStream(int(self.options["records"]), int(self.options["partitions"]))


def memory_source_seconds(spark: SparkSession, records: int, partitions: int) -> float:
    """The memory source's micro-batch (``triggerExecution``) into ``noop``."""
    spark.dataSource.register(MemorySource)
    query = (
        spark.readStream.format(MEMORY_FORMAT)
        .option("records", str(records))
        .option("partitions", str(partitions))
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", f"/tmp/kip98-bench-{uuid.uuid4().hex}")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    return sum(p["durationMs"]["triggerExecution"] for p in batches) / 1000


def _handler_writer(
    url: str, topic: str, partitions: list[int], rows: int, ready: Any, go: Any, done: Any
) -> None:
    broker = Broker.connect(url)
    share = rows // len(partitions)
    batches = [
        ProduceRequest(
            topic,
            p,
            [
                RecordIn(b"%d" % i, b"x" * VALUE_BYTES, 0)
                for i in range(at, min(at + HANDLER_BATCH, share))
            ],
        )
        for p in partitions
        for at in range(0, share, HANDLER_BATCH)
    ]
    ready.set()
    go.wait()
    for request in batches:
        assert produce(broker, request).error_code == 0
    broker.engine.dispose()
    done.put(time.perf_counter())


def handler_write_seconds(url: str, records: int, partitions: int, writers: int) -> float:
    """``records`` rows written by the Produce handler in ``writers`` processes at once,
    each over its share of the partitions; from the start signal to the last one done."""
    broker = Broker.connect(url)
    topic = f"bench-floor-{uuid.uuid4().hex[:8]}"
    create_topic(broker, topic, partitions)
    context = multiprocessing.get_context("spawn")
    go, done = context.Event(), context.Queue()
    readies, processes = [], []
    for w in range(writers):
        ready = context.Event()
        mine = list(range(w, partitions, writers))
        process = context.Process(
            target=_handler_writer,
            args=(url, topic, mine, records // writers, ready, go, done),
        )
        process.start()
        readies.append(ready)
        processes.append(process)
    try:
        for ready in readies:
            ready.wait()
        started = time.perf_counter()
        go.set()
        finished = max(done.get(timeout=600) for _ in processes)
        for process in processes:
            process.join()
        return finished - started
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
        delete_topic(broker, topic)
        broker.engine.dispose()
