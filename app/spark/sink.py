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
from app.settings import BrokerSettings
from app.spark import sql
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


def check_topic(database_url: str, topic: str | None) -> None:
    """The ``topic`` option must name a topic that exists (rows' own topics are checked
    as they are written: a missing one fails its task, and so the whole batch)."""
    if topic is None:
        return
    with psycopg.connect(libpq_conninfo(database_url)) as conn:
        found = conn.execute(sql.EXISTING_TOPICS, {"topics": [topic]}).fetchall()
    if not found:
        raise fail(KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"option 'topic': no such topic: {topic}")


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
    try:
        producer.init_transactions()
        producer.begin_transaction()
        n = 0
        try:
            for batch in _chain(first, batches):
                n += _produce_batch(producer, options.topic, batch)
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


def _column(batch: pa.RecordBatch, name: str) -> list[Any]:
    """A column as Python values (bytes for binary, str encoded), or Nones if absent."""
    names = [n.lower() for n in batch.schema.names]
    if name not in names:
        return [None] * batch.num_rows
    values = batch.column(names.index(name)).to_pylist()
    if name in ("key", "value"):
        return [v.encode() if isinstance(v, str) else v for v in values]
    return values


def _produce_batch(producer: Producer, topic_option: str | None, batch: pa.RecordBatch) -> int:
    """One Arrow batch of rows, each a record (columns as Spark's Kafka sink takes them)."""
    keys, values = _column(batch, "key"), _column(batch, "value")
    partitions, headers = _column(batch, "partition"), _column(batch, "headers")
    topics = [topic_option] * batch.num_rows if topic_option else _column(batch, "topic")
    produce = producer.produce
    for topic, key, value, partition, header in zip(
        topics, keys, values, partitions, headers, strict=True
    ):
        if not topic:
            raise fail(
                KafkaError._INVALID_ARG,
                "a row has no topic: set the 'topic' option or give every row a 'topic'",
            )
        record = {
            "key": key,
            "partition": -1 if partition is None else partition,
            "headers": None if header is None else [(h["key"], h["value"]) for h in header],
        }
        try:
            produce(topic, value, **record)
        except BufferError:  # the local queue is full: wait for deliveries, as with librdkafka
            producer.flush(QUEUE_FULL_WAIT_S)
            produce(topic, value, **record)
    producer.poll(0)
    return batch.num_rows


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
