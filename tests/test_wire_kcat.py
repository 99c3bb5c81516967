"""``kcat`` (librdkafka's command-line client, as Debian packages it) against ``kip98
serve``: listing metadata, producing keyed records with headers, consuming in both
isolation levels; its records read by the native Consumer and the native Producer's by
it. ``scripts/setup`` installs kcat where it can."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from app.broker import Broker
from app.client import Consumer, Message, Producer, TopicPartition
from app.log.topics import create_topic
from app.security.users import add_user
from app.server.process import ServeProcess


@pytest.fixture
def kcat() -> str:
    path = shutil.which("kcat")
    if path is None:
        pytest.fail(
            "kcat is not installed: run scripts/setup as root or with sudo "
            "(it runs apt-get install kcat), or install Debian's kcat package"
        )
    return path


pytestmark = pytest.mark.broker(topics={"t": 2, "other": 3})


def run(kcat: str, server: str, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        [kcat, "-b", server, *args], input=stdin, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def consumed(kcat: str, server: str, partition: int, *args: str) -> list[dict[str, Any]]:
    """Every record of ``t`` [partition] from the beginning to the end, as kcat's JSON."""
    out = run(kcat, server, "-C", "-t", "t", "-p", str(partition), "-o", "beginning", "-e",
              "-J", *args)  # fmt: skip
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_metadata_lists_the_topics_and_their_partitions(
    kcat: str, server: str, broker: Broker
) -> None:
    listed = json.loads(run(kcat, server, "-L", "-J"))
    host, port = server.split(":")
    assert listed["brokers"] == [{"id": 0, "name": f"{host}:{port}"}]
    topics = {t["topic"]: t["partitions"] for t in listed["topics"]}
    assert {name: [p["partition"] for p in parts] for name, parts in topics.items()} == {
        "t": [0, 1],
        "other": [0, 1, 2],
    }
    assert all(p["leader"] == 0 for parts in topics.values() for p in parts)


def test_kcats_records_are_read_by_the_native_consumer(
    kcat: str, server: str, broker: Broker, db_url: str
) -> None:
    lines = "".join(f"key-{i}:value-{i}\n" for i in range(5))
    run(kcat, server, "-P", "-t", "t", "-p", "0", "-K", ":", "-H", "source=kcat", "-H",
        "n=1", "-X", "enable.idempotence=true", stdin=lines)  # fmt: skip
    native = Consumer({"database.url": db_url, "group.id": "native",
                       "auto.offset.reset": "earliest"})  # fmt: skip
    try:
        native.assign([TopicPartition("t", 0, 0)])
        got: list[Message] = []
        deadline = time.monotonic() + 30
        while len(got) < 5 and time.monotonic() < deadline:
            got += [m for m in native.consume(10, 0.5) if m.error() is None]
    finally:
        native.close()
    assert [(m.key(), m.value()) for m in got] == [
        (f"key-{i}".encode(), f"value-{i}".encode()) for i in range(5)
    ]
    assert all(m.headers() == [("source", b"kcat"), ("n", b"1")] for m in got)
    # And kcat reads back what it wrote.
    assert [(r["key"], r["payload"], r["headers"]) for r in consumed(kcat, server, 0)] == [
        (f"key-{i}", f"value-{i}", ["source", "kcat", "n", "1"]) for i in range(5)
    ]


def test_the_native_producers_transactions_are_read_by_kcat_in_both_isolation_levels(
    kcat: str, server: str, broker: Broker, db_url: str
) -> None:
    native = Producer({"database.url": db_url, "transactional.id": "native"})
    try:
        native.init_transactions()
        native.begin_transaction()
        native.produce("t", "kept", "k", partition=1, headers={"h": b"1"})
        native.commit_transaction()
        native.begin_transaction()
        native.produce("t", "aborted", partition=1)
        native.flush()
        native.abort_transaction()
        native.begin_transaction()
        native.produce("t", "open", partition=1)
        native.flush()

        committed = consumed(kcat, server, 1, "-X", "isolation.level=read_committed")
        assert [(r["offset"], r["key"], r["payload"], r["headers"]) for r in committed] == [
            (0, "k", "kept", ["h", "1"])
        ]
        everything = consumed(kcat, server, 1, "-X", "isolation.level=read_uncommitted")
        # Offsets 1 and 3 are the COMMIT and ABORT markers.
        assert [(r["offset"], r["payload"]) for r in everything] == [
            (0, "kept"), (2, "aborted"), (4, "open"),
        ]  # fmt: skip
        native.commit_transaction()
    finally:
        native.close()
    after = consumed(kcat, server, 1, "-X", "isolation.level=read_committed")
    assert [r["payload"] for r in after] == ["kept", "open"]


@pytest.fixture
def sasl_server(db_url: str) -> Iterator[str]:
    """A SASL_PLAINTEXT listener with a user of each mechanism."""
    admin = Broker.connect(db_url)
    create_topic(admin, "s", 1)
    add_user(admin, "alice", "alice-secret")
    add_user(admin, "carol", "carol-secret", "SCRAM-SHA-256")
    add_user(admin, "dave", "dave-secret", "SCRAM-SHA-512")
    with ServeProcess(db_url, scheme="SASL_PLAINTEXT") as serve:
        yield serve.address


@pytest.mark.parametrize(
    ("user", "mechanism"),
    [("alice", "PLAIN"), ("carol", "SCRAM-SHA-256"), ("dave", "SCRAM-SHA-512")],
)
def test_kcat_authenticates_by_each_mechanism(
    kcat: str, sasl_server: str, user: str, mechanism: str
) -> None:
    """Debian's kcat (librdkafka 2.0) checks that the broker serves SaslHandshake v0 before
    it logs in (it then logs in with v1 if served): as Kafka 4 does, v0 is served, so it
    produces and consumes by PLAIN and both SCRAMs."""
    sasl = ("-X", "security.protocol=SASL_PLAINTEXT", "-X", f"sasl.mechanisms={mechanism}",
            "-X", f"sasl.username={user}", "-X", f"sasl.password={user}-secret")  # fmt: skip
    run(kcat, sasl_server, *sasl, "-P", "-t", "s", "-p", "0", stdin=f"from-{user}\n")
    out = run(kcat, sasl_server, *sasl, "-C", "-t", "s", "-p", "0", "-o", "beginning", "-e",
              "-J")  # fmt: skip
    assert [json.loads(line)["payload"] for line in out.splitlines() if line.strip()] == [
        f"from-{user}"
    ]
