"""SASL/PLAIN on a ``SASL_PLAINTEXT`` listener of ``kip98 serve``, with librdkafka
(confluent-kafka) and raw frames against a real server process.

A connection authenticates before anything else; afterwards it acts as ``User:NAME``, which
the ACLs decide about; a wrong password and a request before authentication close the
connection and are counted.
"""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import confluent_kafka as ck
import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

from app.broker import Broker
from app.errors import KafkaError
from app.log.topics import create_topic
from app.security import acls
from app.security.rules import AclBinding
from app.server import sasl_listener_users
from app.server.process import ServeProcess, free_port
from app.server.sasl import UsersFileError, load_users, plain_user
from tests.cli_runner import run_kip98
from tests.txn_driver import read_values
from tests.wire_client import consume_all, delivered, read_response, request_frame

METADATA = MetadataRequest(
    topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
)
USERS = "# kip98 serve's SASL/PLAIN users\nalice=alice-secret\nbob = bob-secret\n\n"


@pytest.fixture
def users_file(tmp_path: Path) -> Path:
    path = tmp_path / "users"
    path.write_text(USERS)
    return path


def test_plain_tokens_and_the_users_file(users_file: Path) -> None:
    users = load_users(users_file)
    assert users == {"alice": "alice-secret", "bob": "bob-secret"}
    assert plain_user(b"\0alice\0alice-secret", users) == "alice"
    assert plain_user(b"alice\0alice\0alice-secret", users) == "alice"
    assert plain_user(b"bob\0alice\0alice-secret", users) is None  # alice may not act as bob
    assert plain_user(b"\0alice\0wrong", users) is None
    assert plain_user(b"\0carol\0alice-secret", users) is None
    assert plain_user(b"\0alice", users) is None
    assert plain_user(b"\0\xff\0x", users) is None
    bad = users_file.with_name("bad")
    for text in ("alice\n", "=x\n", "a=1\na=2\n"):
        bad.write_text(text)
        with pytest.raises(UsersFileError):
            load_users(bad)
    with pytest.raises(ValueError, match="go together"):
        sasl_listener_users("SASL_PLAINTEXT://127.0.0.1:9093", None)
    with pytest.raises(ValueError, match="go together"):
        sasl_listener_users("127.0.0.1:9092", users_file)


def test_serve_refuses_a_sasl_listener_without_users(users_file: Path) -> None:
    missing = run_kip98("serve", "--listen", "SASL_PLAINTEXT://127.0.0.1:1")
    assert missing.returncode != 0
    assert "--sasl-users" in missing.stderr and "Traceback" not in missing.stderr
    garbled = users_file.with_name("garbled")
    garbled.write_text("no equals sign\n")
    listen = "SASL_PLAINTEXT://127.0.0.1:1"
    bad = run_kip98("serve", "--listen", listen, "--sasl-users", str(garbled))
    assert bad.returncode != 0
    assert "not a name=password line" in bad.stderr and "Traceback" not in bad.stderr


@pytest.fixture
def sasl_server(db_url: str, users_file: Path) -> tuple[ServeProcess, int]:
    metrics_port = free_port()
    serve = ServeProcess(
        db_url,
        scheme="SASL_PLAINTEXT",
        args=("--sasl-users", str(users_file), "--metrics-listen", f"127.0.0.1:{metrics_port}"),
        env={"KIP98_AUTHORIZATION": "1", "KIP98_SUPER_USERS": "User:admin"},
    )
    serve.start()
    yield serve, metrics_port
    try:
        assert serve.stop() == 0
    finally:
        serve.kill()


def _client(server: str, user: str, password: str) -> dict[str, str]:
    return {
        "bootstrap.servers": server,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "PLAIN",
        "sasl.username": user,
        "sasl.password": password,
    }


def test_librdkafka_authenticates_and_acts_as_its_user(
    db_url: str, sasl_server: tuple[ServeProcess, int]
) -> None:
    serve, metrics_port = sasl_server
    admin = Broker.connect(db_url, principal="User:admin")
    create_topic(admin, "t", 1)
    acls.create_acls(
        admin,
        [
            AclBinding("User:alice", "topic", "t", "write"),
            AclBinding("User:alice", "topic", "t", "read"),
            AclBinding("User:alice", "group", "readers", "read"),
        ],
    )
    alice = ck.Producer({**_client(serve.address, "alice", "alice-secret"), "linger.ms": 5})
    assert [err for err, _ in delivered(alice, 3, topic="t", partition=0)] == [None] * 3
    assert read_values(admin, "t", 0) == ["v0", "v1", "v2"]

    reader = ck.Consumer(
        {**_client(serve.address, "alice", "alice-secret"), "group.id": "readers",
         "auto.offset.reset": "earliest", "isolation.level": "read_committed"}
    )  # fmt: skip
    reader.assign([ck.TopicPartition("t", 0, 0)])
    try:
        assert [m.value() for m in consume_all(reader, 3)] == [b"v0", b"v1", b"v2"]
    finally:
        reader.close()

    # bob authenticates, but the ACLs give him nothing on "t".
    bob = ck.Producer({**_client(serve.address, "bob", "bob-secret"), "linger.ms": 5})
    errors = [err for err, _ in delivered_or_failed(bob, "t")]
    assert [e.code() for e in errors] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert read_values(admin, "t", 0) == ["v0", "v1", "v2"]

    # A wrong password: the client is told, and nothing is written.
    failures: list[ck.KafkaError] = []
    mallory = ck.Producer(
        {**_client(serve.address, "alice", "guess"), "error_cb": failures.append,
         "message.timeout.ms": 3000}
    )  # fmt: skip
    [(refused, _)] = delivered_or_failed(mallory, "t")
    assert refused is not None
    assert any(f.code() == ck.KafkaError._AUTHENTICATION for f in failures), failures
    assert read_values(admin, "t", 0) == ["v0", "v1", "v2"]

    counted = _scraped(metrics_port)
    assert counted.get('kip98_server_refused_total{reason="authentication"}', 0) >= 1


def delivered_or_failed(producer: ck.Producer, topic: str) -> list[tuple[ck.KafkaError, int]]:
    reports: list[tuple[ck.KafkaError, int]] = []
    producer.produce(topic, b"x", partition=0, on_delivery=lambda e, m: reports.append((e, 0)))
    producer.flush(30)
    return reports


def test_a_request_before_authentication_closes_the_connection(
    sasl_server: tuple[ServeProcess, int],
) -> None:
    serve, metrics_port = sasl_server
    host, port = serve.host, serve.port
    # ApiVersions may come first (clients ask which SASL versions are served).
    with socket.create_connection((host, port), 5) as s:
        s.settimeout(10)
        s.sendall(
            request_frame(
                18, 3, ApiVersionsRequest(client_software_name="t", client_software_version="1")
            )
        )
        versions = read_response(s, 18, 3)
        served = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}
        assert served[17] == (1, 1) and served[36] == (0, 2)
        # Anything else before authenticating: no answer, the connection is closed.
        s.sendall(request_frame(3, 12, METADATA))
        assert s.recv(100) == b""
    # Authenticated, the same request is answered on the same connection.
    with socket.create_connection((host, port), 5) as s:
        s.settimeout(10)
        s.sendall(request_frame(17, 1, SaslHandshakeRequest(mechanism="SCRAM-SHA-256")))
        assert read_response(s, 17, 1).error_code == KafkaError.UNSUPPORTED_SASL_MECHANISM
        s.sendall(request_frame(17, 1, SaslHandshakeRequest(mechanism="PLAIN")))
        assert read_response(s, 17, 1).error_code == KafkaError.NO_ERROR
        s.sendall(request_frame(36, 2, SaslAuthenticateRequest(auth_bytes=b"\0bob\0bob-secret")))
        assert read_response(s, 36, 2).error_code == KafkaError.NO_ERROR
        s.sendall(request_frame(3, 12, METADATA))
        assert read_response(s, 3, 12).brokers[0].port == port
    # A wrong password is answered, then the connection is closed.
    with socket.create_connection((host, port), 5) as s:
        s.settimeout(10)
        s.sendall(request_frame(17, 1, SaslHandshakeRequest(mechanism="PLAIN")))
        read_response(s, 17, 1)
        s.sendall(request_frame(36, 2, SaslAuthenticateRequest(auth_bytes=b"\0bob\0nope")))
        answer = read_response(s, 36, 2)
        assert answer.error_code == KafkaError.SASL_AUTHENTICATION_FAILED
        assert s.recv(100) == b""
    counted = _scraped(metrics_port)
    assert counted['kip98_server_refused_total{reason="unauthenticated"}'] == 1
    assert counted['kip98_server_refused_total{reason="authentication"}'] == 1


def _scraped(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    return {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("kip98_server_")
    }


def test_a_plaintext_listener_takes_no_sasl(server: str) -> None:
    host, port = server.split(":")
    with socket.create_connection((host, int(port)), 5) as s:
        s.settimeout(10)
        s.sendall(request_frame(17, 1, SaslHandshakeRequest(mechanism="PLAIN")))
        answer = read_response(s, 17, 1)
        assert answer.error_code == KafkaError.UNSUPPORTED_SASL_MECHANISM
        assert answer.mechanisms == ()
