"""Helpers for driving ``kip98 serve`` in tests: starting it, and talking to it with
librdkafka or with raw kio frames."""

from __future__ import annotations

import io
import socket
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import confluent_kafka as ck

from app.server.process import ServeProcess


def delivered(producer: ck.Producer, n: int, **produce: Any) -> list[tuple[Any, int]]:
    reports: list[tuple[Any, int]] = []
    for i in range(n):
        producer.produce(
            on_delivery=lambda err, msg: reports.append((err, msg.offset())),
            value=f"v{i}",
            **produce,
        )
    assert producer.flush(30) == 0
    return reports


def consume_all(consumer: ck.Consumer, want: int, timeout: float = 60) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        assert msg.error() is None, msg.error()
        got.append(msg)
    return got


def authentication_refused(client: Any, failures: list[ck.KafkaError], timeout: float = 60) -> bool:
    """Serve ``client``'s error callback (which appends to ``failures``) until it has been
    told its authentication failed; False if it never was (``timeout`` is a hang guard:
    the report comes whenever the client's connection attempt has been refused)."""
    deadline = time.monotonic() + timeout
    while not any(f.code() == ck.KafkaError._AUTHENTICATION for f in failures):
        if time.monotonic() >= deadline:
            return False
        client.poll(0.2)
    return True


def read_committed_values(config: dict[str, Any], topic: str, want: int) -> list[bytes]:
    """The first ``want`` values of partition 0 of ``topic``, read from offset 0 by a
    librdkafka read_committed consumer of ``config`` (its connection settings and group)."""
    reader = ck.Consumer(
        {**config, "auto.offset.reset": "earliest", "isolation.level": "read_committed"}
    )
    reader.assign([ck.TopicPartition(topic, 0, 0)])
    try:
        return [m.value() for m in consume_all(reader, want)]
    finally:
        reader.close()


def request_frame(api_key: int, version: int, body: Any) -> bytes:
    from kio.index import load_request_schema
    from kio.serial import entity_writer

    schema = load_request_schema(api_key, version)
    header = schema.__header_schema__(
        request_api_key=api_key, request_api_version=version, correlation_id=7, client_id="t"
    )
    buffer = io.BytesIO()
    entity_writer(schema.__header_schema__)(buffer, header)
    entity_writer(schema)(buffer, body)
    return struct.pack(">i", len(buffer.getvalue())) + buffer.getvalue()


def read_exactly(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes from ``sock``, however many reads they take; fewer if it closes first.
    (``recv(n, MSG_WAITALL)`` alone is not enough: a socket with a timeout is non-blocking
    underneath, and there it returns what has arrived so far, so a large answer that
    comes in pieces was read cut short, at random.)"""
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(n - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(sock: socket.socket) -> bytes:
    """One response frame (without its size); b"" if the connection closed instead."""
    head = read_exactly(sock, 4)
    if len(head) < 4:
        return b""
    return read_exactly(sock, struct.unpack(">i", head)[0])


def read_response(sock: socket.socket, api_key: int, version: int) -> Any:
    from kio.index import load_response_schema
    from kio.serial import entity_reader

    frame = read_frame(sock)
    schema = load_response_schema(api_key, version)
    _, offset = entity_reader(schema.__header_schema__)(frame, 0)
    return entity_reader(schema)(frame, offset)[0]


@contextmanager
def serving(db_url: str, *args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """A ``kip98 serve`` process on a free port (``args`` added to its command line,
    ``env`` to its environment); its bootstrap.servers. It must stop cleanly on SIGTERM."""
    serve = ServeProcess(db_url, args=args, env=env)
    serve.start()
    try:
        yield serve.address
    finally:
        try:
            assert serve.stop() == 0, "kip98 serve did not stop cleanly on SIGTERM"
        finally:
            serve.kill()


def exchange(server: str, api_key: int, version: int, body: Any) -> Any:
    """One request on its own connection, and its response."""
    host, port = server.split(":")
    with socket.create_connection((host, int(port)), 5) as s:
        s.settimeout(10)
        s.sendall(request_frame(api_key, version, body))
        return read_response(s, api_key, version)
