"""What a client observes, reduced to what must match between kip98 and Kafka: error codes
by name, offsets relative to the log start, records as (key, value, headers), control
records present or not, the LSO as a relation to the high watermark, names as their
stems, config entries as (name, value, source, is_default)."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import struct
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import confluent_kafka as ck

from tests.conformance.harness import SUFFIX, Observation

CONTROL_TYPES = {0: "ABORT", 1: "COMMIT"}


def error_name(error: Any) -> str:
    """A Kafka error's name, whatever carries it: an int code, kio's ``ErrorCode``, a
    ``KafkaError``, a ``KafkaException``; "NONE" for no error."""
    if error is None:
        return "NONE"
    if isinstance(error, ck.KafkaException):
        error = error.args[0]
    if isinstance(error, ck.KafkaError):
        return "NONE" if error.code() == ck.KafkaError.NO_ERROR else str(error.name())
    if isinstance(error, enum.Enum):
        error = error.value
    code = int(error)
    if code == 0:
        return "NONE"
    from kio.schema.errors import ErrorCode

    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"UNKNOWN_CODE_{code}"


def stems(observation: Observation) -> Observation:
    """Every name made by ``Target.name_for`` replaced by its stem, anywhere inside."""
    if isinstance(observation, str):
        return SUFFIX.sub("", observation)
    if isinstance(observation, Mapping):
        return {stems(k): stems(v) for k, v in observation.items()}
    if isinstance(observation, list | tuple):
        return [stems(v) for v in observation]
    return observation


def relative(offsets: Iterable[int], start: int) -> list[int]:
    """Offsets counted from the partition's log start."""
    return [o - start for o in offsets]


def text(data: bytes | str | None) -> str | None:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data


def record(message: ck.Message) -> list[Any]:
    """A consumed message as [key, value, headers]."""
    headers = [[k, text(v)] for k, v in (message.headers() or [])]
    return [text(message.key()), text(message.value()), headers]


def records(messages: Iterable[ck.Message]) -> list[list[Any]]:
    return [record(m) for m in messages]


def lso_relation(lso: int, high_watermark: int) -> str:
    """The last stable offset against the high watermark: "lso<hw" while a transaction is
    open below it, "lso==hw" otherwise."""
    if lso < high_watermark:
        return "lso<hw"
    if lso == high_watermark:
        return "lso==hw"
    return "lso>hw"


def config_entry(entry: Any) -> list[Any]:
    """A DescribeConfigs entry (confluent-kafka's ``ConfigEntry``) as
    [name, value, source, is_default]."""
    source = entry.source
    source_name = getattr(source, "name", source)
    return [entry.name, entry.value, source_name, bool(entry.is_default)]


def batches(data: bytes | None, log_start: int = 0) -> list[dict[str, Any]]:
    """A fetch answer's record bytes as the batches a client sees: base offset (relative to
    ``log_start``), transactional and control flags, and its records; a control record
    as its type (COMMIT/ABORT)."""
    from aiokafka.record.memory_records import MemoryRecords

    seen: list[dict[str, Any]] = []
    if not data:
        return seen
    memory = MemoryRecords(bytes(data))
    while (batch := memory.next_batch()) is not None:
        entries: list[Any] = []
        for r in batch:
            if batch.is_control_batch:
                _version, kind = struct.unpack(">hh", bytes(r.key))
                entries.append(CONTROL_TYPES.get(kind, kind))
            else:
                entries.append([text(r.key), text(r.value), [[k, text(v)] for k, v in r.headers]])
        seen.append(
            {
                "base_offset": batch.base_offset - log_start,
                "transactional": bool(batch.is_transactional),
                "control": bool(batch.is_control_batch),
                "records": entries,
            }
        )
    return seen


def plain(entity: Any, drop: Iterable[str] = ("throttle_time_ms", "throttle_time")) -> Observation:
    """A kio answer (frozen dataclasses) as plain data: error codes by name, durations in
    milliseconds, names as their stems; fields in ``drop`` left out at every level."""
    dropped = set(drop)

    def walk(value: Any, field: str = "") -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {
                f.name: walk(getattr(value, f.name), f.name)
                for f in dataclasses.fields(value)
                if f.name not in dropped
            }
        if isinstance(value, enum.Enum):
            if type(value).__name__ == "ErrorCode":
                return error_name(value)
            return value.name
        if isinstance(value, datetime.timedelta):
            return int(value.total_seconds() * 1000)
        if isinstance(value, datetime.datetime):
            return value.isoformat()
        if isinstance(value, uuid.UUID):
            return str(value)
        if isinstance(value, bytes):
            return value.hex()
        if isinstance(value, list | tuple):
            return [walk(v, field) for v in value]
        if isinstance(value, str):
            return stems(value)
        return value

    return walk(entity)
