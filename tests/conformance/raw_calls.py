"""Raw requests for the scenarios of groups, administration and bad input: a request built
from plain values (as the server builds its answers), error codes by name, record
batches, and a partition's offsets as a client reads them.

What a scenario observes goes through here, so both brokers are asked the same bytes."""

from __future__ import annotations

import socket
import struct
from typing import Any

from kio.index import load_request_schema

from app.server.codec import build
from tests.conformance.harness import Target
from tests.conformance.normalise import error_name
from tests.helpers.batches import record_batch
from tests.helpers.wire_client import read_frame, request_frame

# Kafka's API keys, by the names the scenarios use.
PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
OFFSET_COMMIT, OFFSET_FETCH = 8, 9
JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 11, 12, 13, 14
DESCRIBE_GROUPS, LIST_GROUPS, API_VERSIONS = 15, 16, 18
CREATE_TOPICS, DELETE_RECORDS = 19, 21
DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS = 29, 30, 31
DESCRIBE_CONFIGS, ALTER_CONFIGS, CREATE_PARTITIONS = 32, 33, 37
DELETE_GROUPS, INCREMENTAL_ALTER_CONFIGS, OFFSET_DELETE = 42, 44, 47
DESCRIBE_CLUSTER, DESCRIBE_PRODUCERS, DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 60, 61, 65, 66

# ListOffsets' special timestamps.
LATEST, EARLIEST = -1, -2


def error(code: Any) -> str:
    """An error code by its name (``NONE`` for none), as ``normalise`` names them."""
    return error_name(code)


def call(target: Target, api_key: int, version: int, values: dict[str, Any]) -> Any:
    """One request of ``values`` (fields it lacks take their empty value) and its answer."""
    return target.raw(api_key, version, build(load_request_schema(api_key, version), values))


def call_frame(api_key: int, version: int, values: dict[str, Any]) -> bytes:
    """The frame of a request of ``values``, to send as it is."""
    return request_frame(api_key, version, build(load_request_schema(api_key, version), values))


def answered_within(target: Target, request: bytes, wait_s: float) -> bytes | None:
    """The answer frame to ``request`` on a fresh connection, or None if none came within
    ``wait_s`` or the connection closed: for a request a broker may leave unanswered."""
    host, port = target.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), 10) as sock:
        sock.settimeout(wait_s)
        sock.sendall(request)
        try:
            answer = read_frame(sock)
        except (TimeoutError, ConnectionError):
            return None
    return answer or None


def frame(api_key: int, version: int, body: bytes, correlation_id: int = 7) -> bytes:
    """A request frame with a v1 request header (client id ``t``) and ``body`` as given:
    the bytes of a request that may not be one."""
    header = struct.pack(">hhih", api_key, version, correlation_id, 1) + b"t"
    return struct.pack(">i", len(header) + len(body)) + header + body


def flexible_frame(api_key: int, version: int, body: bytes, correlation_id: int = 7) -> bytes:
    """A request frame with a v2 (flexible) request header and ``body`` as given."""
    header = struct.pack(">hhih", api_key, version, correlation_id, 1) + b"t" + b"\0"
    return struct.pack(">i", len(header) + len(body)) + header + body


def batch(values: list[bytes], *, key: bytes | None = None, base_timestamp: int = 0) -> bytes:
    """A record batch (magic 2, uncompressed, no producer id) of ``values``, each keyed
    ``key``."""
    keys = None if key is None else [key] * len(values)
    return record_batch(values, keys=keys, timestamp=base_timestamp or 1_700_000_000_000)


def produce(
    target: Target, topic: str, partition: int, records: bytes | None, *, acks: int = -1
) -> Any:
    """A Produce (v9) of ``records`` to one partition; its answer (None for acks=0)."""
    return call(target, PRODUCE, 9, {
        "transactional_id": None, "acks": acks, "timeout": 30_000,
        "topic_data": [{"name": topic, "partition_data": [{"index": partition,
                                                           "records": records}]}],
    })  # fmt: skip


def produced(answer: Any) -> list[tuple[str, int]]:
    """Each partition's (error, base offset) of a Produce answer."""
    return [
        (error(p.error_code), p.base_offset)
        for t in answer.responses
        for p in t.partition_responses
    ]


def offsets(target: Target, topic: str, partition: int = 0) -> dict[str, Any]:
    """The partition's log start and end, as ListOffsets answers them (the error's name
    for a partition there is not)."""
    found = {}
    for name, timestamp in (("start", EARLIEST), ("end", LATEST)):
        answer = call(target, LIST_OFFSETS, 7, {
            "replica_id": -1, "isolation_level": 0,
            "topics": [{"name": topic, "partitions": [
                {"partition_index": partition, "current_leader_epoch": -1,
                 "timestamp": timestamp}]}],
        })  # fmt: skip
        p = answer.topics[0].partitions[0]
        if p.error_code:
            return {"error": error(p.error_code)}
        found[name] = p.offset
    return found


def log_end(target: Target, topic: str, partition: int = 0) -> int:
    """The partition's high watermark relative to its log start (the records it holds)."""
    found = offsets(target, topic, partition)
    return int(found["end"] - found["start"])
