"""SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) on a ``SASL_PLAINTEXT`` listener of
``kip98 serve``, with librdkafka (confluent-kafka), kafka-python and raw frames against a
real server process.

A connection authenticates before anything else; afterwards it acts as ``User:NAME``, which
the ACLs decide about; a wrong password and a request before authentication close the
connection and are counted.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import socket
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import confluent_kafka as ck
import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v0.request import SaslHandshakeRequest as SaslHandshakeV0
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
from scramp import ScramClient
from sqlalchemy import text

from app.broker import Broker
from app.errors import KafkaError, KafkaException
from app.log.topics import create_topic
from app.security import acls
from app.security.rules import AclBinding
from app.security.users import add_user, check_plain, delete_user, scram_user
from app.server.process import ServeProcess, free_port
from app.server.sasl import plain_credentials
from tests.helpers.cli_runner import run_kip98
from tests.helpers.txn_driver import read_values
from tests.helpers.wire_client import (
    authentication_refused,
    delivered,
    read_committed_values,
    read_frame,
    read_response,
    request_frame,
)

METADATA = MetadataRequest(
    topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
)


def test_plain_tokens() -> None:
    assert plain_credentials(b"\0alice\0alice-secret") == ("alice", "alice-secret")
    assert plain_credentials(b"alice\0alice\0alice-secret") == ("alice", "alice-secret")
    assert plain_credentials(b"bob\0alice\0alice-secret") is None  # alice may not act as bob
    assert plain_credentials(b"\0\0secret") is None
    assert plain_credentials(b"\0alice") is None
    assert plain_credentials(b"\0\xff\0x") is None


def test_users_are_kept_salted_and_checked(db_url: str) -> None:
    admin = Broker.connect(db_url)
    add_user(admin, "alice", "alice-secret")
    with admin.engine.connect() as conn:
        stored = conn.execute(
            text("SELECT salt, iterations, stored_key, server_key FROM sasl_users")
        ).one()
    # RFC 5802's keys, not the password: what a SCRAM-SHA-256 server keeps.
    salted = hashlib.pbkdf2_hmac("sha256", b"alice-secret", bytes(stored.salt), stored.iterations)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    assert bytes(stored.stored_key) == hashlib.sha256(client_key).digest()
    assert bytes(stored.server_key) == hmac.digest(salted, b"Server Key", "sha256")
    assert len(stored.salt) == 16 and stored.iterations >= 4096
    assert check_plain(admin, "alice", "alice-secret")
    assert not check_plain(admin, "alice", "wrong")
    assert not check_plain(admin, "carol", "alice-secret")
    add_user(admin, "alice", "new-secret")  # a new password replaces the old one
    assert check_plain(admin, "alice", "new-secret")
    assert not check_plain(admin, "alice", "alice-secret")
    for name, password in (("", "x"), ("a\0b", "x"), ("bob", "")):
        with pytest.raises(KafkaException) as refused:
            add_user(admin, name, password)
        assert refused.value.error.code() == KafkaError.INVALID_REQUEST
    # A SCRAM-SHA-512 user: SHA-512 keys, for its own mechanism only (not PLAIN's check).
    add_user(admin, "dave", "dave-secret", "SCRAM-SHA-512")
    dave = scram_user(admin, "dave", "SCRAM-SHA-512")
    assert dave is not None and len(dave.stored_key) == len(dave.server_key) == 64
    salted = hashlib.pbkdf2_hmac("sha512", b"dave-secret", dave.salt, dave.iterations)
    assert dave.stored_key == hashlib.sha512(hmac.digest(salted, b"Client Key", "sha512")).digest()
    assert scram_user(admin, "dave", "SCRAM-SHA-256") is None
    assert scram_user(admin, "alice", "SCRAM-SHA-256") is None  # a PLAIN user
    assert not check_plain(admin, "dave", "dave-secret")
    with pytest.raises(KafkaException) as mechanism:
        add_user(admin, "erin", "x", "GSSAPI")
    assert mechanism.value.error.code() == KafkaError.UNSUPPORTED_SASL_MECHANISM
    delete_user(admin, "alice")
    assert not check_plain(admin, "alice", "new-secret")
    with pytest.raises(KafkaException) as missing:
        delete_user(admin, "alice")
    assert missing.value.error.code() == KafkaError.RESOURCE_NOT_FOUND


def test_kip98_users_add_list_delete(db_url: str) -> None:
    env = {"KIP98_DATABASE_URL": db_url}
    added = run_kip98("users", "add", "alice", "--password", "alice-secret", env=env)
    assert added.returncode == 0, added.stderr
    listed = run_kip98("users", "list", "--output", "json", env=env)
    assert listed.returncode == 0, listed.stderr
    [alice] = json.loads(listed.stdout)
    assert (alice["name"], alice["mechanism"]) == ("alice", "PLAIN")
    scram = run_kip98("users", "add", "carol", "--password", "x", "--mechanism", "SCRAM-SHA-512",
                      env=env)  # fmt: skip
    assert scram.returncode == 0, scram.stderr
    listed = run_kip98("users", "list", "--output", "json", env=env)
    assert [(u["name"], u["mechanism"]) for u in json.loads(listed.stdout)] == [
        ("alice", "PLAIN"),
        ("carol", "SCRAM-SHA-512"),
    ]
    unknown = run_kip98("users", "add", "bob", "--password", "x", "--mechanism", "GSSAPI",
                        env=env)  # fmt: skip
    assert unknown.returncode != 0 and "Traceback" not in unknown.stderr
    empty = run_kip98("users", "add", "bob", "--password", "", env=env)
    assert empty.returncode != 0 and "password" in empty.stderr and "Traceback" not in empty.stderr
    assert run_kip98("users", "delete", "alice", env=env).returncode == 0
    assert run_kip98("users", "delete", "carol", env=env).returncode == 0
    gone = run_kip98("users", "delete", "alice", env=env)
    assert gone.returncode != 0 and "no user 'alice'" in gone.stderr
    assert json.loads(run_kip98("users", "list", "--output", "json", env=env).stdout) == []


@pytest.fixture
def sasl_server(db_url: str) -> Iterator[tuple[ServeProcess, int]]:
    admin = Broker.connect(db_url, principal="User:admin")
    add_user(admin, "alice", "alice-secret")
    add_user(admin, "bob", "bob-secret")
    add_user(admin, "carol", "carol-secret", "SCRAM-SHA-256")
    add_user(admin, "dave", "dave-secret", "SCRAM-SHA-512")
    metrics_port = free_port()
    serve = ServeProcess(
        db_url,
        scheme="SASL_PLAINTEXT",
        args=("--metrics-listen", f"127.0.0.1:{metrics_port}"),
        env={"KIP98_AUTHORIZATION": "1", "KIP98_SUPER_USERS": "User:admin"},
    )
    serve.start()
    yield serve, metrics_port
    try:
        assert serve.stop() == 0
    finally:
        serve.kill()


def _client(server: str, user: str, password: str, mechanism: str = "PLAIN") -> dict[str, str]:
    return {
        "bootstrap.servers": server,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": mechanism,
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

    read = read_committed_values(
        {**_client(serve.address, "alice", "alice-secret"), "group.id": "readers"}, "t", 3
    )
    assert read == [b"v0", b"v1", b"v2"]

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
    assert authentication_refused(mallory, failures), failures
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
        # As Kafka 4 serves them: v0 of SaslHandshake too (its tokens as bare frames),
        # which librdkafka's check of the broker's versions asks for.
        assert served[17] == (0, 1) and served[36] == (0, 2)
        # Anything else before authenticating: no answer, the connection is closed.
        s.sendall(request_frame(3, 12, METADATA))
        assert s.recv(100) == b""
    # A mechanism not enabled is answered with the enabled ones, then the connection is
    # closed, as Kafka's SaslServerAuthenticator closes it.
    with socket.create_connection((host, port), 5) as s:
        s.settimeout(10)
        s.sendall(request_frame(17, 1, SaslHandshakeRequest(mechanism="GSSAPI")))
        refused = read_response(s, 17, 1)
        assert refused.error_code == KafkaError.UNSUPPORTED_SASL_MECHANISM
        assert refused.mechanisms == ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
        assert s.recv(100) == b""
    # Authenticated, the same request is answered on the same connection.
    with socket.create_connection((host, port), 5) as s:
        s.settimeout(10)
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
    # The unsupported mechanism and the wrong password.
    assert counted['kip98_server_refused_total{reason="authentication"}'] == 2


@pytest.mark.parametrize(
    ("user", "mechanism"), [("carol", "SCRAM-SHA-256"), ("dave", "SCRAM-SHA-512")]
)
def test_librdkafka_authenticates_by_scram(
    db_url: str, sasl_server: tuple[ServeProcess, int], user: str, mechanism: str
) -> None:
    """Both SCRAM mechanisms with librdkafka: the user's ACLs apply; a wrong password, a
    user of the other mechanism and a SCRAM user trying PLAIN are refused."""
    serve, _ = sasl_server
    admin = Broker.connect(db_url, principal="User:admin")
    create_topic(admin, "s", 1)
    acls.create_acls(admin, [AclBinding(f"User:{user}", "topic", "s", "write")])
    good = _client(serve.address, user, f"{user}-secret", mechanism)
    writer = ck.Producer({**good, "linger.ms": 5})
    assert [err for err, _ in delivered(writer, 2, topic="s", partition=0)] == [None] * 2
    assert read_values(admin, "s", 0) == ["v0", "v1"]
    other = "SCRAM-SHA-512" if mechanism == "SCRAM-SHA-256" else "SCRAM-SHA-256"
    for bad in (
        {**good, "sasl.password": "guess"},
        {**good, "sasl.mechanisms": other},
        {**good, "sasl.mechanisms": "PLAIN"},
        _client(serve.address, "alice", "alice-secret", mechanism),  # a PLAIN user
    ):
        failures: list[ck.KafkaError] = []
        refused = ck.Producer({**bad, "error_cb": failures.append, "message.timeout.ms": 3000})
        [(err, _)] = delivered_or_failed(refused, "s")
        assert err is not None
        assert authentication_refused(refused, failures), (bad, failures)
    assert read_values(admin, "s", 0) == ["v0", "v1"]


def test_kafka_python_authenticates_by_scram(
    db_url: str, sasl_server: tuple[ServeProcess, int]
) -> None:
    """A second SCRAM client implementation (kafka-python's, in Python)."""
    from kafka import KafkaProducer

    serve, _ = sasl_server
    admin = Broker.connect(db_url, principal="User:admin")
    create_topic(admin, "k", 1)
    acls.create_acls(admin, [AclBinding("User:dave", "topic", "k", "write")])
    producer = KafkaProducer(
        bootstrap_servers=serve.address, security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="dave",
        sasl_plain_password="dave-secret", api_version=(2, 8),
    )  # fmt: skip
    try:
        producer.send("k", b"kp", partition=0).get(timeout=30)
    finally:
        producer.close()
    assert read_values(admin, "k", 0) == ["kp"]


def test_a_scram_exchange_in_frames(sasl_server: tuple[ServeProcess, int]) -> None:
    """The two SaslAuthenticate rounds: the server's final message carries its signature
    (which the client checks: the server knew the credential); a forged proof is refused
    and the connection closed."""
    serve, _ = sasl_server

    def exchange(s: socket.socket, client: ScramClient, forge: bool = False) -> Any:
        s.sendall(request_frame(17, 1, SaslHandshakeRequest(mechanism="SCRAM-SHA-256")))
        assert read_response(s, 17, 1).error_code == KafkaError.NO_ERROR
        first = client.get_client_first().encode()
        s.sendall(request_frame(36, 2, SaslAuthenticateRequest(auth_bytes=first)))
        answer = read_response(s, 36, 2)
        assert answer.error_code == KafkaError.NO_ERROR
        client.set_server_first(bytes(answer.auth_bytes).decode())
        final = client.get_client_final()
        if forge:
            final = final[: final.index(",p=")] + ",p=" + "A" * 44
        s.sendall(request_frame(36, 2, SaslAuthenticateRequest(auth_bytes=final.encode())))
        return read_response(s, 36, 2)

    with socket.create_connection((serve.host, serve.port), 5) as s:
        s.settimeout(10)
        client = ScramClient(["SCRAM-SHA-256"], "carol", "carol-secret")
        done = exchange(s, client)
        assert done.error_code == KafkaError.NO_ERROR
        client.set_server_final(bytes(done.auth_bytes).decode())  # raises if not signed right
        s.sendall(request_frame(3, 12, METADATA))
        assert read_response(s, 3, 12).brokers[0].port == serve.port
    with socket.create_connection((serve.host, serve.port), 5) as s:
        s.settimeout(10)
        forged = exchange(s, ScramClient(["SCRAM-SHA-256"], "carol", "x"), forge=True)
        assert forged.error_code == KafkaError.SASL_AUTHENTICATION_FAILED
        assert s.recv(100) == b""


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
        assert answer.error_code == KafkaError.ILLEGAL_SASL_STATE
        assert answer.mechanisms == ()


def test_super_users_given_to_serve(db_url: str) -> None:
    """``--super-user`` replaces KIP98_SUPER_USERS for the server: bob may write with no
    ACL at all, alice (no longer a super user there) may not."""
    admin = Broker.connect(db_url, principal="User:admin")
    add_user(admin, "alice", "alice-secret")
    add_user(admin, "bob", "bob-secret")
    create_topic(admin, "t", 1)
    serve = ServeProcess(
        db_url,
        scheme="SASL_PLAINTEXT",
        args=("--super-user", "User:bob"),
        env={"KIP98_AUTHORIZATION": "1", "KIP98_SUPER_USERS": "User:alice"},
    )
    with serve:
        bob = ck.Producer({**_client(serve.address, "bob", "bob-secret"), "linger.ms": 5})
        assert [err for err, _ in delivered(bob, 1, topic="t", partition=0)] == [None]
        alice = ck.Producer({**_client(serve.address, "alice", "alice-secret"), "linger.ms": 5})
        [(refused, _)] = delivered_or_failed(alice, "t")
        assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert read_values(admin, "t", 0) == ["v0"]


def _bare(s: socket.socket, token: bytes) -> bytes:
    """A token after a v0 SaslHandshake: a bare frame each way."""
    s.sendall(len(token).to_bytes(4, "big") + token)
    return read_frame(s)


def test_a_v0_handshake_takes_its_tokens_as_bare_frames(
    sasl_server: tuple[ServeProcess, int],
) -> None:
    """SaslHandshake v0, as Kafka 4 still serves it: the tokens follow without Kafka's
    framing, PLAIN's answered by an empty one, SCRAM's by the server's messages; then the
    connection is authenticated. A wrong password closes it without an answer (v0 has no
    way to say why), as Kafka does."""
    serve, metrics_port = sasl_server
    with socket.create_connection((serve.host, serve.port), 5) as s:
        s.settimeout(10)
        s.sendall(request_frame(17, 0, SaslHandshakeV0(mechanism="PLAIN")))
        assert read_response(s, 17, 0).error_code == KafkaError.NO_ERROR
        s.sendall(len(b"\0bob\0bob-secret").to_bytes(4, "big") + b"\0bob\0bob-secret")
        assert s.recv(4, socket.MSG_WAITALL) == b"\0\0\0\0"
        s.sendall(request_frame(3, 12, METADATA))
        assert read_response(s, 3, 12).brokers[0].port == serve.port
    with socket.create_connection((serve.host, serve.port), 5) as s:
        s.settimeout(10)
        s.sendall(request_frame(17, 0, SaslHandshakeV0(mechanism="SCRAM-SHA-512")))
        assert read_response(s, 17, 0).error_code == KafkaError.NO_ERROR
        client = ScramClient(["SCRAM-SHA-512"], "dave", "dave-secret")
        client.set_server_first(_bare(s, client.get_client_first().encode()).decode())
        client.set_server_final(_bare(s, client.get_client_final().encode()).decode())
        s.sendall(request_frame(3, 12, METADATA))
        assert read_response(s, 3, 12).brokers[0].port == serve.port
    with socket.create_connection((serve.host, serve.port), 5) as s:
        s.settimeout(10)
        s.sendall(request_frame(17, 0, SaslHandshakeV0(mechanism="PLAIN")))
        read_response(s, 17, 0)
        assert _bare(s, b"\0bob\0nope") == b""
    counted = _scraped(metrics_port)
    assert counted['kip98_server_authentication_failures_total{mechanism="PLAIN"}'] == 1


def test_a_client_final_nonce_that_ends_with_the_servers_is_taken(
    sasl_server: tuple[ServeProcess, int],
) -> None:
    """Kafka's SCRAM server takes a client-final nonce that ends with the server-first's;
    librdkafka 2.0 (Debian 12's kcat) sends its own nonce once more in front. The proof is
    checked over the message as sent: a wrong one is still refused."""
    from scramp.core import _c_key_stored_key_s_key, _make_auth_message, hi, hmac, xor

    serve, _ = sasl_server

    def login(password: str) -> int:
        with socket.create_connection((serve.host, serve.port), 5) as s:
            s.settimeout(10)
            s.sendall(request_frame(17, 1, SaslHandshakeRequest(mechanism="SCRAM-SHA-256")))
            read_response(s, 17, 1)
            nonce = "librdkafka-nonce"
            first = f"n,,n=carol,r={nonce}"
            s.sendall(request_frame(36, 2, SaslAuthenticateRequest(auth_bytes=first.encode())))
            server_first = bytes(read_response(s, 36, 2).auth_bytes).decode()
            fields = dict(f.split("=", 1) for f in server_first.split(","))
            salted = hi(hashlib.sha256, password.encode(), base64.b64decode(fields["s"]),
                        int(fields["i"]))  # fmt: skip
            client_key, stored_key, _ = _c_key_stored_key_s_key(hashlib.sha256, salted)
            without_proof = f"c=biws,r={nonce}{fields['r']}"
            auth = _make_auth_message(first[3:], server_first, without_proof)
            proof = xor(client_key, hmac(hashlib.sha256, stored_key, auth))
            final = f"{without_proof},p={base64.b64encode(proof).decode()}"
            s.sendall(request_frame(36, 2, SaslAuthenticateRequest(auth_bytes=final.encode())))
            code: int = read_response(s, 36, 2).error_code.value
            return code

    assert login("carol-secret") == KafkaError.NO_ERROR
    assert login("wrong") == KafkaError.SASL_AUTHENTICATION_FAILED


def test_failed_logins_are_logged_with_who_and_from_where_and_counted(
    db_url: str, tmp_path: Any
) -> None:
    """A wrong password through librdkafka: the log names the mechanism, the principal
    tried (never the password) and the client's address. Many failures from one address
    log a few lines, not one each; the metric counts every one."""
    admin = Broker.connect(db_url)
    add_user(admin, "alice", "alice-secret")
    metrics_port = free_port()
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log_file:
        serve = ServeProcess(db_url, scheme="SASL_PLAINTEXT", stderr=log_file,
                             args=("--metrics-listen", f"127.0.0.1:{metrics_port}"))  # fmt: skip
        with serve:
            failures: list[ck.KafkaError] = []
            producer = ck.Producer(
                {
                    **_client(serve.address, "alice", "password-123"),
                    "error_cb": failures.append,
                }
            )
            assert authentication_refused(producer, failures)
            first = _wait_for_line(log_path, "SASL authentication failed")
            assert "User:alice by PLAIN from /127.0.0.1:" in first
            assert "password-123" not in log_path.read_text()
            # An unknown user by SCRAM (the client above goes on retrying by PLAIN).
            many = 60
            for _ in range(many):
                with socket.create_connection((serve.host, serve.port), 5) as s:
                    s.settimeout(10)
                    s.sendall(request_frame(17, 1, SaslHandshakeRequest(mechanism="SCRAM-SHA-512")))
                    read_response(s, 17, 1)
                    wrong = SaslAuthenticateRequest(auth_bytes=b"n,,n=mallory,r=abc")
                    s.sendall(request_frame(36, 2, wrong))
                    assert (
                        read_response(s, 36, 2).error_code == KafkaError.SASL_AUTHENTICATION_FAILED
                    )
                    assert s.recv(100) == b""
            counted = _scraped(metrics_port)
            assert (
                counted['kip98_server_authentication_failures_total{mechanism="SCRAM-SHA-512"}']
                == many
            )
            assert counted['kip98_server_authentication_failures_total{mechanism="PLAIN"}'] >= 1
        producer.flush(0)
    text_logged = log_path.read_text()
    lines = [
        line for line in text_logged.splitlines()
        if "SASL authentication failed" in line or "more SASL authentication failures" in line
    ]  # fmt: skip
    # One line per address per window and one summary: far fewer than the failures, and
    # every failure is in them, whole or in a count.
    assert len(lines) <= many / 4, lines
    summarised = [int(line.split(": ")[-1].split()[0]) for line in lines if "more SASL" in line]
    assert len(lines) - len(summarised) + sum(summarised) >= many + 1


def _wait_for_line(path: Any, text_in: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in path.read_text().splitlines():
            if text_in in line:
                return str(line)
        time.sleep(0.05)
    raise AssertionError(f"no line with {text_in!r} logged within {timeout} s")
