"""The ``kip98`` sink: ``df.writeStream.format("kip98")`` exactly once per micro-batch, and
``df.write.format("kip98")`` atomic per write.

Each Spark task writes its rows with a transactional Producer and leaves the transaction
open with every record in (``Producer.prepare_transaction``, KIP-939's prepare), handing
its identity to the driver in its commit message. The driver's commit of the batch ends
all of them in one DB transaction together with a row (query id, batch id) in
``spark_sink_commits`` (``app.broker.prepared``): the batch becomes visible to
read_committed readers at that commit, whole. Kafka's fencing does the rest:

- a task's transactional id is the query's prefix and its partition number, so a retried
  attempt of a task re-initialises the id, which fences and aborts what the earlier
  attempt left open;
- a replayed batch (a driver killed after the sink committed, before Spark's commit log
  noted it) finds its row: its tasks write nothing, and its commit aborts whatever is
  open instead of committing a second time;
- the driver's abort, and every commit, abort what the query left open under its prefix
  that no task handed over (a failed attempt, a killed driver's batch); a query that never
  comes back leaves its transactions to the coordinator's timeout
  (``transaction.timeout.ms``, 15 minutes by default: a batch's slowest task and its
  commit must fit in it, else the commit fails whole and the query replays the batch).

Spark runs a streaming query's micro-batches one after the other, and commits a batch
before the next one's tasks start; so when a batch commits, everything open under its
query's prefix is that batch's or a dead attempt's. (Spark's speculative execution would
let two attempts of a task race for one id: the later fences the earlier, and a commit
handed the earlier one fails whole. Leave it off for this sink, as it is by default.)
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import psycopg
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    StringType,
    StructType,
)
from sqlalchemy import Connection

from app.broker import Broker, principal_from_env
from app.broker.endpoint import client_engine
from app.broker.prepared import Ended, PreparedTxn, end_prepared
from app.client import Producer
from app.errors import KafkaError, fail
from app.faults import crash_point
from app.protocol import MetadataRequest, TopicMetadata
from app.settings import BrokerSettings
from app.spark import sql
from app.spark.murmur2 import partitions_of_keys
from app.spark.offsets import bad_option
from app.spark.options import SinkOptions
from app.storage.driver import libpq_conninfo

if TYPE_CHECKING:
    import pyarrow as pa

CLIENT_ID = "kip98-spark-sink"
SINK_PREFIX = "kip98-spark-sink"
WRITE_PREFIX = "kip98-spark-write"
# Spark's local properties a micro-batch's tasks carry.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"

_TEXT_OR_BINARY = (StringType, BinaryType)
# How long a task waits for deliveries when its Producer's local queue is full.
QUEUE_FULL_WAIT_S = 1.0
# Rows per ``produce_batch`` call: well within the local queue's room.
PRODUCE_ROWS = 10_000


def query_prefix(query_id: str) -> str:
    """Every transactional id of a streaming query's tasks starts with this."""
    return f"{SINK_PREFIX}-{query_id}-"


def write_prefix(write_id: str) -> str:
    return f"{WRITE_PREFIX}-{write_id}-"


def check_schema(schema: StructType, options: SinkOptions) -> None:
    """Spark's Kafka sink's columns, checked before anything runs: ``value`` (string or
    binary) required, ``key`` likewise optional, ``topic`` (string) unless the option
    names it, ``partition`` (int) and ``headers`` (array<struct<key string, value
    binary>>) optional. Other columns are ignored, as Spark's Kafka sink ignores them."""
    fields = {f.name.lower(): f.dataType for f in schema.fields}

    def check(name: str, allowed: tuple[type[DataType], ...], what: str) -> None:
        kind = fields.get(name)
        if kind is not None and not isinstance(kind, allowed):
            raise bad_option(name, f"column '{name}' must be {what}, not {kind.simpleString()}")

    if "value" not in fields:
        raise bad_option("value", "the sink needs a 'value' column (string or binary)")
    check("value", _TEXT_OR_BINARY, "string or binary")
    check("key", _TEXT_OR_BINARY, "string or binary")
    check("topic", (StringType,), "string")
    check("partition", (IntegerType,), "int")
    headers = fields.get("headers")
    if headers is not None and not (
        isinstance(headers, ArrayType)
        and isinstance(headers.elementType, StructType)
        and [f.name for f in headers.elementType.fields] == ["key", "value"]
        and isinstance(headers.elementType.fields[0].dataType, StringType)
        and isinstance(headers.elementType.fields[1].dataType, BinaryType)
    ):
        raise bad_option(
            "headers",
            "column 'headers' must be array<struct<key: string, value: binary>>, not "
            f"{headers.simpleString()}",
        )
    if options.topic is None and "topic" not in fields:
        raise bad_option("topic", "no 'topic' option and no 'topic' column")


def topic_metadata(broker: Broker, topic: str) -> TopicMetadata:
    """The topic as a Kafka producer's Metadata asks for it: one that does not exist is
    created if the broker auto-creates topics (the broker's one decision,
    ``app.log.topics.metadata``: KIP98_AUTO_CREATE_TOPICS, KIP98_NUM_PARTITIONS), as
    Spark's Kafka sink has its producer's topics created."""
    [found] = broker.handle(MetadataRequest([topic], allow_auto_topic_creation=True)).topics
    return found


def check_topic(database_url: str, topic: str | None) -> None:
    """The ``topic`` option must name a topic that exists or that the broker creates
    (rows' own topics are asked for as they are written: one that is missing and not
    created fails its task, and so the whole batch)."""
    if topic is None:
        return
    broker = sink_broker(database_url)
    try:
        found = topic_metadata(broker, topic)
    finally:
        broker.engine.dispose()
    if found.error_code == KafkaError.UNKNOWN_TOPIC_OR_PARTITION:
        raise fail(found.error_code, f"option 'topic': no such topic: {topic}")
    if found.error_code != KafkaError.NO_ERROR:
        raise fail(
            found.error_code,
            f"option 'topic': {topic}: {KafkaError(found.error_code).str()}",
        )


@dataclass
class TaskCommit(WriterCommitMessage):
    """What one task hands the driver: the transaction it left open (None if it wrote
    nothing), and for a streaming query the query and batch it wrote for."""

    query_id: str | None
    batch_id: int | None
    transactional_id: str | None
    producer_id: int = -1
    producer_epoch: int = -1
    rows: int = 0

    @property
    def prepared(self) -> PreparedTxn | None:
        if self.transactional_id is None:
            return None
        return PreparedTxn(self.transactional_id, self.producer_id, self.producer_epoch)


def sink_broker(database_url: str) -> Broker:
    """A broker context for the sink's clients, without a coordinator loop of their own:
    a task lives for one batch, and its open transaction must not be timed out by a loop
    it starts."""
    settings = replace(BrokerSettings.from_env(), client_coordinator_loop=0)
    return Broker(
        engine=client_engine(database_url, CLIENT_ID, settings, pool_size=2),
        settings=settings,
        principal=principal_from_env(),
    )


def write_rows(
    options: SinkOptions,
    database_url: str,
    batches: Iterator[pa.RecordBatch],
    transactional_id: str,
    query_id: str | None,
    batch_id: int | None,
) -> TaskCommit:
    """One task: its rows in a transaction of ``transactional_id``, left open."""
    first = next((b for b in batches if b.num_rows), None)
    if first is None:  # nothing to write: a task that writes nothing opens nothing
        return TaskCommit(query_id, batch_id, None)
    broker = sink_broker(database_url)
    config = {
        "transactional.id": transactional_id,
        "transaction.timeout.ms": options.transaction_timeout_ms,
        "client.id": CLIENT_ID,
    }
    producer = Producer(config, broker=broker)
    rows = RowWriter(producer, options.topic)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        n = 0
        try:
            for batch in _chain(first, batches):
                n += rows.write(batch)
            state = producer.prepare_transaction()
            crash_point("spark.sink.prepared")
        except BaseException:
            try:  # the batch will not commit: release the partitions' LSOs at once
                producer.abort_transaction(10)
            except Exception:
                pass  # fenced or unreachable: the driver's abort or the timeout ends it
            raise
        return TaskCommit(
            query_id, batch_id, transactional_id, state.producer_id, state.producer_epoch, n
        )
    finally:
        producer.close()
        broker.engine.dispose()


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


class RowWriter:
    """Rows of Arrow batches (columns as Spark's Kafka sink takes them) into the task's
    Producer, a partition's rows at a time (``Producer.produce_batch``).

    Each row goes where Kafka's producer would send it: its ``partition`` column when set
    (>= 0), else murmur2 of its key (``app.spark.murmur2``, column-wise, the same
    partitions as ``app.client.partitioner``), else, keyless, to one partition per Arrow
    batch, as Kafka's sticky partitioner keeps keyless records on one partition until a
    batch fills."""

    def __init__(self, producer: Producer, topic_option: str | None) -> None:
        self.producer = producer
        self.topic_option = topic_option
        self._counts: dict[str, int] = {}
        self._rng = random.Random()

    def write(self, batch: pa.RecordBatch) -> int:
        import pyarrow as pa
        import pyarrow.compute as pc

        names = [name.lower() for name in batch.schema.names]
        column = _columns_of(batch, names)
        if self.topic_option:
            self._write_topic(self.topic_option, batch, column)
            return batch.num_rows
        topics = column("topic")
        if topics is None or topics.null_count or pc.any(pc.equal(topics, "")).as_py():
            raise fail(
                KafkaError._INVALID_ARG,
                "a row has no topic: set the 'topic' option or give every row a 'topic'",
            )
        for topic in pc.unique(topics).to_pylist():
            rows = batch.filter(pc.equal(topics, pa.scalar(topic, topics.type)))
            self._write_topic(topic, rows, _columns_of(rows, names))
        return batch.num_rows

    def _write_topic(self, topic: str, batch: pa.RecordBatch, column: Any) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        count = self._partition_count(topic)
        keys, values = _binary(column("key")), _binary(column("value"))
        assert values is not None
        chosen = column("partition")
        if chosen is not None:  # a negative partition is the partitioner's to choose
            chosen = pc.if_else(pc.less(chosen, 0), pa.scalar(None, pa.int32()), chosen)
        if chosen is None or chosen.null_count:
            sticky = pa.repeat(pa.scalar(self._rng.randrange(count), pa.int32()), len(values))
            hashed = None if keys is None else partitions_of_keys(keys, count)
            chosen = pc.coalesce(*(c for c in (chosen, hashed) if c is not None), sticky)
        headers = column("headers")
        for partition in pc.unique(chosen).to_pylist():
            mask = pc.equal(chosen, partition)
            self._produce(
                topic,
                partition,
                values.filter(mask).to_pylist(),
                None if keys is None else keys.filter(mask).to_pylist(),
                None if headers is None else _headers(headers.filter(mask).to_pylist()),
            )

    def _produce(
        self,
        topic: str,
        partition: int,
        values: list[bytes | None],
        keys: list[bytes | None] | None,
        headers: list[Any] | None,
    ) -> None:
        for at in range(0, len(values), PRODUCE_ROWS):
            part = slice(at, at + PRODUCE_ROWS)
            while True:
                try:
                    self.producer.produce_batch(
                        topic,
                        partition,
                        values[part],
                        None if keys is None else keys[part],
                        None if headers is None else headers[part],
                    )
                    break
                except BufferError:  # the local queue is full: wait for deliveries
                    self.producer.flush(QUEUE_FULL_WAIT_S)
        self.producer.poll(0)

    def _partition_count(self, topic: str) -> int:
        count = self._counts.get(topic)
        if count is None:
            found = topic_metadata(self.producer.broker, topic)
            if found.error_code != KafkaError.NO_ERROR:
                raise fail(
                    found.error_code, f"topic {topic!r}: {KafkaError(found.error_code).str()}"
                )
            count = self._counts[topic] = found.num_partitions
        return count


def _columns_of(batch: pa.RecordBatch, names: list[str]) -> Any:
    def column(name: str) -> pa.Array | None:
        return batch.column(names.index(name)) if name in names else None

    return column


def _binary(array: pa.Array | None) -> pa.Array | None:
    """A key or value column as binary (a string column's UTF-8 bytes)."""
    import pyarrow as pa

    if array is None or array.type == pa.binary():
        return array
    return array.cast(pa.binary())


def _headers(rows: list[Any]) -> list[Any]:
    return [None if h is None else [(e["key"], e["value"]) for e in h] for h in rows]


def already_committed(database_url: str, query_id: str, batch_id: int) -> bool:
    with psycopg.connect(libpq_conninfo(database_url)) as conn:
        row = conn.execute(
            sql.SINK_BATCH_COMMITTED, {"query_id": query_id, "batch_id": batch_id}
        ).fetchone()
    return row is not None


def claim_batch(query_id: str, batch_id: int, rows: int) -> Any:
    """The claim ``end_prepared`` runs first in its DB transaction: records (query, batch),
    True if it was not recorded before."""

    def claim(conn: Connection) -> bool:
        found = conn.execute(
            sql.CLAIM_SINK_BATCH, {"query_id": query_id, "batch_id": batch_id, "rows": rows}
        ).first()
        return found is not None

    return claim


def end_batch(
    database_url: str,
    messages: Sequence[WriterCommitMessage | None],
    commit: bool,
    batch_id: int | None = None,
    prefix: str | None = None,
) -> Ended | None:
    """The driver's commit (or abort) of one batch's tasks."""
    handed = [m for m in messages if isinstance(m, TaskCommit)]
    queries = {m.query_id for m in handed if m.query_id is not None}
    if len(queries) > 1:
        raise fail(KafkaError.INVALID_REQUEST, f"one batch written for several queries: {queries}")
    query_id = next(iter(queries), None)
    if query_id is not None:
        prefix = query_prefix(query_id)
        stale = [m.batch_id for m in handed if m.batch_id != batch_id]
        if stale:
            raise fail(KafkaError.INVALID_REQUEST, f"batch {batch_id} handed tasks of {stale}")
    if prefix is None:
        return None  # nothing written under a known prefix: nothing to end
    prepared = [p for p in (m.prepared for m in handed) if p is not None]
    claim = None
    if commit:
        if query_id is not None and batch_id is not None:
            claim = claim_batch(query_id, batch_id, sum(m.rows for m in handed))
        else:
            claim = _always
    broker = sink_broker(database_url)
    try:
        return end_prepared(broker, prepared, claim, strays=prefix)
    finally:
        broker.engine.dispose()


def _always(_conn: Connection) -> bool:
    return True


class StreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("kip98")``: exactly once per micro-batch."""

    def __init__(self, options: SinkOptions, database_url: str) -> None:
        self.options = options
        self.database_url = database_url

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskCommit:
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
        batch = context.getLocalProperty(BATCH_ID_PROPERTY)
        if query_id is None or batch is None:
            raise fail(KafkaError._STATE, "a streaming write outside a micro-batch")
        batch_id = int(batch)
        if already_committed(self.database_url, query_id, batch_id):
            return TaskCommit(query_id, batch_id, None)  # a replay: written once already
        tid = query_prefix(query_id) + str(context.partitionId())
        return write_rows(self.options, self.database_url, iterator, tid, query_id, batch_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        crash_point("spark.sink.commit")
        end_batch(self.database_url, messages, True, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        end_batch(self.database_url, messages, False, batchId)


class BatchWriter(DataSourceArrowWriter):
    """``df.write.format("kip98")``: the whole write visible at once, or nothing."""

    def __init__(self, options: SinkOptions, database_url: str) -> None:
        self.options = options
        self.database_url = database_url
        self.write_id = uuid.uuid4().hex  # made on the driver, pickled to every task

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskCommit:
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None
        tid = write_prefix(self.write_id) + str(context.partitionId())
        return write_rows(self.options, self.database_url, iterator, tid, None, None)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        end_batch(self.database_url, messages, True, prefix=write_prefix(self.write_id))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        end_batch(self.database_url, messages, False, prefix=write_prefix(self.write_id))
