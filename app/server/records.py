"""Record batches (Kafka's message format v2) in and out, by aiokafka's record module
(compiled; CRC32C, varints, headers; gzip, snappy, lz4 and zstd through cramjam).

In: a produce request's batch becomes a ``ProduceRequest`` as the native client would
send it (the producer id, epoch, base sequence and transactional flag kept; headers in
the stored form). Out: a fetch's stored records become batches again, one per run of
records that were appended together (same ``batch_base_offset``), with the producer id,
epoch, base sequence and transactional flag they were written with, and a marker as a
control batch, so a Kafka client sees the log Kafka would have given it.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter, sub
from typing import Any

from aiokafka.errors import CorruptRecordException, UnsupportedCodecError
from aiokafka.record.default_records import (
    DefaultRecordBase,
    DefaultRecordBatchBuilder,
)
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.record.util import calc_crc32c

from app.errors import KafkaError, fail
from app.protocol import (
    LOG_BATCH,
    LOG_BATCH_BASE_OFFSET,
    LogRecord,
    ProduceRequest,
    RecordIn,
    epoch_at,
    headers_of_stored,
    stored_headers,
)

MAGIC = 2
# Batch header layout (DefaultRecordBatch's): base offset first, outside the CRC; the CRC
# covers everything from the attributes on.
_BASE_OFFSET = struct.Struct(">q")
_CRC = struct.Struct(">I")
_ATTRIBUTES = struct.Struct(">h")
# Where every message format keeps its version (after the base offset, the length and the
# leader epoch, or a v0/v1 message's CRC).
_MAGIC_OFFSET = 16
CRC_OFFSET = DefaultRecordBase.CRC_OFFSET
# A batch's header, before its records (61 bytes).
BATCH_HEADER_BYTES = DefaultRecordBase.HEADER_STRUCT.size
ATTRIBUTES_OFFSET = DefaultRecordBase.ATTRIBUTES_OFFSET
CONTROL_MASK = DefaultRecordBase.CONTROL_MASK
# A control record: key (version, type), value (version, coordinator epoch).
_CONTROL_KEY = struct.Struct(">hh")
_CONTROL_VALUE = struct.Struct(">hi")
_UNBOUNDED = 2**31 - 1
# The columns of a run's offsets, timestamps, keys, values and headers (LogRecord's first
# fields), and a record's batch base.
_DATA_FIELDS = itemgetter(0, 1, 2, 3, 4)
_base = itemgetter(LOG_BATCH_BASE_OFFSET)
# A RecordIn from a ready tuple, without the Python-level __new__ of a NamedTuple.
_new = tuple.__new__


def produce_request(
    topic: str, partition: int, records: bytes | None, transactional_id: str | None
) -> ProduceRequest:
    """The batch of one partition of a produce request; raises KafkaException
    (CORRUPT_MESSAGE, INVALID_RECORD, UNSUPPORTED_COMPRESSION_TYPE) for what Kafka would
    refuse, with Kafka's code: a partition's bytes that hold no whole batch, more than one,
    or one of another message format are INVALID_RECORD (Kafka's check of a produce
    request's records); a batch shorter than a batch can be, or whose CRC does not hold,
    CORRUPT_MESSAGE."""
    if not records:
        raise fail(KafkaError.INVALID_RECORD, "a produce partition without records")
    try:
        batches = MemoryRecords(bytes(records))
        batch = batches.next_batch()
        if batch is None:
            raise fail(KafkaError.INVALID_RECORD, "no complete record batch")
        if batches.has_next():
            raise fail(KafkaError.INVALID_RECORD, "one record batch per partition is allowed")
        magic = records[_MAGIC_OFFSET]  # aiokafka's legacy batches do not say it
        if magic != MAGIC:
            raise fail(KafkaError.INVALID_RECORD, f"message format v{magic}: only v2 is")
        if not batch.validate_crc():
            raise fail(KafkaError.CORRUPT_MESSAGE, "record batch CRC mismatch")
        if batch.is_control_batch:
            raise fail(KafkaError.INVALID_RECORD, "clients may not write control batches")
        rows = _rows(batch)
    except UnsupportedCodecError as exc:
        raise fail(KafkaError.UNSUPPORTED_COMPRESSION_TYPE, str(exc)) from exc
    except CorruptRecordException as exc:
        raise fail(KafkaError.CORRUPT_MESSAGE, str(exc)) from exc
    return ProduceRequest(
        topic, partition, rows, batch.producer_id, batch.producer_epoch, batch.base_sequence,
        transactional_id if batch.is_transactional else None, batch.is_transactional,
        size_bytes=len(records),
    )  # fmt: skip


def _rows(batch: Any) -> list[RecordIn]:
    """The batch's records, built in C where it can be: this runs once per record of every
    batch produced, and headers are usually absent."""
    return [
        _new(
            RecordIn, (r.key, r.value, r.timestamp, stored_headers(h) if (h := r.headers) else None)
        )
        for r in batch
    ]


@dataclass(frozen=True)
class Served:
    """How a partition's batches are served: with the LogAppendTime timestamp type (the
    topic's message.timestamp.type; its records were stamped with their append time),
    compressed with the topic's compression.type where that names a codec, each stamped
    with the leader epoch it was written in (``epochs`` with their ``starts``; none: the
    partition has only ever had ``leader_epoch``)."""

    log_append_time: bool = False
    compression_type: str = "producer"
    leader_epoch: int = 0
    epochs: tuple[int, ...] = ()
    starts: tuple[int, ...] = ()

    @property
    def codec(self) -> int:
        return _CODECS.get(self.compression_type, 0)


# compression.type's codecs, as the batch attributes name them.
_CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
_LEADER_EPOCH = struct.Struct(">i")
# Where a batch's partition leader epoch lies (after its base offset and length): outside
# the CRC, as Kafka's broker stamps it on every batch it appends.
_LEADER_EPOCH_OFFSET = 12
TIMESTAMP_TYPE_MASK = 0x08
PLAIN = Served()


def encode_batches(records: list[LogRecord], served: Served = PLAIN) -> bytes:
    """Stored records, in offset order, as record batches: one per run of records sharing
    a ``batch_base_offset`` (bases never decrease along the log, so a run ends where a
    bisection says, with no look at the records between), written with the fields its
    first record carries."""
    out = bytearray()
    start, end = 0, len(records)
    while start < end:
        stop = bisect_right(records, records[start][LOG_BATCH_BASE_OFFSET], start, end, key=_base)
        out += _batch(records[start:stop], served)
        start = stop
    return bytes(out)


def _batch(run: list[LogRecord], served: Served) -> bytearray:
    first_offset, batch = run[0][0], run[0][LOG_BATCH]
    assert batch is not None, "a fetch gives the first record of a run its batch's fields"
    (producer_id, producer_epoch, sequence, is_transactional, is_control, control_type,
     coordinator_epoch) = batch  # fmt: skip
    builder = DefaultRecordBatchBuilder(
        MAGIC, 0 if is_control else served.codec, is_transactional, producer_id,
        producer_epoch, sequence, _UNBOUNDED,
    )  # fmt: skip
    append = builder.append
    if is_control:  # a marker, a batch of its own
        key = _CONTROL_KEY.pack(0, control_type)
        value = _CONTROL_VALUE.pack(0, coordinator_epoch or 0)
        for offset, timestamp, *_ in run:
            append(offset - first_offset, timestamp, key, value, [])
    else:  # once per record of every fetch: by columns, in C, with no per-record call here
        offsets, timestamps, keys, values, headers = _DATA_FIELDS(tuple(zip(*run, strict=True)))
        stored = (
            [headers_of_stored(h) if h else [] for h in headers] if any(headers) else repeat([])
        )
        deltas = map(sub, offsets, repeat(first_offset))
        deque(map(append, deltas, timestamps, keys, values, stored), 0)
    built = builder.build()
    _BASE_OFFSET.pack_into(built, 0, first_offset)
    epoch = epoch_at(served.epochs, served.starts, first_offset) if served.epochs else None
    _LEADER_EPOCH.pack_into(
        built, _LEADER_EPOCH_OFFSET, served.leader_epoch if epoch is None else epoch
    )
    flags = CONTROL_MASK if is_control else TIMESTAMP_TYPE_MASK if served.log_append_time else 0
    if flags:
        (attributes,) = _ATTRIBUTES.unpack_from(built, ATTRIBUTES_OFFSET)
        _ATTRIBUTES.pack_into(built, ATTRIBUTES_OFFSET, attributes | flags)
        _CRC.pack_into(built, CRC_OFFSET, calc_crc32c(bytes(built[ATTRIBUTES_OFFSET:])))
    return built
