"""The Producer: confluent-kafka's API over the in-process broker.

``produce()`` only validates, picks a partition and queues the record; the sender thread
(``app.client.sender``) batches and sends, and delivery reports come back through
``poll()``/``flush()`` on the caller's thread. Idempotence is on by default: the producer
asks for a producer_id at construction and every batch carries sequence numbers, so the
retries that a lost connection forces never duplicate a record.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from itertools import repeat
from typing import Any, TypeVar

from app.broker import Broker
from app.client.batching import (
    Batch,
    BatchLimits,
    DeliveryCallback,
    PendingRecords,
    ProducerIdentity,
    RecordAccumulator,
)
from app.client.closing import ClientClosedError, Closing
from app.client.connection import configured_broker, retry_connection_loss
from app.client.delivery import DeliveryReports
from app.client.handoff import HANDOFF_INTERVAL_S, hand_off
from app.client.message import HeadersIn, TopicPartition, normalize_headers, to_bytes
from app.client.partitioner import KeylessPartitioner, choose_partition
from app.client.sender import Sender
from app.client.transactions import PreparedTxnState, Transactions, TxnSettings
from app.client.txn_manager import IN_TRANSACTION
from app.config import PRODUCER, ClientConfig, parse_config
from app.errors import KafkaError, KafkaException, fail
from app.protocol import (
    RECORD_OVERHEAD_BYTES,
    InitProducerIdRequest,
    MetadataRequest,
    RecordFields,
    record_size_bytes,
    stored_headers,
)

R = TypeVar("R")

# The most sender lanes (requests in flight at once) a producer runs, whatever
# ``max.in.flight`` says: past the cores PostgreSQL has, more commits at once merge no
# more WAL flushes, and each lane holds a connection.
MAX_LANES = 8


class Producer(Closing):
    """An asynchronous, by default idempotent, producer.

    Partition choice follows confluent-kafka: an explicit ``partition`` must exist
    (``KafkaException(_UNKNOWN_PARTITION)`` from ``produce()`` otherwise); keyed records
    go to Kafka's murmur2 partition of the key; keyless records stick to one partition
    until its batch fills or is sent (KIP-480). A topic that does not exist is created, as
    librdkafka asks the broker to (``allow.auto.create.topics``, true by default, and the
    broker's KIP98_AUTO_CREATE_TOPICS); where it is not, producing to it is not an
    exception: the record is accepted and its delivery report carries
    ``UNKNOWN_TOPIC_OR_PARTITION``, as a librdkafka application sees when the broker does
    not auto-create topics, so code that handles delivery errors in one place keeps working.

    ``client.id`` becomes the PostgreSQL ``application_name`` of the producer's own
    connections. The keyword-only ``broker`` replaces those connections with a given
    broker context (tests, embedding with a manual clock).
    """

    def __init__(
        self, config: Mapping[str, Any] | None = None, *, broker: Broker | None = None
    ) -> None:
        self._config: ClientConfig = parse_config(PRODUCER, config)
        cfg = self._config
        lanes = min(cfg.get_int("max.in.flight.requests.per.connection"), MAX_LANES)
        # A connection per lane, and one for the caller's own requests.
        self._broker, self._owns_broker = configured_broker(cfg, broker, pool_size=lanes + 1)
        self.transactional_id: str | None = cfg.get_str("transactional.id")
        self._idempotent = cfg.get_bool("enable.idempotence")
        self._default_callback: DeliveryCallback | None = cfg.get_callable("on_delivery")
        self._partitioner_name = str(cfg["partitioner"])
        # librdkafka's producer asks the broker to create an unknown topic by default.
        self._auto_create = cfg.get_bool("allow.auto.create.topics")
        self._max_message_bytes = cfg.get_int("message.max.bytes")
        self._queue_max_messages = cfg.get_int("queue.buffering.max.messages")
        self._queue_max_bytes = cfg.get_int("queue.buffering.max.kbytes") * 1024
        self._request_timeout_s = cfg.get_int("request.timeout.ms") / 1000.0
        self._retry_backoff_s = cfg.get_int("retry.backoff.ms") / 1000.0
        self._transaction_timeout_ms = cfg.get_int("transaction.timeout.ms")
        self._now_ms = self._broker.clock.now_ms
        timeout_ms = cfg.get_int("message.timeout.ms")

        self._keyless = KeylessPartitioner()
        self._partitions: dict[str, int] = {}
        self._metadata_lock = threading.Lock()
        self._closed = False
        self._handoff_at = 0.0  # when produce() may next give the GIL to a sender thread

        batch_bytes = min(cfg.get_int("batch.size"), self._broker.settings.message_max_bytes)
        self._accumulator = RecordAccumulator(
            BatchLimits(
                max_records=cfg.get_int("batch.num.messages"),
                max_bytes=batch_bytes,
                linger_s=cfg.get_int("linger.ms") / 1000.0,
            ),
            lanes,
        )
        self._reports = DeliveryReports(self._accumulator.lock)
        identity = ProducerIdentity()
        if self._idempotent and self.transactional_id is None:
            try:
                identity = self._new_identity()
            except BaseException:
                if self._owns_broker:
                    self._broker.engine.dispose()
                raise
        self._sender = Sender(
            self._broker,
            self._accumulator,
            self._reports,
            identity=identity,
            require_identity=self._idempotent,
            retry_backoff_s=self._retry_backoff_s,
            message_timeout_s=timeout_ms / 1000.0 if timeout_ms else None,
            max_retries=cfg.get_int("retries"),
            acks=cfg.get_int("acks"),
            identity_provider=self._new_identity if self.transactional_id is None else None,
            on_batch_formed=self._batch_formed,
        )
        self._txn: Transactions | None = None
        if self.transactional_id is not None:
            settings = TxnSettings(
                self.transactional_id,
                self._transaction_timeout_ms,
                self._request_timeout_s,
                self._retry_backoff_s,
            )
            self._txn = Transactions(
                self._broker,
                settings,
                self._sender,
                flush=self.flush,
                await_delivery=self._await_delivery,
            )
        self._sender.start()

    # --- identity and metadata -----------------------------------------------------------

    def _new_identity(self) -> ProducerIdentity:
        """InitProducerId without a transactional id: a fresh producer_id at epoch 0."""
        request = InitProducerIdRequest(None, self._transaction_timeout_ms)
        response = self._call_with_retries(lambda: self._broker.handle(request))
        if response.error_code != KafkaError.NO_ERROR:
            raise KafkaException(KafkaError(response.error_code, response.error_message))
        return ProducerIdentity(response.producer_id, response.producer_epoch)

    def _call_with_retries(self, call: Callable[[], R]) -> R:
        """Retry a request across lost connections until request.timeout.ms."""
        deadline = time.monotonic() + self._request_timeout_s
        return retry_connection_loss(call, deadline, self._retry_backoff_s)

    def _partition_count(self, topic: str) -> int | KafkaError:
        """Partitions of ``topic``, cached once known; else why its records cannot go
        there (it does not exist, or this principal may not describe it), which they are
        failed with, as librdkafka fails the records of such a topic in their reports."""
        known = self._partitions.get(topic)  # a dict read needs no lock; misses take it below
        if known is not None:
            return known
        request = MetadataRequest([topic], allow_auto_topic_creation=self._auto_create)
        [found] = self._call_with_retries(lambda: self._broker.handle(request)).topics
        if found.error_code == KafkaError.UNKNOWN_TOPIC_OR_PARTITION:
            return KafkaError(found.error_code, f"topic {topic!r} does not exist")
        if found.error_code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            return KafkaError(found.error_code, f"not authorized to describe topic {topic!r}")
        if found.error_code != KafkaError.NO_ERROR:
            raise KafkaException(KafkaError(found.error_code))
        count = found.num_partitions
        with self._metadata_lock:
            self._partitions[topic] = count
        return count

    def _batch_formed(self, batch: Batch) -> None:
        count = self._partitions.get(batch.topic)
        if count is not None:
            self._keyless.batch_sent(batch.topic, batch.partition, count)

    # --- producing -----------------------------------------------------------------------

    def produce(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int = -1,
        on_delivery: DeliveryCallback | None = None,
        timestamp: int = 0,
        headers: HeadersIn = None,
        *,
        callback: DeliveryCallback | None = None,
    ) -> None:
        """Queue one record; raises BufferError when the local queue is full (serve
        delivery reports with ``poll()`` and try again), KafkaException for a bad argument,
        an unknown partition or a record above ``message.max.bytes``.

        This runs once per record on the application's thread, whose CPU the sender's
        work and the delivery reports wait for (the GIL), so the common case (bytes or
        str, no headers, a topic already seen) takes the shortest path: type checks
        instead of conversions, the size summed in place, one tuple and one call into
        the accumulator under one lock, no object the garbage collector keeps tracking
        (``PendingRecords``).
        """
        if self._closed:
            raise ClientClosedError("Producer")
        # A topic found in the cache was validated when it was first produced to.
        count = self._partitions.get(topic) if type(topic) is str else None
        if count is None and (not isinstance(topic, str) or not topic or "\x00" in topic):
            raise fail(KafkaError._INVALID_ARG, "topic must be a non-empty str without NUL")
        txn = self._txn
        if txn is not None and txn.manager.state != IN_TRANSACTION:
            txn.check_can_produce()
        if key is not None and type(key) is not bytes:
            key = to_bytes("key", key)
        if value is not None and type(value) is not bytes:
            value = to_bytes("value", value)
        # Sized as the broker sizes it (record_size_bytes), so a batch the client forms is
        # never refused as too big.
        if headers is None:
            stored = None
            size = RECORD_OVERHEAD_BYTES + (len(key) if key else 0) + (len(value) if value else 0)
        else:
            stored = stored_headers(normalize_headers(headers)) or None
            size = record_size_bytes(key, value, stored)
        if size > self._max_message_bytes:
            raise fail(
                KafkaError.MSG_SIZE_TOO_LARGE,
                f"record of {size} bytes exceeds message.max.bytes={self._max_message_bytes}",
            )
        if timestamp <= 0:
            if timestamp < 0:
                raise fail(KafkaError._INVALID_ARG, f"invalid timestamp {timestamp}")
            timestamp = self._now_ms()
        record: RecordFields = (key, value, timestamp, stored)
        if count is None:
            known = self._partition_count(topic)
            if isinstance(known, KafkaError):
                self._reports.accepted()
                run = PendingRecords.one(record, on_delivery or callback, time.monotonic(), size)
                self._reports.push_one(topic, partition, run, -1, known)
                return
            count = known
        if partition is None or partition < 0:
            partition = choose_partition(self._partitioner_name, key, topic, count, self._keyless)
        elif partition >= count:
            raise fail(
                KafkaError._UNKNOWN_PARTITION,
                f"partition {partition} does not exist: {topic!r} has {count} partitions",
            )
        accumulator = self._accumulator
        reports = self._reports  # sharing the accumulator's lock: ``outstanding`` is ours here
        with accumulator.lock:
            outstanding = reports.outstanding
            if outstanding >= self._queue_max_messages or (
                outstanding and accumulator.queued_bytes + size > self._queue_max_bytes
            ):
                raise BufferError("Local: Queue full")
            reports.outstanding = outstanding + 1
            # Enqueued times taken under the lock are in queue order, as expiry reads them.
            filled = accumulator.append(
                topic, partition, record, size, on_delivery or callback, now := time.monotonic()
            )
        if filled:
            self._keyless.batch_sent(topic, partition, count)
        if accumulator.requests_out and now >= self._handoff_at:
            # A sender thread will want the GIL back for its answer (app/client/handoff.py).
            self._handoff_at = now + HANDOFF_INTERVAL_S
            hand_off(0)

    def produce_batch(
        self,
        topic: str,
        partition: int,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[HeadersIn] | None = None,
    ) -> None:
        """Queue many records for one partition in one call, as librdkafka's
        ``rd_kafka_produce_batch``: one check of the local queue's room for all of them
        (BufferError if it has none, with nothing queued), the records in the batches
        ``produce()`` would form, timestamped now. No per-record callback: the config's
        ``on_delivery``, if set, reports each record as for ``produce()``.

        For callers holding rows by the thousand (Spark's kip98 sink): ``produce()``'s
        per-call checks, partitioner and lock, a few microseconds each, cost more than the
        record's write."""
        if self._closed:
            raise ClientClosedError("Producer")
        txn = self._txn
        if txn is not None and txn.manager.state != IN_TRANSACTION:
            txn.check_can_produce()
        count = self._partition_count(topic) if isinstance(topic, str) and topic else None
        if count is None:
            raise fail(KafkaError._INVALID_ARG, "topic must be a non-empty str without NUL")
        if isinstance(count, KafkaError):
            raise KafkaException(count)
        if not 0 <= partition < count:
            raise fail(
                KafkaError._UNKNOWN_PARTITION,
                f"partition {partition} does not exist: {topic!r} has {count} partitions",
            )
        n = len(values)
        keys = [None] * n if keys is None else keys
        if len(keys) != n or (headers is not None and len(headers) != n):
            raise fail(KafkaError._INVALID_ARG, "values, keys and headers differ in length")
        timestamp = self._now_ms()
        if headers is None and _all_bytes(values) and _all_bytes(keys):
            # The common case at C speed: bytes (or None) without headers.
            sizes = [
                RECORD_OVERHEAD_BYTES + k + v
                for k, v in zip(_lengths(keys), _lengths(values), strict=True)
            ]
            records: list[RecordFields] = list(
                zip(keys, values, repeat(timestamp), repeat(None), strict=False)
            )
        else:
            records, sizes = [], []
            for i, (key, value) in enumerate(zip(keys, values, strict=True)):
                if key is not None and type(key) is not bytes:
                    key = to_bytes("key", key)
                if value is not None and type(value) is not bytes:
                    value = to_bytes("value", value)
                header = None if headers is None else headers[i]
                stored = (
                    None if header is None else stored_headers(normalize_headers(header)) or None
                )
                records.append((key, value, timestamp, stored))
                sizes.append(record_size_bytes(key, value, stored))
        if sizes and max(sizes) > self._max_message_bytes:
            raise fail(
                KafkaError.MSG_SIZE_TOO_LARGE,
                f"a record of {max(sizes)} bytes exceeds "
                f"message.max.bytes={self._max_message_bytes}",
            )
        if not records:
            return
        accumulator = self._accumulator
        reports = self._reports
        with accumulator.lock:
            outstanding = reports.outstanding
            if outstanding + n > self._queue_max_messages or (
                outstanding and accumulator.queued_bytes + sum(sizes) > self._queue_max_bytes
            ):
                raise BufferError("Local: Queue full")
            reports.outstanding = outstanding + n
            accumulator.append_many(topic, partition, records, sizes, time.monotonic())

    # --- serving delivery reports ---------------------------------------------------------

    def poll(self, timeout: float | None = 0) -> int:
        """Serve ready delivery reports, waiting up to ``timeout`` seconds for the first
        (None or negative: without limit). Returns how many callbacks were served."""
        if timeout is not None and timeout < 0:
            timeout = None
        return self._reports.serve(timeout, self._default_callback)

    def flush(self, timeout: float | None = None) -> int:
        """Send everything now (ignoring linger.ms) and serve reports until none is
        outstanding or ``timeout`` passes. Returns the messages still outstanding."""
        with self._accumulator.cond:
            self._accumulator.flushing += 1
            self._accumulator.cond.notify_all()
        try:
            return self._await_delivery(timeout)
        finally:
            with self._accumulator.cond:
                self._accumulator.flushing -= 1

    def _await_delivery(self, timeout: float | None) -> int:
        """Serve reports until none is outstanding or ``timeout`` passes (``flush`` without
        hurrying the sender: for a commit whose batches all went out already)."""
        if timeout is not None and timeout < 0:
            timeout = None
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(self._reports):
            remaining = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
            if remaining <= 0:
                break
            self._reports.serve(remaining, self._default_callback)
        return len(self._reports)

    def __len__(self) -> int:
        """Messages produced whose delivery report has not been served yet."""
        return len(self._reports)

    # --- lifecycle ------------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> int:
        """Flush, then stop the sender and release the connections. Returns the messages
        that could not be delivered in time (their reports say _DESTROY)."""
        if self._closed:
            return 0
        remaining = self.flush(timeout)
        self._closed = True
        self._sender.stop()
        if self._txn is not None:
            self._txn.close()
        self._reports.serve(0, self._default_callback)
        if self._owns_broker:
            self._broker.engine.dispose()
        return remaining

    # --- transactions (transactional.id set) ---------------------------------------------

    def _transactions(self) -> Transactions:
        if self._closed:
            raise ClientClosedError("Producer")
        if self._txn is None:
            raise fail(KafkaError._NOT_CONFIGURED, "transactional.id is not configured")
        return self._txn

    def init_transactions(self, timeout: float | None = None) -> None:
        """Get this transactional id's producer identity, fencing older instances and
        completing or aborting whatever they left open."""
        self._transactions().init_transactions(timeout)

    def begin_transaction(self) -> None:
        self._transactions().begin_transaction()

    def send_offsets_to_transaction(
        self, positions: list[TopicPartition], group_metadata: Any, timeout: float | None = None
    ) -> None:
        """Commit the consumer's positions (next offsets to read) with this transaction;
        entries with negative offsets are ignored."""
        self._transactions().send_offsets_to_transaction(positions, group_metadata, timeout)

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Flush, then commit: when this returns, the markers are written."""
        self._transactions().commit_transaction(timeout)

    def prepare_transaction(self, timeout: float | None = None) -> PreparedTxnState:
        """Deliver every record of the open transaction and leave it open (KIP-939's
        two-phase commit): its (producer_id, producer_epoch) is returned for an external
        decider to end it with, and the producer is then closed. A later
        init_transactions() of the same id fences and aborts it, as with any instance."""
        return self._transactions().prepare_transaction(timeout)

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Drop unsent records, wait for in-flight ones, then abort. Refused (_STATE, not
        fatal) once commit_transaction() has started, unless it failed abortably: a commit
        that timed out may have committed, and only calling it again can tell."""
        self._transactions().abort_transaction(timeout)

    # --- for the transaction manager -----------------------------------------------------

    @property
    def sender(self) -> Sender:
        return self._sender

    @property
    def broker(self) -> Broker:
        return self._broker

    @property
    def config(self) -> ClientConfig:
        return self._config


def _all_bytes(items: Sequence[Any]) -> bool:
    """Whether every item is bytes or None (one pass in C)."""
    return set(map(type, items)) <= {bytes, type(None)}


def _lengths(items: Sequence[bytes | None]) -> list[int]:
    """Each item's length, None counted 0."""
    try:
        return list(map(len, items))  # type: ignore[arg-type]
    except TypeError:  # some are None
        return [0 if item is None else len(item) for item in items]
