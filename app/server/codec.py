"""Kafka's framing and message entities, by kio (generated from Kafka's own message
schemas, every version, flexible ones included): a frame is a 4-byte size, then the
request header and body; a response is the size, the response header and body.

Handlers describe a response as plain values (``dict`` per struct, ``list`` per array,
``int`` per error code, and per duration and timestamp in milliseconds); ``build`` fits
them to the response entity of the version asked, so one handler serves every version:
fields the version does not have are dropped, fields it has and the values lack take the
schema's default.
"""

from __future__ import annotations

import datetime
import io
import struct
import threading
import types
import typing
import uuid
from dataclasses import MISSING, fields, is_dataclass
from typing import Any

from kio.index import UnknownAPIKey, UnknownEntity, load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import TZAware, i32Timedelta, i64Timedelta

from app.errors import KafkaError

FRAME_SIZE = struct.Struct(">i")
# The first fields of every request header: api_key, api_version, correlation_id.
HEADER_START = struct.Struct(">hhi")


class MalformedRequest(Exception):
    """A frame that is not a request of a known API and version: the connection closes."""


def read_header(frame: bytes) -> tuple[int, int, int]:
    """``(api_key, api_version, correlation_id)`` of a request frame (without its size)."""
    if len(frame) < HEADER_START.size:
        raise MalformedRequest(f"a frame of {len(frame)} bytes has no request header")
    api_key, api_version, correlation_id = HEADER_START.unpack_from(frame)
    return api_key, api_version, correlation_id


# kio imports a schema's module the first time it is asked for, and its modules import
# each other: two worker threads importing them at once can meet Python's import deadlock
# (_DeadlockError), which failed the request. The first load of each is made one at a
# time, and kept.
_schemas: dict[tuple[bool, int, int], type[Any]] = {}
_loading = threading.Lock()


def _schema(response: bool, api_key: int, api_version: int) -> type[Any]:
    key = (response, api_key, api_version)
    found = _schemas.get(key)
    if found is None:
        with _loading:
            found = _schemas.get(key)
            if found is None:
                load = load_response_schema if response else load_request_schema
                found = _schemas[key] = load(api_key, api_version)
    return found


def request_schema(api_key: int, api_version: int) -> type[Any] | None:
    """kio's request entity for this API and version; None if kio knows neither."""
    try:
        return _schema(False, api_key, api_version)
    except (UnknownAPIKey, UnknownEntity):
        return None


def parse_request(frame: bytes, schema: type[Any]) -> tuple[Any, Any]:
    """The request header and body of ``frame``, read with ``schema``'s header version.

    Bytes after the body are ignored, as Kafka's brokers ignore them: librdkafka's
    Metadata request for all topics (v9 and later) keeps the 4 bytes it set aside for the
    topic count where the compact null takes 1, so 3 zero bytes follow its body."""
    try:
        header, offset = _reader(schema.__header_schema__)(frame, 0)
        body, _ = _reader(schema)(frame, offset)
    except Exception as exc:  # kio raises several kinds on truncated or garbled input
        raise MalformedRequest(f"cannot read {schema.__name__}: {exc}") from exc
    null = _null_where_not_nullable(body)
    if null is not None:
        raise MalformedRequest(f"cannot read {schema.__name__}: {null} is null")
    return header, body


def _null_where_not_nullable(entity: Any) -> str | None:
    """The path of the first field of ``entity`` (nested structs and arrays of them
    included) that is null where its schema says non-nullable; None if there is none.

    kio's reader takes a length of -1 as null whatever the schema says; Kafka's generated
    readers refuse it ("non-nullable field ... was serialized as null"), so the request
    cannot be read and its connection closes."""
    for name, nullable, nested in _null_rules(type(entity)):
        value = getattr(entity, name)
        if value is None:
            if not nullable:
                return name
            continue
        if nested:
            items = value if isinstance(value, tuple) else (value,)
            for i, item in enumerate(items):
                if is_dataclass(item):
                    inner = _null_where_not_nullable(item)
                    if inner is not None:
                        return f"{name}[{i}].{inner}" if isinstance(value, tuple) else inner
    return None


_NULL_RULES: dict[type[Any], list[tuple[str, bool, bool]]] = {}


def _null_rules(entity: type[Any]) -> list[tuple[str, bool, bool]]:
    """Per field of ``entity``: its name, whether it is nullable, whether it holds structs."""
    rules = _NULL_RULES.get(entity)
    if rules is None:
        rules = []
        for f in fields(entity):
            hint = _hints(entity)[f.name]
            inner = _strip_none(hint)
            if typing.get_origin(inner) is tuple:
                inner = next(a for a in typing.get_args(inner) if a is not Ellipsis)
            nested = isinstance(inner, type) and is_dataclass(inner)
            rules.append((f.name, _is_nullable(hint), nested))
        _NULL_RULES[entity] = rules
    return rules


def _is_nullable(hint: Any) -> bool:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return type(None) in typing.get_args(hint)
    return False


def parse_header(frame: bytes, schema: type[Any]) -> Any:
    """The request header of ``frame`` as ``schema``'s header version reads it; raises
    MalformedRequest if it cannot."""
    try:
        header, _ = _reader(schema.__header_schema__)(frame, 0)
    except Exception as exc:  # kio raises several kinds on truncated or garbled input
        raise MalformedRequest(f"cannot read the header of {schema.__name__}: {exc}") from exc
    return header


def read_versioned(schema: type[Any], data: bytes) -> Any:
    """A versioned blob (a 2-byte version, then the body), as the consumer protocol's
    subscription and assignment are, read with ``schema``: later versions only add fields
    at the end, so the first version's schema reads every version's prefix. Raises
    ValueError."""
    if len(data) < 2 or struct.unpack_from(">h", data)[0] < 0:
        raise ValueError("no version")
    try:
        entity, _ = _reader(schema)(data, 2)
    except Exception as exc:  # kio raises several kinds on garbled input
        raise ValueError(str(exc)) from exc
    return entity


def encode_response(
    api_key: int, api_version: int, correlation_id: int, values: dict[str, Any]
) -> bytes:
    """The frame of a response, its size included."""
    schema = _schema(True, api_key, api_version)
    body = build(schema, values)
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    header_schema = schema.__header_schema__
    _writer(header_schema)(buffer, build(header_schema, {"correlation_id": correlation_id}))
    _writer(schema)(buffer, body)
    frame = buffer.getbuffer()
    FRAME_SIZE.pack_into(frame, 0, len(frame) - FRAME_SIZE.size)
    return bytes(frame)


def error_response(api_key: int, api_version: int, correlation_id: int, code: int) -> bytes:
    """The frame of a response that says only ``code``: its top-level error code where the
    version has one, every list empty."""
    return encode_response(api_key, api_version, correlation_id, {"error_code": code})


def build(entity: type[Any], values: dict[str, Any]) -> Any:
    """``entity`` from plain ``values`` (see the module docstring)."""
    hints = _hints(entity)
    kwargs = {}
    for f in fields(entity):
        if f.name in values:
            kwargs[f.name] = _convert(hints[f.name], values[f.name])
        elif f.default is MISSING and f.default_factory is MISSING:
            kwargs[f.name] = _zero(hints[f.name])
    return entity(**kwargs)


def _convert(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    hint = _strip_none(hint)
    origin = typing.get_origin(hint)
    if origin is tuple:
        (item,) = [a for a in typing.get_args(hint) if a is not Ellipsis]
        return tuple(_convert(item, v) for v in value)
    if hint is ErrorCode:
        return _error_code(value)
    if hint in (i32Timedelta, i64Timedelta):
        return datetime.timedelta(milliseconds=value)
    if hint is TZAware:
        return _timestamp(value)
    if isinstance(value, dict):
        return build(hint, value)
    return value


def _zero(hint: Any) -> Any:
    """A required field the values lack: its type's empty value."""
    hint = _strip_none(hint)
    if typing.get_origin(hint) is tuple:
        return ()
    if hint is ErrorCode:
        return ErrorCode.none
    if hint in (i32Timedelta, i64Timedelta):
        return datetime.timedelta(0)
    if hint is TZAware:
        return _timestamp(0)
    if hint is uuid.UUID:
        return uuid.UUID(int=0)
    if isinstance(hint, type) and is_dataclass(hint):
        return build(hint, {})
    if hint is str:
        return ""
    if hint is bool:
        return False
    if hint is bytes:
        return b""
    return 0


def _timestamp(ms: int) -> datetime.datetime:
    """A timestamp field (milliseconds since the epoch, -1 for none) as kio writes it."""
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)


def _error_code(code: int) -> ErrorCode:
    """A Kafka error code on the wire; kip98's local codes (negative, as librdkafka's) are
    not: a local timeout is Kafka's REQUEST_TIMED_OUT, anything else UNKNOWN_SERVER_ERROR."""
    if code in (KafkaError._TIMED_OUT, KafkaError._TRANSPORT):
        code = KafkaError.REQUEST_TIMED_OUT
    try:
        return ErrorCode(code)
    except ValueError:
        return ErrorCode.unknown_server_error


def _strip_none(hint: Any) -> Any:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


_HINTS: dict[type[Any], dict[str, Any]] = {}
_READERS: dict[type[Any], Any] = {}
_WRITERS: dict[type[Any], Any] = {}


def _hints(entity: type[Any]) -> dict[str, Any]:
    hints = _HINTS.get(entity)
    if hints is None:
        hints = _HINTS[entity] = typing.get_type_hints(entity)
    return hints


def _reader(entity: type[Any]) -> Any:
    reader = _READERS.get(entity)
    if reader is None:
        reader = _READERS[entity] = entity_reader(entity)
    return reader


def _writer(entity: type[Any]) -> Any:
    writer = _WRITERS.get(entity)
    if writer is None:
        writer = _WRITERS[entity] = entity_writer(entity)
    return writer
