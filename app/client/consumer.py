"""The Consumer: confluent-kafka's API for reading partitions over the in-process broker.

Reads go through the Fetch handler, which filters by isolation level in SQL
(read_committed by default, as KIP-98 recommends for exactly-once pipelines). When
nothing is available, ``poll`` waits with a growing back-off rather than querying in a
tight loop; a newly committed record is still seen within the back-off's ceiling.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from app.broker import Broker
from app.client.closing import ClientClosedError
from app.client.connection import client_broker, is_connection_error
from app.client.fetcher import Fetcher
from app.client.message import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    Message,
    TopicPartition,
)
from app.config import CONSUMER, ClientConfig, parse_config
from app.errors import KafkaError, KafkaException, fail
from app.log.fetch import list_offsets
from app.protocol import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    ListOffsetsRequest,
)

# Idle back-off: start fast so a fresh record is picked up at once, grow to bound load.
IDLE_BACKOFF_MIN_S = 0.005
IDLE_BACKOFF_MAX_S = 0.1

MAX_CONSUME_MESSAGES = 1_000_000


class Consumer:
    """A consumer of explicitly assigned partitions.

    ``client.id`` becomes the PostgreSQL ``application_name`` of the consumer's own
    connections; the keyword-only ``broker`` replaces them with a given broker context.
    """

    def __init__(
        self, config: Mapping[str, Any] | None = None, *, broker: Broker | None = None
    ) -> None:
        self._config: ClientConfig = parse_config(CONSUMER, config)
        cfg = self._config
        self._owns_broker = broker is None
        self._broker = broker or client_broker(
            cfg.get_str("database.url"), cfg.get_str("client.id")
        )
        self._isolation_level = (
            READ_COMMITTED if cfg["isolation.level"] == "read_committed" else READ_UNCOMMITTED
        )
        self._request_timeout_s = cfg.get_int("request.timeout.ms") / 1000.0
        self._retry_backoff_s = cfg.get_int("retry.backoff.ms") / 1000.0
        self._fetcher = Fetcher(
            self._broker,
            isolation_level=self._isolation_level,
            max_partition_bytes=cfg.get_int("max.partition.fetch.bytes"),
            auto_offset_reset=str(cfg["auto.offset.reset"]),
            partition_eof=cfg.get_bool("enable.partition.eof"),
        )
        # Held for each call; released while poll waits, so other threads are not blocked.
        self._lock = threading.RLock()
        self._closed = False

    # --- assignment ----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("Consumer")

    def assign(self, partitions: list[TopicPartition]) -> None:
        """Replace the assignment. Each partition starts at its offset: absolute,
        OFFSET_BEGINNING, OFFSET_END, or (OFFSET_INVALID / OFFSET_STORED) per
        ``auto.offset.reset``."""
        self._check_open()
        entries = []
        for tp in partitions:
            if not isinstance(tp, TopicPartition):
                raise fail(KafkaError._INVALID_ARG, "assign() takes a list of TopicPartition")
            if tp.partition < 0:
                raise fail(
                    KafkaError._INVALID_ARG, f"invalid partition {tp.partition} for {tp.topic!r}"
                )
            entries.append((tp.topic, tp.partition, tp.offset))
        with self._lock:
            self._fetcher.assign(entries)

    def unassign(self) -> None:
        self._check_open()
        with self._lock:
            self._fetcher.assign([])

    def assignment(self) -> list[TopicPartition]:
        self._check_open()
        with self._lock:
            return [TopicPartition(t, p) for t, p in self._fetcher.cursors]

    # --- reading -------------------------------------------------------------------------

    def poll(self, timeout: float | None = None) -> Message | None:
        """The next record or event (``error()`` set: partition EOF, an offset that cannot
        be reset, ...), or None after ``timeout`` seconds (None or negative: wait forever)."""
        messages = self._consume(1, timeout)
        return messages[0] if messages else None

    def consume(self, num_messages: int = 1, timeout: float | None = None) -> list[Message]:
        """Up to ``num_messages``, waiting at most ``timeout`` seconds to fill the list (as
        librdkafka's batch consume does)."""
        if not isinstance(num_messages, int) or not 1 <= num_messages <= MAX_CONSUME_MESSAGES:
            raise ValueError(f"num_messages must be between 1 and {MAX_CONSUME_MESSAGES}")
        return self._consume(num_messages, timeout)

    def _consume(self, count: int, timeout: float | None) -> list[Message]:
        self._check_open()
        if timeout is not None and timeout < 0:
            timeout = None
        deadline = None if timeout is None else time.monotonic() + timeout
        result: list[Message] = []
        backoff = IDLE_BACKOFF_MIN_S
        while True:
            with self._lock:
                self._check_open()
                self._drain(result, count)
                if len(result) < count:
                    self._fetcher.fill()
                    before = len(result)
                    self._drain(result, count)
                    if len(result) > before:
                        backoff = IDLE_BACKOFF_MIN_S
            if len(result) >= count:
                return result
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return result
            pause = backoff if deadline is None else min(backoff, deadline - now)
            time.sleep(pause)
            backoff = min(backoff * 2, IDLE_BACKOFF_MAX_S)

    def _drain(self, into: list[Message], count: int) -> None:
        while len(into) < count:
            message = self._fetcher.next_message()
            if message is None:
                return
            into.append(message)

    # --- positions -----------------------------------------------------------------------

    def seek(self, partition: TopicPartition) -> None:
        """Move an assigned partition's position: absolute, OFFSET_BEGINNING or OFFSET_END
        (the LSO in read_committed). Takes effect at the next poll."""
        self._check_open()
        with self._lock:
            cursor = self._fetcher.cursors.get((partition.topic, partition.partition))
            if cursor is None:
                raise fail(
                    KafkaError._UNKNOWN_PARTITION,
                    f"{partition.topic} [{partition.partition}] is not assigned",
                )
            if partition.offset < 0 and partition.offset not in (OFFSET_BEGINNING, OFFSET_END):
                raise fail(KafkaError._INVALID_ARG, f"cannot seek to offset {partition.offset}")
            cursor.reset(partition.offset)

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """The offset of the next record poll() will return, per partition (OFFSET_INVALID
        when unassigned or not yet known)."""
        self._check_open()
        result = []
        with self._lock:
            for tp in partitions:
                cursor = self._fetcher.cursors.get((tp.topic, tp.partition))
                offset = cursor.position if cursor is not None else OFFSET_INVALID
                result.append(TopicPartition(tp.topic, tp.partition, offset))
        return result

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float | None = None, cached: bool = False
    ) -> tuple[int, int]:
        """(low, high): the log start offset and the high watermark. ``cached`` answers
        from the last fetch without a query (OFFSET_INVALID when none has happened)."""
        self._check_open()
        if cached:
            with self._lock:
                cursor = self._fetcher.cursors.get((partition.topic, partition.partition))
                if cursor is None:
                    return (OFFSET_INVALID, OFFSET_INVALID)
                return (cursor.low_watermark, cursor.high_watermark)
        deadline = time.monotonic() + (self._request_timeout_s if timeout is None else timeout)
        low = self._list_offset(partition, EARLIEST_TIMESTAMP, deadline)
        high = self._list_offset(partition, LATEST_TIMESTAMP, deadline)
        return (low, high)

    def _list_offset(self, tp: TopicPartition, timestamp: int, deadline: float) -> int:
        request = ListOffsetsRequest(tp.topic, tp.partition, timestamp, READ_UNCOMMITTED)
        while True:
            try:
                response = list_offsets(self._broker, request)
                break
            except Exception as exc:
                if not is_connection_error(exc):
                    raise
                if time.monotonic() + self._retry_backoff_s >= deadline:
                    raise fail(KafkaError._TIMED_OUT, f"database unreachable: {exc}") from exc
                time.sleep(self._retry_backoff_s)
        if response.error_code != KafkaError.NO_ERROR:
            raise KafkaException(KafkaError(response.error_code, response.error_message))
        return response.offset

    # --- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Stop reading and release the connections; later calls raise."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._fetcher.assign([])
        if self._owns_broker:
            self._broker.engine.dispose()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- for consumer groups --------------------------------------------------------------

    @property
    def broker(self) -> Broker:
        return self._broker

    @property
    def config(self) -> ClientConfig:
        return self._config

    @property
    def fetcher(self) -> Fetcher:
        """Per-partition cursors (positions) and the stored-offset hook, for group code."""
        return self._fetcher
