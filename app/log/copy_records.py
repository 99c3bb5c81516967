"""A produce batch as one binary COPY payload for ``records``, built in bulk.

Writing rows one by one (``copy.write_row``) costs a few Python calls per record, and the
Produce handler runs on the producer's sender thread, where every microsecond per record
is taken from the application's thread too (the GIL). Here the payload is built column by
column: the batch is transposed once (``zip(*records)``), the fields that are the same for
the whole batch are packed once, a record's integers are packed by one ``struct`` call
through ``map``, a value's length is looked up packed, and everything is interleaved by
slice assignment and joined, for the whole request, in one ``b"".join``, so the loop over
records runs in C. The layout is PostgreSQL's binary COPY format (signature; per row
the field count, then per field its length, -1 for NULL, and its bytes; trailer), in the
column order of ``sql.COPY_RECORD_COLUMNS``.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Sequence
from itertools import repeat
from typing import Any

from app.log import sql
from app.protocol import (
    INT32_MAX,
    NO_PRODUCER_ID,
    RECORD_OVERHEAD_BYTES,
    ProduceRequest,
    RecordFields,
    increment_sequence,
)

SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
TRAILER = struct.pack(">h", -1)
_NULL = struct.pack(">i", -1)
_LENGTH = struct.Struct(">i")
# offset (int8), timestamp (int8), sequence (int4), each with its length; then the key's length.
_RECORD_INTEGERS = struct.Struct(">iqiqiii")

assert sql.COPY_RECORD_COLUMNS[9:] == ("headers", "offset", "timestamp", "sequence", "key", "value")


class Columns:
    """A batch transposed: one tuple per field, each as long as the batch."""

    __slots__ = ("_nullables", "headers", "keys", "timestamps", "values")

    keys: tuple[bytes | None, ...]
    values: tuple[bytes | None, ...]
    timestamps: tuple[int, ...]
    headers: tuple[list[dict[str, Any]] | None, ...]

    def __init__(self, records: Sequence[RecordFields]) -> None:
        transposed: Any = zip(*records, strict=True) if records else ((), (), (), ())
        self.keys, self.values, self.timestamps, self.headers = transposed
        self._nullables: tuple[_Nullable, _Nullable] | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def nullable(self) -> tuple[_Nullable, _Nullable]:
        """Keys and values as ``_nullable`` gives them, worked out once for the size check
        and the COPY."""
        if self._nullables is None:
            self._nullables = (_nullable(self.keys), _nullable(self.values))
        return self._nullables

    def size_bytes(self) -> int:
        """The sum of ``record_size_bytes`` over the batch."""
        (key_lengths, keys), (value_lengths, values) = self.nullable()
        n = len(self.keys)
        size = RECORD_OVERHEAD_BYTES * n + sum(key_lengths) + sum(value_lengths)
        # A NULL's length is -1 there and counts 0; only a column with NULLs was copied
        # into a list (``_nullable``), so the others need no count.
        if keys is not self.keys:
            size += key_lengths.count(-1)
        if values is not self.values:
            size += value_lengths.count(-1)
        if self.headers.count(None) != n:  # some have headers (counted in C)
            size += sum(len(json.dumps(h)) for h in self.headers if h)
        return size

    def stamped(self, now_ms: int) -> tuple[int, ...]:
        """The timestamps, 0 or negative ones replaced by ``now_ms`` (the broker's time)."""
        if min(self.timestamps) > 0:
            return self.timestamps
        if max(self.timestamps) <= 0:  # a client that leaves every record to the broker
            return (now_ms,) * len(self.timestamps)
        return tuple(ts if ts > 0 else now_ms for ts in self.timestamps)


# A nullable bytea column: each field's length (-1 for NULL) and bytes (b"" for NULL).
_Nullable = tuple[list[int], Sequence[bytes]]


def _nullable(values: tuple[bytes | None, ...]) -> _Nullable:
    """Lengths (-1 for NULL) and bytes of a nullable bytea column."""
    try:
        lengths = list(map(len, values))  # type: ignore[arg-type]
    except TypeError:  # some are None: the rare case, record by record
        return [-1 if v is None else len(v) for v in values], [v or b"" for v in values]
    present: tuple[bytes, ...] = values  # type: ignore[assignment]
    return lengths, present


def _jsonb_fields(headers: tuple[list[dict[str, Any]] | None, ...]) -> list[bytes]:
    """Each record's headers as a jsonb field (version 1, then the JSON text), or NULL."""
    fields = []
    for h in headers:
        if h is None:
            fields.append(_NULL)
        else:
            data = b"\x01" + json.dumps(h).encode()
            fields.append(_LENGTH.pack(len(data)) + data)
    return fields


def _sequences(base_sequence: int, count: int) -> Iterable[int]:
    """Each record's sequence number; they wrap from 2^31-1 to 0, as Kafka's do."""
    if base_sequence < 0:
        return repeat(-1, count)
    if base_sequence <= INT32_MAX - (count - 1):
        return range(base_sequence, base_sequence + count)
    return [increment_sequence(base_sequence, i) for i in range(count)]


# A COPY FROM buffers up to 1000 rows before it writes them, each in a slot that pins the
# table's row type in the statement's resource owner, whose hash puts identical entries in
# one run: its bookkeeping grows with the square of the rows buffered, and a binary COPY
# buffers min(rows, 1000) whatever their size (it counts no bytes). Measured on
# PostgreSQL 15: ~1 ms of server CPU for a 1000-row COPY, a third of what the batch costs
# the server; a further COPY statement in the same query string costs ~0.12 ms (a round
# trip and its start) (docs/design.md §3.10).
_COPY_BUFFERED_ROWS = 1000
_FURTHER_COPY_COST = 120_000  # in units of one pair of buffered rows (~1 ns each)
_MOST_COPIES = 8


def copy_statements(rows: int) -> int:
    """How many COPY statements ``rows`` rows are written in: the number that costs least
    by the model above, if it saves at least what one more statement costs (so a write
    near the break-even takes no round trip for nothing): 1 below ~700 rows and from
    ~1500 on, 3 for a 1000-row batch."""

    def cost(copies: int) -> int:
        buffered = min(-(-rows // copies), _COPY_BUFFERED_ROWS)
        return copies * buffered * buffered + (copies - 1) * _FURTHER_COPY_COST

    best = min(range(1, _MOST_COPIES + 1), key=cost)
    return best if cost(1) - cost(best) >= _FURTHER_COPY_COST else 1


def copy_payload_of(batches: Iterable[list[bytes]]) -> bytes:
    """One COPY payload for the rows of several batches (``encode_rows``), joined once."""
    parts = [SIGNATURE]
    for rows in batches:
        parts += rows
    parts.append(TRAILER)
    return b"".join(parts)


def copy_payloads_of(batches: Sequence[tuple[list[bytes], int]]) -> list[bytes]:
    """The COPY payloads for the rows of several batches (each ``encode_rows``' parts and
    its row count), one per COPY statement (``copy_statements``): the rows in order, cut
    into pieces of near-equal size, each a whole binary COPY (signature, rows, trailer).

    A piece within one batch is that batch's slice with the signature put in front, so
    its parts are copied (and their reference counts touched) once, not twice."""
    rows = sum(n for _, n in batches)
    size = -(-rows // copy_statements(rows)) if rows else 1
    payloads: list[bytes] = []
    chunks: list[list[bytes]] = []  # the piece under way, a slice of a batch each
    room = size
    for parts, n in batches:
        stride = len(parts) // n if n else 0
        start = 0
        while start < n:
            take = min(room, n - start)
            chunks.append(parts[start * stride : (start + take) * stride])
            start += take
            room -= take
            if room == 0:
                payloads.append(_piece(chunks))
                chunks, room = [], size
    if chunks or not payloads:
        payloads.append(_piece(chunks))
    return payloads


def _piece(chunks: list[list[bytes]]) -> bytes:
    """One COPY's payload: its rows' parts (slices of the batches) between signature and
    trailer."""
    if len(chunks) == 1:
        [piece] = chunks
        piece.insert(0, SIGNATURE)
    else:
        piece = [SIGNATURE]
        for chunk in chunks:
            piece += chunk
    piece.append(TRAILER)
    return b"".join(piece)


class _PackedLengths(dict[int, bytes]):
    """Field lengths as the 4 bytes that precede a field, packed once per length (most
    batches repeat a few key and value lengths): a dict lookup per field, in C, instead of
    a ``struct`` call. Lengths of 64 KiB and more are packed each time, not kept."""

    def __missing__(self, length: int) -> bytes:
        packed = _LENGTH.pack(length)
        if length < 65536:
            self[length] = packed
        return packed


_PACKED_LENGTHS = _PackedLengths()


def encode_rows(
    req: ProduceRequest, base_offset: int, columns: Columns, timestamps: tuple[int, ...]
) -> list[bytes]:
    """The rows of ``req``'s batch at ``base_offset`` in binary COPY format, without
    signature and trailer, as the parts ``copy_payload_of`` joins. A batch without
    producer id has sequence -1 on every record.

    The parts are laid out by slice assignment (each field's column in one step, at its
    stride), so no per-record tuple is built and the loop over records stays in C."""
    topic, partition, producer_id = req.topic, req.partition, req.producer_id
    producer_epoch, is_transactional = req.producer_epoch, req.is_transactional
    base_sequence = -1 if producer_id == NO_PRODUCER_ID else req.base_sequence
    n = len(columns)
    name = topic.encode()
    # topic, partition, producer_id, producer_epoch, batch_base_offset, is_transactional,
    # is_control, control_type (NULL), coordinator_epoch (NULL)
    prefix = struct.pack(
        f">hi{len(name)}siiiqihiqi?i?",
        len(sql.COPY_RECORD_COLUMNS), len(name), name, 4, partition, 8, producer_id,
        2, producer_epoch, 8, base_offset, 1, is_transactional, 1, False,
    ) + _NULL + _NULL  # fmt: skip
    (key_lengths, keys), (value_lengths, values) = columns.nullable()
    integers = map(
        _RECORD_INTEGERS.pack,
        repeat(8),
        range(base_offset, base_offset + n),
        repeat(8),
        timestamps,
        repeat(4),
        _sequences(base_sequence, n),
        key_lengths,
    )
    if columns.headers.count(None) != n:  # some have headers (counted in C)
        # prefix, headers, integers, key, value length, value
        parts = [prefix] * (6 * n)
        parts[1::6] = _jsonb_fields(columns.headers)
        stride = 6
    else:
        # prefix and NULL headers, integers, key, value length, value
        parts = [prefix + _NULL] * (5 * n)
        stride = 5
    parts[stride - 4 :: stride] = integers
    parts[stride - 3 :: stride] = keys
    parts[stride - 2 :: stride] = map(_PACKED_LENGTHS.__getitem__, value_lengths)
    parts[stride - 1 :: stride] = values
    return parts
