"""Every request a client can send gets an answer on a connection that stays open.

Against a real ``kip98 serve``: hypothesis builds valid requests of every API and version
ApiVersions advertises, from kio's schemas (Kafka's own message definitions), with edge
values (NUL and non-ASCII strings, empty and long arrays, the smallest and largest
numbers, unknown and deleted topics, garbage and real record batches) and each must be
answered with a response of that API and version, after which the same connection still
answers. A failure of the broker (a lock bound reached) is the failing items' error code.
ApiVersions advertises exactly what is answered.
"""

from __future__ import annotations

import dataclasses
import datetime
import socket
import struct
import types
import typing
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.serial import entity_reader
from kio.serial.errors import OutOfBoundValue
from kio.static.primitive import (
    Records,
    i8,
    i16,
    i32,
    i32Timedelta,
    i64,
    i64Timedelta,
)

from app.broker import Broker
from app.errors import KafkaError
from app.log.topics import create_topic, delete_topic
from app.protocol import ProduceRequest, RecordIn
from app.server.apis import APIS
from app.server.process import ServeProcess
from app.storage.driver import libpq_conninfo
from tests.helpers.batches import record_batch
from tests.helpers.wire_client import read_frame, request_frame

API_VERSIONS = 18
SERVED = sorted((key, v) for key, (low, high, _) in APIS.items() for v in range(low, high + 1))
# Names a request may carry: a topic there is, one deleted, one never made, and anything.
TOPIC, DELETED, UNKNOWN = "t", "gone", "nope"
NAMES = (TOPIC, DELETED, UNKNOWN, "g", "", "\x00", "é☃", "a" * 249)


def _batch(codec: int, transactional: bool = False) -> bytes:
    return record_batch(["v☃"] * 3, keys=[b"k\x00"] * 3, codec=codec, transactional=transactional,
                        timestamp=1_700_000_000_000, headers=[("h", b"\x00")])  # fmt: skip


RECORDS = st.one_of(
    st.none(), st.just(b""), st.binary(max_size=80),
    st.sampled_from([_batch(0), _batch(1), _batch(3), _batch(0, transactional=True)]),
)  # fmt: skip
TEXT = st.one_of(st.sampled_from(NAMES), st.text(max_size=12))
BOUNDS = {i8: (-(2**7), 2**7 - 1), i16: (-(2**15), 2**15 - 1), i32: (-(2**31), 2**31 - 1),
          i64: (-(2**63), 2**63 - 1)}  # fmt: skip
# Durations stay short: a request that asks to wait (a fetch's max_wait, a join's
# rebalance timeout) is answered when its wait is up, which is not what is tested here.
DURATIONS = st.sampled_from([0, 1, 20]).map(lambda ms: datetime.timedelta(milliseconds=ms))


def _integers(kind: type[Any]) -> st.SearchStrategy[int]:
    low, high = next(b for k, b in BOUNDS.items() if issubclass(kind, k))
    edges = st.sampled_from([low, -1, 0, 1, 2, high])
    return st.one_of(edges, st.integers(low, high), st.integers(-1, 3))


def _strategy(hint: Any, depth: int = 0) -> st.SearchStrategy[Any]:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return st.one_of(st.none(), _strategy(inner[0], depth))
    if origin is tuple:
        (item,) = [a for a in typing.get_args(hint) if a is not Ellipsis]
        element = _strategy(item, depth + 1)
        few = st.lists(element, max_size=3 if depth else 4).map(tuple)
        if depth:
            return few
        return st.one_of(few, st.lists(element, min_size=40, max_size=40).map(tuple))
    if dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        fields = {f.name: _strategy(hints[f.name], depth) for f in dataclasses.fields(hint)}
        return st.builds(hint, **fields)
    if hint is bool:
        return st.booleans()
    if isinstance(hint, type) and issubclass(hint, Records):
        return RECORDS
    if hint is bytes:
        return st.binary(max_size=40)
    if hint in (i32Timedelta, i64Timedelta):
        return DURATIONS
    if hint is uuid.UUID:
        return st.one_of(st.just(uuid.UUID(int=0)), st.uuids())
    if isinstance(hint, type) and issubclass(hint, int):
        return _integers(hint)
    if isinstance(hint, type) and issubclass(hint, str):
        return TEXT
    raise TypeError(f"no strategy for {hint!r}")


REQUESTS = {
    (key, v): _strategy(load_request_schema(key, v)) for key, v in SERVED if key != API_VERSIONS
}


def _send(sock: socket.socket, key: int, version: int, body: Any, correlation: int) -> None:
    frame = bytearray(request_frame(key, version, body))
    struct.pack_into(">i", frame, 8, correlation)  # after size, api key and version
    sock.sendall(bytes(frame))


def _answer(sock: socket.socket, key: int, version: int, correlation: int) -> Any:
    frame = read_frame(sock)
    assert frame, f"the connection closed instead of answering API {key} v{version}"
    schema = load_response_schema(key, version)
    header, offset = entity_reader(schema.__header_schema__)(frame, 0)
    assert header.correlation_id == correlation
    try:
        return entity_reader(schema)(frame, offset)[0]
    except OutOfBoundValue as exc:
        # A timestamp of -1 ("none": a transaction not started, as Kafka gives it in
        # DescribeTransactions) is valid on the wire, as Kafka's generated readers take it;
        # kio's reader refuses any negative timestamp.
        if "negative timestamp" not in str(exc):
            raise
        return None


def _still_open(sock: socket.socket) -> None:
    _send(
        sock,
        API_VERSIONS,
        3,
        ApiVersionsRequest(client_software_name="t", client_software_version="1"),
        99,
    )
    assert _answer(sock, API_VERSIONS, 3, 99).error_code.value == 0


@pytest.fixture
def answering(db_url: str) -> Iterator[str]:
    """A server over a topic that exists (``t``, two partitions with records) and one
    deleted (``gone``); groups form at once."""
    broker = Broker.connect(db_url)
    create_topic(broker, TOPIC, 2)
    create_topic(broker, DELETED, 1)
    delete_topic(broker, DELETED)
    broker.handle(ProduceRequest(TOPIC, 0, [RecordIn(b"k", b"v", 0)] * 3))
    serve = ServeProcess(db_url, env={"KIP98_DB_LOCK_TIMEOUT_MS": "2000"})
    serve.start()
    try:
        yield serve.address
    finally:
        try:
            assert serve.stop() == 0
        finally:
            serve.kill()


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_every_request_is_answered_on_an_open_connection(answering: str, data: Any) -> None:
    key, version = data.draw(st.sampled_from(sorted(REQUESTS)), label="api")
    body = data.draw(REQUESTS[(key, version)], label="request")
    host, port = answering.split(":")
    with socket.create_connection((host, int(port)), 10) as sock:
        sock.settimeout(60)
        _send(sock, key, version, body, 7)
        if not (key == 0 and body.acks == 0):  # acks=0: Kafka answers nothing
            _answer(sock, key, version, 7)
        _still_open(sock)


def test_api_versions_advertises_exactly_what_is_answered(server: str) -> None:
    """Every advertised key and version answers a request built from its own schema; a
    version past the advertised range (of each served key, and a key not served) closes
    the connection, as Kafka's broker closes it (ApiVersions of a later version is
    answered with the versions there are, as Kafka answers it: test_wire.py)."""
    host, port = server.split(":")
    with socket.create_connection((host, int(port)), 10) as sock:
        sock.settimeout(30)
        _send(
            sock,
            API_VERSIONS,
            3,
            ApiVersionsRequest(client_software_name="t", client_software_version="1"),
            1,
        )
        advertised = {
            (k.api_key, v)
            for k in _answer(sock, API_VERSIONS, 3, 1).api_keys
            for v in range(k.min_version, k.max_version + 1)
        }
    assert advertised == set(SERVED)
    for key, version in SERVED:
        if key == API_VERSIONS:
            continue
        body = REQUESTS[(key, version)].example()
        with socket.create_connection((host, int(port)), 10) as sock:
            sock.settimeout(30)
            _send(sock, key, version, body, 5)
            if not (key == 0 and body.acks == 0):
                _answer(sock, key, version, 5)
            _still_open(sock)
    past = {(k, max(v for kk, v in SERVED if kk == k) + 1) for k, _ in SERVED}
    past.discard((API_VERSIONS, max(v for k, v in SERVED if k == API_VERSIONS) + 1))
    for key, version in sorted(past | {(27, 0), (34, 0)}):  # and keys not served at all
        try:
            body = load_request_schema(key, version)
        except Exception:
            continue  # kio has no later version to send
        frame = request_frame(key, version, _minimal(body))
        with socket.create_connection((host, int(port)), 10) as sock:
            sock.settimeout(30)
            sock.sendall(frame)
            assert sock.recv(4) == b"", f"API {key} v{version} is not served yet was answered"


def _minimal(schema: type[Any]) -> Any:
    """A request of ``schema`` with every field empty."""
    return st.builds(schema, **{
        f.name: st.just(_empty(h))
        for f, h in ((f, typing.get_type_hints(schema)[f.name]) for f in dataclasses.fields(schema))
    }).example()  # fmt: skip


def _empty(hint: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        return None
    if origin is tuple:
        return ()
    if dataclasses.is_dataclass(hint):
        return _minimal(hint)
    if hint in (i32Timedelta, i64Timedelta):
        return datetime.timedelta(0)
    if hint is uuid.UUID:
        return uuid.UUID(int=0)
    if hint is bool:
        return False
    if isinstance(hint, type) and issubclass(hint, bytes):
        return b""
    if isinstance(hint, type) and issubclass(hint, str):
        return ""
    return 0


def test_a_failing_item_is_answered_with_its_error(answering: str, db_url: str) -> None:
    """DeleteRecords of two partitions, one of which another session holds the cleaner's
    lock of past the server's lock bound: that partition is answered REQUEST_TIMED_OUT,
    retriable, the other is deleted, and the connection goes on answering."""
    from kio.schema.delete_records.v2.request import (
        DeleteRecordsPartition,
        DeleteRecordsRequest,
        DeleteRecordsTopic,
    )

    holder = psycopg.connect(libpq_conninfo(db_url), autocommit=True)
    try:
        holder.execute("SELECT pg_advisory_lock(hashtext('kip98.cleaner'), hashtext('t/1'))")
        request = DeleteRecordsRequest(
            topics=(
                DeleteRecordsTopic(
                    name=TOPIC,
                    partitions=(
                        DeleteRecordsPartition(partition_index=0, offset=2),
                        DeleteRecordsPartition(partition_index=1, offset=0),
                    ),
                ),
            ),
            timeout=datetime.timedelta(seconds=30),
        )
        host, port = answering.split(":")
        with socket.create_connection((host, int(port)), 10) as sock:
            sock.settimeout(60)
            _send(sock, 21, 2, request, 3)
            answer = _answer(sock, 21, 2, 3)
            _still_open(sock)
        results = {p.partition_index: p for t in answer.topics for p in t.partitions}
        assert (results[0].error_code.value, results[0].low_watermark) == (0, 2)
        assert results[1].error_code.value == KafkaError.REQUEST_TIMED_OUT
    finally:
        holder.close()


def test_every_request_type_has_a_failed_answer() -> None:
    """A broker failure can be answered for every request the wire handlers send: its
    response lists an answer per item (each failed) or starts with an error code."""
    from app.broker.apis import HANDLERS
    from app.protocol import (
        FindHangingTransactionsRequest,
        ListTopicsRequest,
        WriteTxnMarkersRequest,
    )
    from app.server.failures import _EVERY_ITEM, _response_type

    # What only the native clients send (the wire has no such API, or its own).
    native = {FindHangingTransactionsRequest, ListTopicsRequest, WriteTxnMarkersRequest}
    for request in HANDLERS:
        if request in _EVERY_ITEM or request in native:
            continue
        kind = _response_type(request)
        first = dataclasses.fields(kind)[0]
        assert first.name == "error_code", f"{request.__name__} has no failed answer"


def test_authorized_operations_not_read_are_unknown() -> None:
    """KIP-430's operations are asked by Metadata, DescribeCluster and DescribeGroups on the
    wire: the ACLs not read leave each resource's "not worked out" (INT32_MIN), and the
    describe answers still."""
    from app.protocol import AuthorizedOperationsRequest
    from app.server.answer import NO_OPERATIONS
    from app.server.failures import failed_response

    lost = KafkaError(KafkaError._TRANSPORT, "database unreachable", retriable=True)
    answered = failed_response(AuthorizedOperationsRequest("group", ("g1", "g2")), lost)
    assert answered.operations == {"g1": NO_OPERATIONS, "g2": NO_OPERATIONS}


def test_a_coordinators_request_meets_a_lost_database_as_coordinator_not_available() -> None:
    """As Kafka's coordinators answer a failed write to their log: clients find the
    coordinator again and retry inside the call. Other requests keep their code."""
    from app.errors import KafkaError
    from app.protocol import EndTxnRequest, JoinGroupRequest, ListOffsetsRequest
    from app.server.failures import coordinator_failure

    lost = KafkaError(KafkaError._TRANSPORT, "database unreachable", retriable=True)
    for request in (EndTxnRequest("t", 1, 0, True), JoinGroupRequest("g", "", ["t"], 10_000)):
        answered = coordinator_failure(request, lost)
        assert answered.code() == KafkaError.COORDINATOR_NOT_AVAILABLE and answered.retriable()
    assert coordinator_failure(ListOffsetsRequest("t", 0, -1), lost) is lost
    bug = KafkaError(KafkaError.UNKNOWN_SERVER_ERROR, "a bug")
    assert coordinator_failure(EndTxnRequest("t", 1, 0, True), bug) is bug


def test_schemas_are_first_loaded_one_at_a_time(monkeypatch: Any) -> None:
    """kio imports a schema's module on its first use, and its modules import each other:
    two worker threads importing at once can meet Python's import deadlock, which failed a
    request in a loaded run. Loads of distinct schemas started together never overlap,
    and each is made once."""
    import threading
    import time

    from app.server import codec

    inside, most, calls = 0, 0, []
    guard = threading.Lock()

    def slow_load(api_key: int, api_version: int) -> type:
        nonlocal inside, most
        with guard:
            inside += 1
            most = max(most, inside)
            calls.append((api_key, api_version))
        time.sleep(0.02)
        with guard:
            inside -= 1
        return type(f"Schema{api_key}v{api_version}", (), {})

    monkeypatch.setattr(codec, "_schemas", {})
    monkeypatch.setattr(codec, "load_request_schema", slow_load)
    start = threading.Barrier(8)

    def ask(i: int) -> None:
        start.wait()
        for version in range(4):
            codec.request_schema(1000 + i % 4, version)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most == 1
    assert sorted(calls) == [(1000 + k, v) for k in range(4) for v in range(4)]


def test_a_frame_that_arrives_in_pieces_is_read_whole() -> None:
    """A large answer reaches the client in several pieces; the test client reads the
    whole frame however they come (reading once with MSG_WAITALL on a socket with a
    timeout returned the first piece: a CreateAcls answer failed to decode, at random).
    The second piece is sent only once the first has been read."""
    import fcntl
    import termios
    import threading

    reader, writer = socket.socketpair()
    reader.settimeout(60)
    frame = bytes(range(256)) * 64
    whole = struct.pack(">i", len(frame)) + frame
    read: list[bytes] = []

    def pending() -> int:
        count = bytearray(4)
        fcntl.ioctl(reader.fileno(), termios.FIONREAD, count)
        return int.from_bytes(count, "little")

    with reader, writer:
        thread = threading.Thread(target=lambda: read.append(read_frame(reader)))
        writer.sendall(whole[:1000])
        thread.start()
        while pending() and thread.is_alive():
            thread.join(0.01)
        writer.sendall(whole[1000:])
        thread.join(60)
    assert read == [frame]


def test_acls_for_one_host_are_refused_each_with_its_own_reason(server: str) -> None:
    """kip98's ACLs hold for every host: a CreateAcls naming hosts is refused whole, each
    result with its own reason, naming its own host only (each once listed every host,
    which made the answer to forty long hosts 400 kB)."""
    from kio.schema.create_acls.v1.request import AclCreation, CreateAclsRequest

    hosts = [f"<{i}>" + "h" * 240 for i in range(40)] + ["*"]
    creations = tuple(
        AclCreation(resource_type=2, resource_name="t", resource_pattern_type=3,
                    principal="User:a", host=h, operation=3, permission_type=3)
        for h in hosts
    )  # fmt: skip
    host, port = server.split(":")
    with socket.create_connection((host, int(port)), 10) as sock:
        sock.settimeout(60)
        _send(sock, 30, 1, CreateAclsRequest(creations=creations), 4)
        answer = _answer(sock, 30, 1, 4)
        _still_open(sock)
    assert [r.error_code.value for r in answer.results] == [KafkaError.INVALID_REQUEST] * 41
    for h, result in zip(hosts[:-1], answer.results, strict=False):
        assert h in result.error_message
        assert not any(o in result.error_message for o in hosts[:-1] if o != h)
    assert "another ACL" in answer.results[-1].error_message
