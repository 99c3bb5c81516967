"""The value types clients hand back and forth: ``Message`` and ``TopicPartition``.

They mirror confluent-kafka's classes closely (method names, defaults, equality and
ordering rules, sentinel offsets) so that application code written for confluent-kafka
runs unchanged. Argument checking raises ``KafkaException`` with ``_INVALID_ARG`` rather
than ``TypeError`` so that callers have one exception type to handle.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from app.errors import KafkaError, fail
from app.protocol import headers_of_stored, stored_headers

OFFSET_BEGINNING = -2
OFFSET_END = -1
OFFSET_STORED = -1000
OFFSET_INVALID = -1001

TIMESTAMP_NOT_AVAILABLE = 0
TIMESTAMP_CREATE_TIME = 1
TIMESTAMP_LOG_APPEND_TIME = 2

Header = tuple[str, bytes | None]
HeadersIn = Mapping[str, Any] | Iterable[tuple[str, Any]] | None


def to_bytes(name: str, value: object) -> bytes | None:
    """Coerce a key, value or header value the way confluent-kafka accepts them.

    ``name`` is only used in the error, so the caller learns which argument was wrong.
    """
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise fail(
        KafkaError._INVALID_ARG,
        f"{name} must be bytes, str or None, not {type(value).__name__}",
    )


def normalize_headers(headers: HeadersIn) -> list[Header]:
    """Headers as an ordered list of ``(str, bytes | None)``; duplicates are kept, as in Kafka."""
    if headers is None:
        return []
    if isinstance(headers, Mapping):
        items: Iterable[Any] = headers.items()
    elif isinstance(headers, str | bytes):
        raise fail(
            KafkaError._INVALID_ARG, "headers must be a list of (key, value) tuples or a dict"
        )
    else:
        items = headers
    result: list[Header] = []
    try:
        for item in items:
            if not isinstance(item, tuple | list):
                raise TypeError(item)
            hkey, hvalue = item
            if not isinstance(hkey, str):
                raise fail(
                    KafkaError._INVALID_ARG,
                    f"header key must be str, not {type(hkey).__name__}",
                )
            result.append((hkey, to_bytes(f"header {hkey!r} value", hvalue)))
    except (TypeError, ValueError) as exc:
        raise fail(
            KafkaError._INVALID_ARG,
            "headers must be a list of (key, value) tuples or a dict",
        ) from exc
    return result


def encode_headers(headers: HeadersIn) -> list[dict[str, str | None]]:
    """Headers as the log stores them (``protocol.stored_headers``)."""
    return stored_headers(normalize_headers(headers))


def decode_headers(stored: str | bytes | Iterable[Mapping[str, Any]] | None) -> list[Header]:
    """``protocol.headers_of_stored``, a malformed value reported as _BAD_MSG."""
    try:
        return headers_of_stored(stored)
    except ValueError as exc:
        raise fail(KafkaError._BAD_MSG, str(exc)) from exc


class Message:
    """A consumed record, a delivery report, or an error event (``error()`` is set).

    Built only by the clients, hence the keyword-only constructor.
    """

    __slots__ = (
        "_error",
        "_headers",
        "_key",
        "_latency",
        "_leader_epoch",
        "_offset",
        "_partition",
        "_stored_headers",
        "_timestamp",
        "_timestamp_type",
        "_topic",
        "_value",
    )

    def __init__(
        self,
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
        key: bytes | None = None,
        value: bytes | None = None,
        headers: HeadersIn = None,
        timestamp: int = -1,
        timestamp_type: int = TIMESTAMP_NOT_AVAILABLE,
        error: KafkaError | None = None,
        leader_epoch: int | None = None,
        latency: float | None = None,
    ) -> None:
        self._topic = topic
        self._partition = partition
        self._offset = offset
        self._key = key
        self._value = value
        # confluent-kafka reports "no headers" as None rather than an empty list.
        self._headers: list[Header] | None = normalize_headers(headers) or None
        # As the log keeps them (JSON text, or its list form), decoded when first asked.
        self._stored_headers: str | list[dict[str, Any]] | None = None
        if timestamp_type == TIMESTAMP_NOT_AVAILABLE:
            timestamp = -1
        self._timestamp = timestamp
        self._timestamp_type = timestamp_type
        self._error = error
        self._leader_epoch = leader_epoch
        self._latency = latency

    def topic(self) -> str | None:
        return self._topic

    def partition(self) -> int | None:
        return self._partition

    def offset(self) -> int | None:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[Header] | None:
        """A copy, so callers may edit it without changing the message.

        A fetched message keeps its headers as stored (JSON text) until first asked:
        decoding them is the costliest part of building a message, and most consumers
        never look. Malformed stored headers raise ``_BAD_MSG`` here.
        """
        if self._stored_headers is not None:
            self._headers = decode_headers(self._stored_headers) or None
            self._stored_headers = None
        return list(self._headers) if self._headers is not None else None

    def timestamp(self) -> tuple[int, int]:
        """``(timestamp_type, ms)``; ms is -1 when the type is TIMESTAMP_NOT_AVAILABLE."""
        return (self._timestamp_type, self._timestamp)

    def error(self) -> KafkaError | None:
        return self._error

    def leader_epoch(self) -> int | None:
        return self._leader_epoch

    def latency(self) -> float | None:
        """Seconds from produce() to the delivery report; None on consumed messages."""
        return self._latency

    def set_key(self, key: object) -> None:
        """Lets deserialising wrappers replace the payload in place, as confluent-kafka allows."""
        self._key = to_bytes("key", key)

    def set_value(self, value: object) -> None:
        self._value = to_bytes("value", value)

    def set_headers(self, headers: HeadersIn) -> None:
        self._headers = normalize_headers(headers) or None
        self._stored_headers = None

    def len(self) -> int:
        """Length of the value in bytes (0 without a value), like ``len(msg)``."""
        return len(self._value) if self._value is not None else 0

    def __len__(self) -> int:
        return self.len()

    def __repr__(self) -> str:
        if self._error is not None:
            return (
                f"Message(topic={self._topic!r}, partition={self._partition}, "
                f"offset={self._offset}, error={self._error!r})"
            )
        return (
            f"Message(topic={self._topic!r}, partition={self._partition}, "
            f"offset={self._offset}, key={self._key!r}, len={self.len()})"
        )


class FetchedMessage(Message):
    """A consumed record, built from a fetched row (``app.protocol.RecordOut``: offset,
    timestamp, key, value, stored headers, producer id) in one positional call.

    The consumer builds one per record, so this constructor is a hot path: no argument
    checks (the database holds only valid records) and no header decoding (see
    ``Message.headers``). It is a ``Message`` in every respect the API shows.
    """

    __slots__ = ()

    def __init__(
        self,
        topic: str,
        partition: int,
        row: tuple[Any, ...],
        timestamp_type: int = TIMESTAMP_CREATE_TIME,
    ) -> None:
        self._topic = topic
        self._partition = partition
        self._offset, self._timestamp, self._key, self._value, self._stored_headers, _ = row
        self._headers = None
        self._timestamp_type = timestamp_type
        self._error = None
        self._leader_epoch = None
        self._latency = None


class DeliveredMessage(Message):
    """A delivery report: the record as produced (``app.protocol.RecordFields``: key,
    value, timestamp, headers encoded for storage) where it was stored, in one positional
    call.

    The producer builds one per record that has a callback, on the application's thread,
    so this constructor is a hot path like ``FetchedMessage``'s: no argument checks (the
    record passed ``produce()``'s) and the headers decoded only when asked (their stored
    form says the same as the caller's). It is a ``Message`` in every respect the API shows.
    """

    __slots__ = ()

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        record: tuple[bytes | None, bytes | None, int, list[dict[str, Any]] | None],
        error: KafkaError | None,
        latency: float,
    ) -> None:
        self._topic = topic
        self._partition = partition
        self._offset = offset
        self._key, self._value, self._timestamp, self._stored_headers = record
        self._headers = None
        self._timestamp_type = TIMESTAMP_CREATE_TIME
        self._error = error
        self._leader_epoch = None
        self._latency = latency


class TopicPartition:
    """A topic/partition, optionally with an offset, as used in assign/commit/seek.

    Equal and hashed on (topic, partition) only, and ordered by topic then partition, as
    confluent-kafka's is, so results can be sorted and looked up in sets and dicts keyed
    without regard to offsets.
    """

    __slots__ = ("error", "leader_epoch", "metadata", "offset", "partition", "topic")

    def __init__(
        self,
        topic: str,
        partition: int = -1,
        offset: int = OFFSET_INVALID,
        metadata: str | None = None,
        leader_epoch: int | None = None,
    ) -> None:
        if not isinstance(topic, str):
            raise fail(KafkaError._INVALID_ARG, f"topic must be str, not {type(topic).__name__}")
        self.topic: str = topic
        self.partition: int = int(partition)
        self.offset: int = int(offset)
        self.metadata: str | None = metadata
        self.leader_epoch: int | None = leader_epoch
        self.error: KafkaError | None = None

    def _sort_key(self) -> tuple[str, int]:
        return (self.topic, self.partition)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TopicPartition):
            return NotImplemented
        return self._sort_key() == other._sort_key()

    def __hash__(self) -> int:
        return hash(self._sort_key())

    def __lt__(self, other: TopicPartition) -> bool:
        if not isinstance(other, TopicPartition):
            return NotImplemented
        return self._sort_key() < other._sort_key()

    def __le__(self, other: TopicPartition) -> bool:
        if not isinstance(other, TopicPartition):
            return NotImplemented
        return self._sort_key() <= other._sort_key()

    def __gt__(self, other: TopicPartition) -> bool:
        if not isinstance(other, TopicPartition):
            return NotImplemented
        return self._sort_key() > other._sort_key()

    def __ge__(self, other: TopicPartition) -> bool:
        if not isinstance(other, TopicPartition):
            return NotImplemented
        return self._sort_key() >= other._sort_key()

    def __repr__(self) -> str:
        return (
            f"TopicPartition{{topic={self.topic},partition={self.partition},"
            f"offset={self.offset},leader_epoch={self.leader_epoch},error={self.error}}}"
        )

    __str__ = __repr__
