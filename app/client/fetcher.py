"""The consumer's read path: one cursor per assigned partition, prefetched in bulk.

A cursor's ``fetch_offset`` is where its next Fetch starts; it moves to the response's
``next_offset``, which already steps over control records and aborted transactions, so
the consumer's position never stops on an offset the application cannot be given.
A fetch's records wait in the cursor's buffer as they came (plain tuples, which the
garbage collector soon stops tracking) and are handed out one partition at a time in
turn, so a busy partition cannot starve a quiet one. A fill's fetches share fetch.max.bytes
as one Kafka Fetch request's partitions do, the next fill starting after the last partition
that got records, so a busy partition cannot take every fill's bytes either. Nothing on this path runs Python
code per record but the Message constructor, called only as records are handed out:
Messages that live briefly keep the collector's older generations small, where a buffer
full of them made it sweep the whole heap again and again. Positions (what commits will
store) are derived from the cursors, nowhere else.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import zip_longest

from app.broker import Broker
from app.client.connection import is_connection_error, raise_as_kafka
from app.client.message import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    OFFSET_STORED,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    FetchedMessage,
    Message,
)
from app.config import ClientConfig
from app.errors import KafkaError
from app.protocol import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    RECORD_OFFSET,
    FetchRequest,
    ListOffsetsRequest,
    RecordOut,
    payload_bytes,
)

log = logging.getLogger(__name__)

RESET_EARLIEST = "earliest"
RESET_ERROR = "error"

# A cursor whose offset is one of these has yet to learn where to start.
LOGICAL_OFFSETS = frozenset({OFFSET_BEGINNING, OFFSET_END, OFFSET_INVALID, OFFSET_STORED})

# Given (topic, partition), the committed offset to start from, if any (consumer groups).
StoredOffsetLookup = Callable[[str, int], int | None]


class StoredOffsetPending(Exception):
    """Raised by a stored-offset lookup that cannot answer yet: transactional offsets are
    pending for the partition (KIP-447). The cursor stays unresolved and asks again at the
    next fill, rather than falling back to auto.offset.reset."""


@dataclass(slots=True)
class PartitionCursor:
    topic: str
    partition: int
    fetch_offset: int
    # Fetched records not yet handed out: buffer[taken:] (slicing a list beats popping).
    buffer: list[RecordOut] = field(default_factory=list)
    taken: int = 0
    low_watermark: int = OFFSET_INVALID
    high_watermark: int = OFFSET_INVALID
    last_stable_offset: int = OFFSET_INVALID
    # The bound the last fetch read up to (LSO or high watermark): the partition's end.
    end_offset: int | None = None
    eof_reported: bool = False
    # An error event waiting to be returned, and whether fetching is stopped until a seek.
    event: Message | None = None
    stalled: bool = False
    reported_error: int | None = None
    # How its records' timestamps were given: by the producer, or by the append (the
    # topic's message.timestamp.type, as the last fetch found it).
    timestamp_type: int = TIMESTAMP_CREATE_TIME

    @property
    def resolved(self) -> bool:
        return self.fetch_offset not in LOGICAL_OFFSETS

    @property
    def has_buffered(self) -> bool:
        return self.taken < len(self.buffer)

    @property
    def position(self) -> int:
        """The offset of the next record the application will get."""
        if self.has_buffered:
            return self.buffer[self.taken][RECORD_OFFSET]
        return self.fetch_offset if self.resolved else OFFSET_INVALID

    def take(self, count: int) -> list[Message]:
        """Up to ``count`` buffered records as messages, in offset order."""
        start = self.taken
        chunk = self.buffer[start : start + count]
        self.taken = start + len(chunk)
        if self.taken == len(self.buffer):
            self.buffer, self.taken = [], 0
        topic, partition, kind = self.topic, self.partition, self.timestamp_type
        return [FetchedMessage(topic, partition, record, kind) for record in chunk]

    def reset(self, offset: int) -> None:
        self.fetch_offset = offset
        self.buffer, self.taken = [], 0
        self.end_offset = None
        self.eof_reported = False
        self.event = None
        self.stalled = False
        self.reported_error = None

    def error_event(self, error: KafkaError, stall: bool = False) -> None:
        """Queue an error for the application, once per kind until the partition recovers."""
        self.stalled = self.stalled or stall
        if self.reported_error == error.code():
            return
        self.reported_error = error.code()
        self.event = Message(
            topic=self.topic, partition=self.partition, offset=self.position, error=error
        )


@dataclass(frozen=True)
class FetchSettings:
    """The consumer's fetch configuration, read once from its config."""

    isolation_level: int
    max_partition_bytes: int
    auto_offset_reset: str
    partition_eof: bool
    # fetch.max.bytes: what one fill may bring in over all partitions.
    max_bytes: int = 52_428_800

    @classmethod
    def from_config(cls, cfg: ClientConfig) -> FetchSettings:
        read_committed = cfg["isolation.level"] == "read_committed"
        return cls(
            isolation_level=READ_COMMITTED if read_committed else READ_UNCOMMITTED,
            max_partition_bytes=cfg.get_int("max.partition.fetch.bytes"),
            max_bytes=cfg.get_int("fetch.max.bytes"),
            auto_offset_reset=str(cfg["auto.offset.reset"]),
            partition_eof=cfg.get_bool("enable.partition.eof"),
        )


class Fetcher:
    def __init__(
        self,
        broker: Broker,
        settings: FetchSettings,
        stored_offset: StoredOffsetLookup | None = None,
    ) -> None:
        self.broker = broker
        self.settings = settings
        self.stored_offset = stored_offset
        self.cursors: dict[tuple[str, int], PartitionCursor] = {}
        self._order: list[PartitionCursor] = []
        self._turn = 0
        # Where the next fill starts in _order.
        self._fill_turn = 0

    # --- assignment ----------------------------------------------------------------------

    def assign(self, partitions: list[tuple[str, int, int]]) -> None:
        """Replace the assignment; each entry is (topic, partition, starting offset)."""
        self.cursors = {(t, p): PartitionCursor(t, p, offset) for t, p, offset in partitions}
        self._order = list(self.cursors.values())
        self._turn = 0
        self._fill_turn = 0

    # --- handing out ---------------------------------------------------------------------

    def take(self, count: int) -> list[Message]:
        """Up to ``count`` buffered records and events, partitions taking turns.

        The order is strict round robin, one record per partition at a time, starting
        after the partition that went last. It is built a round at a time: every partition
        with something to hand out gives a slice of an even share of what is still wanted,
        and the slices are interleaved; with one partition the slice is the result.
        """
        cursors = self._order
        n = len(cursors)
        result: list[Message] = []
        while len(result) < count:
            remaining = count - len(result)
            ready = [
                (self._turn + i) % n
                for i in range(n)
                if self._has_output(cursors[(self._turn + i) % n])
            ][:remaining]
            if not ready:
                break
            share = remaining // len(ready)
            slices = [self._take(cursors[index], share) for index in ready]
            self._turn = (ready[-1] + 1) % n
            if len(slices) == 1:
                result.extend(slices[0])
            else:
                result.extend(m for group in zip_longest(*slices) for m in group if m is not None)
        return result

    def _has_output(self, cursor: PartitionCursor) -> bool:
        return cursor.has_buffered or cursor.event is not None or self._eof_due(cursor)

    def _eof_due(self, cursor: PartitionCursor) -> bool:
        return (
            self.settings.partition_eof
            and not cursor.eof_reported
            and cursor.end_offset is not None
            and cursor.resolved
            and cursor.fetch_offset >= cursor.end_offset
        )

    def _take(self, cursor: PartitionCursor, count: int) -> list[Message]:
        if cursor.has_buffered:
            return cursor.take(count)
        if cursor.event is not None:
            event, cursor.event = cursor.event, None
            return [event]
        if self._eof_due(cursor):
            cursor.eof_reported = True
            return [
                Message(
                    topic=cursor.topic,
                    partition=cursor.partition,
                    offset=cursor.fetch_offset,
                    error=KafkaError(
                        KafkaError._PARTITION_EOF,
                        f"Fetch from broker reached end of partition at offset {cursor.fetch_offset}",
                    ),
                )
            ]
        return []

    # --- fetching ------------------------------------------------------------------------

    def fill(self) -> None:
        """One Fetch per partition whose buffer ran dry; a lost connection is only logged
        (the next round tries again).

        The fetches share fetch.max.bytes as the partitions of one Kafka Fetch request do:
        each reads at most what is left of it (and max.partition.fetch.bytes); once it is
        used up, the partitions after get nothing this time. Only the first partition that
        has records gets one over the limit (Kafka's at least one batch). The next fill
        starts after the last partition that got records, so every partition gets its turn
        to go first.
        """
        cursors = self._order
        n = len(cursors)
        left = self.settings.max_bytes
        first = True  # no partition has returned records yet
        start = self._fill_turn
        for index in [(start + i) % n for i in range(n)]:
            cursor = cursors[index]
            if cursor.has_buffered or cursor.event is not None or cursor.stalled:
                continue
            if left <= 0 and not first:
                break
            try:
                if not cursor.resolved and not self._resolve(cursor):
                    continue
                records = self._fetch(
                    cursor, max(1, min(self.settings.max_partition_bytes, left)), first
                )
            except Exception as exc:
                if not is_connection_error(exc):
                    raise_as_kafka(exc)
                log.info(
                    "fetch %s [%d]: connection lost, will retry: %s",
                    cursor.topic,
                    cursor.partition,
                    exc,
                )
                continue
            if records:
                left -= payload_bytes(records)
                first = False
                self._fill_turn = (index + 1) % n

    def _fetch(
        self, cursor: PartitionCursor, max_bytes: int, min_one_record: bool
    ) -> list[RecordOut]:
        """Fetch into the cursor's (empty) buffer; the records fetched."""
        response = self.broker.handle(
            FetchRequest(
                cursor.topic,
                cursor.partition,
                cursor.fetch_offset,
                max_bytes=max_bytes,
                isolation_level=self.settings.isolation_level,
                min_one_record=min_one_record,
            ),
        )
        if response.error_code == KafkaError.OFFSET_OUT_OF_RANGE:
            self._out_of_range(cursor, KafkaError(response.error_code, response.error_message))
            return []
        if response.error_code != KafkaError.NO_ERROR:
            cursor.error_event(KafkaError(response.error_code, response.error_message))
            return []
        cursor.reported_error = None
        cursor.low_watermark = response.log_start_offset
        cursor.high_watermark = response.high_watermark
        cursor.last_stable_offset = response.last_stable_offset
        cursor.timestamp_type = (
            TIMESTAMP_LOG_APPEND_TIME if response.log_append_time else TIMESTAMP_CREATE_TIME
        )
        cursor.end_offset = (
            response.last_stable_offset
            if self.settings.isolation_level == READ_COMMITTED
            else response.high_watermark
        )
        if response.records:
            # The buffer is empty here (fill only fetches for drained cursors).
            cursor.buffer, cursor.taken = response.records, 0
            cursor.eof_reported = False
        cursor.fetch_offset = max(cursor.fetch_offset, response.next_offset)
        return response.records

    def _out_of_range(self, cursor: PartitionCursor, error: KafkaError) -> None:
        if self.settings.auto_offset_reset == RESET_ERROR:
            cursor.error_event(error, stall=True)
            return
        log.info(
            "%s [%d]: %s; resetting to %s",
            cursor.topic,
            cursor.partition,
            error.str(),
            self.settings.auto_offset_reset,
        )
        cursor.reset(
            OFFSET_BEGINNING if self.settings.auto_offset_reset == RESET_EARLIEST else OFFSET_END
        )

    def _resolve(self, cursor: PartitionCursor) -> bool:
        """Turn a logical starting offset into an absolute one; False if it cannot be."""
        offset = cursor.fetch_offset
        if offset in (OFFSET_INVALID, OFFSET_STORED):
            try:
                stored = (
                    self.stored_offset(cursor.topic, cursor.partition)
                    if self.stored_offset
                    else None
                )
            except StoredOffsetPending:
                return False
            if stored is not None and stored >= 0:
                cursor.fetch_offset = stored
                return True
            if self.settings.auto_offset_reset == RESET_ERROR:
                cursor.error_event(
                    KafkaError(
                        KafkaError.OFFSET_OUT_OF_RANGE,
                        f"{cursor.topic} [{cursor.partition}]: no committed offset to start "
                        "from and auto.offset.reset=error",
                    ),
                    stall=True,
                )
                return False
            offset = (
                OFFSET_BEGINNING
                if self.settings.auto_offset_reset == RESET_EARLIEST
                else OFFSET_END
            )
        resolved = self.list_offset(cursor.topic, cursor.partition, offset)
        if isinstance(resolved, KafkaError):
            cursor.error_event(resolved)
            return False
        cursor.fetch_offset = resolved
        return True

    def list_offset(self, topic: str, partition: int, logical: int) -> int | KafkaError:
        """OFFSET_BEGINNING: the log start; OFFSET_END: the end a reader at this isolation
        level sees (the LSO in read_committed)."""
        response = self.broker.handle(
            ListOffsetsRequest(
                topic,
                partition,
                EARLIEST_TIMESTAMP if logical == OFFSET_BEGINNING else LATEST_TIMESTAMP,
                isolation_level=self.settings.isolation_level,
            ),
        )
        if response.error_code != KafkaError.NO_ERROR:
            return KafkaError(response.error_code, response.error_message)
        return response.offset
