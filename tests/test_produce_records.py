"""A produce request's records refused with Kafka's codes (``server/records.py``): what
holds no whole batch, several batches, or another message format is INVALID_RECORD, as
Kafka's check of a produce request's records answers; a batch too short to be one, or
whose CRC does not hold, CORRUPT_MESSAGE. The conformance suite compares them with Kafka
(``tests/conformance/test_bad_input.py``)."""

from __future__ import annotations

import pytest
from aiokafka.record.legacy_records import LegacyRecordBatchBuilder

from app.errors import KafkaError, KafkaException
from app.server.records import produce_request
from tests.helpers.batches import record_batch

BATCH = record_batch(["payload"])


def _legacy() -> bytes:
    builder = LegacyRecordBatchBuilder(1, 0, 2**20)
    builder.append(0, 1, None, b"payload")
    return bytes(builder.build())


def _corrupt() -> bytes:
    damaged = bytearray(BATCH)
    damaged[-1] ^= 0xFF
    return bytes(damaged)


@pytest.mark.parametrize(
    ("records", "code"),
    [
        (b"", KafkaError.INVALID_RECORD),
        (b"\x01" * 70, KafkaError.INVALID_RECORD),  # a length past the bytes there are
        (BATCH[:-3], KafkaError.INVALID_RECORD),
        (BATCH + BATCH, KafkaError.INVALID_RECORD),
        (_legacy(), KafkaError.INVALID_RECORD),
        (b"\0" * 8 + b"\0\0\0\x05" + b"\0" * 60, KafkaError.CORRUPT_MESSAGE),
        (_corrupt(), KafkaError.CORRUPT_MESSAGE),
    ],
    ids=["empty", "no-whole-batch", "cut-short", "two-batches", "format-v1", "too-short",
         "crc"],
)  # fmt: skip
def test_records_kafka_refuses_are_refused_with_its_code(records: bytes, code: int) -> None:
    with pytest.raises(KafkaException) as refused:
        produce_request("t", 0, records, None)
    assert refused.value.error.code() == code


def test_a_whole_batch_is_read() -> None:
    assert [r.value for r in produce_request("t", 0, BATCH, None).records] == [b"payload"]
