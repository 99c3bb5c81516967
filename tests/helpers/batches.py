"""Batches of records as tests send them: a ``ProduceRequest`` for the broker's own
handlers, or a record batch's bytes (magic 2) as a Kafka client puts it on the wire.

Values are text, encoded as UTF-8; records carry no key unless given one. A batch without
a producer id is plain; with one, its epoch and first sequence default to 0."""

from __future__ import annotations

from collections.abc import Sequence

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from app.protocol import ProduceRequest, RecordIn

NO_PRODUCER = -1


def records(*values: str, timestamp: int = 0) -> list[RecordIn]:
    """Keyless records of ``values``, each stamped ``timestamp``."""
    return [RecordIn(None, v.encode(), timestamp) for v in values]


def produce_batch(
    *values: str,
    topic: str = "t",
    partition: int = 0,
    producer_id: int = NO_PRODUCER,
    epoch: int | None = None,
    sequence: int | None = None,
) -> ProduceRequest:
    """One batch of ``values`` for ``topic``/``partition``: plain, or idempotent under
    ``producer_id`` (``epoch`` and ``sequence`` 0 unless given)."""
    unset = -1 if producer_id == NO_PRODUCER else 0
    return ProduceRequest(
        topic,
        partition,
        records(*values),
        producer_id,
        unset if epoch is None else epoch,
        unset if sequence is None else sequence,
    )


def record_batch(
    values: Sequence[str | bytes] | None = None,
    *,
    keys: Sequence[str | bytes | None] | None = None,
    codec: int = 0,
    transactional: bool = False,
    producer_id: int = NO_PRODUCER,
    epoch: int = -1,
    base_sequence: int = -1,
    timestamp: int = 1,
    headers: Sequence[tuple[str, bytes]] = (),
) -> bytes:
    """A record batch's bytes, as a Kafka client sends them in a Produce request:
    ``codec`` 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd; every record stamped ``timestamp``
    plus its index, with ``headers``. Without ``values``, one record for each of ``keys``,
    valued ``v<index>``."""
    if values is None:
        values = [f"v{i}" for i in range(len(keys or ()))]
    builder = DefaultRecordBatchBuilder(
        2, codec, int(transactional), producer_id, epoch, base_sequence, 2**31 - 1
    )
    for i, value in enumerate(values):
        key = keys[i] if keys is not None else None
        builder.append(i, timestamp + i, _bytes(key), _bytes(value), list(headers))
    return bytes(builder.build())


def _bytes(text: str | bytes | None) -> bytes | None:
    return text.encode() if isinstance(text, str) else text
