"""TLS on ``SSL://`` and ``SASL_SSL://`` listeners of ``kip98 serve``, next to a PLAINTEXT
one in the same process, with librdkafka (confluent-kafka), kafka-python and a raw socket.

The certificate is a test CA's (trustme), issued for 127.0.0.1: clients that trust the CA
connect and verify the server's name; one that does not refuses the server; a client
speaking plain Kafka to a TLS port gets no answer. Each listener's Metadata names its own
port, so a client stays on the protocol it bootstrapped with.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import confluent_kafka as ck
import pytest
import trustme
from confluent_kafka.admin import AdminClient
from kio.schema.api_versions.v3.request import ApiVersionsRequest

from app.broker import Broker
from app.log.topics import create_topic
from app.security.users import add_user
from app.server.process import ServeProcess, free_port
from tests.helpers.txn_driver import read_values
from tests.helpers.wire_client import (
    authentication_refused,
    delivered,
    read_committed_values,
    request_frame,
)


@dataclass(frozen=True)
class Certificates:
    ca: str
    cert: str
    key: str
    other_ca: str  # a CA the server's certificate is not from


@dataclass(frozen=True)
class Ports:
    ssl: int
    sasl_ssl: int
    plaintext: int


@pytest.fixture
def certificates(tmp_path: Path) -> Certificates:
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    paths = {name: tmp_path / f"{name}.pem" for name in ("ca", "cert", "key", "other")}
    ca.cert_pem.write_to_path(paths["ca"])
    issued.private_key_pem.write_to_path(paths["key"])
    with paths["cert"].open("wb") as chain:
        for blob in issued.cert_chain_pems:
            chain.write(blob.bytes())
    trustme.CA().cert_pem.write_to_path(paths["other"])
    return Certificates(*(str(paths[n]) for n in ("ca", "cert", "key", "other")))


@pytest.fixture
def tls_server(db_url: str, certificates: Certificates) -> Iterator[Ports]:
    admin = Broker.connect(db_url, principal="User:admin")
    add_user(admin, "carol", "carol-secret", "SCRAM-SHA-256")
    ports = Ports(free_port(), free_port(), free_port())
    serve = ServeProcess(
        db_url,
        port=ports.ssl,
        scheme="SSL",
        args=(
            "--listen", f"SASL_SSL://127.0.0.1:{ports.sasl_ssl}",
            "--listen", f"PLAINTEXT://127.0.0.1:{ports.plaintext}",
            "--tls-cert", certificates.cert, "--tls-key", certificates.key,
        ),
    )  # fmt: skip
    serve.start()
    yield ports
    try:
        assert serve.stop() == 0
    finally:
        serve.kill()


def _ssl(port: int, ca: str) -> dict[str, str]:
    return {
        "bootstrap.servers": f"127.0.0.1:{port}",
        "security.protocol": "SSL",
        "ssl.ca.location": ca,
    }


def test_librdkafka_over_tls_transactions_and_reads(
    db_url: str, certificates: Certificates, tls_server: Ports
) -> None:
    admin = Broker.connect(db_url)
    create_topic(admin, "t", 1)
    client = _ssl(tls_server.ssl, certificates.ca)
    # Metadata on the SSL listener names the SSL port, never the PLAINTEXT one.
    brokers = AdminClient(client).list_topics(timeout=30).brokers
    assert [(b.host, b.port) for b in brokers.values()] == [("127.0.0.1", tls_server.ssl)]

    producer = ck.Producer({**client, "transactional.id": "tls-tx", "linger.ms": 5})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(3):
        producer.produce("t", f"v{i}".encode(), partition=0)
    producer.commit_transaction(30)
    assert read_values(admin, "t", 0) == ["v0", "v1", "v2"]

    read = read_committed_values({**client, "group.id": "g"}, "t", 3)
    assert read == [b"v0", b"v1", b"v2"]


def test_sasl_over_tls(db_url: str, certificates: Certificates, tls_server: Ports) -> None:
    create_topic(Broker.connect(db_url), "s", 1)
    config = {
        **_ssl(tls_server.sasl_ssl, certificates.ca),
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-256",
        "sasl.username": "carol",
        "sasl.password": "carol-secret",
        "linger.ms": 5,
    }
    brokers = AdminClient(config).list_topics(timeout=30).brokers
    assert [b.port for b in brokers.values()] == [tls_server.sasl_ssl]
    assert [e for e, _ in delivered(ck.Producer(config), 2, topic="s", partition=0)] == [None] * 2

    failures: list[ck.KafkaError] = []
    wrong = ck.Producer({**config, "sasl.password": "guess", "error_cb": failures.append})
    wrong.produce("s", b"x", partition=0)
    assert authentication_refused(wrong, failures), failures
    assert read_values(Broker.connect(db_url), "s", 0) == ["v0", "v1"]


def test_kafka_python_over_tls(db_url: str, certificates: Certificates, tls_server: Ports) -> None:
    from kafka import KafkaProducer

    create_topic(Broker.connect(db_url), "k", 1)
    producer = KafkaProducer(
        bootstrap_servers=f"127.0.0.1:{tls_server.ssl}", security_protocol="SSL",
        ssl_cafile=certificates.ca, api_version=(2, 8),
    )  # fmt: skip
    try:
        producer.send("k", b"over-tls", partition=0).get(timeout=30)
    finally:
        producer.close()
    assert read_values(Broker.connect(db_url), "k", 0) == ["over-tls"]


def test_a_client_that_does_not_trust_the_certificate_refuses_the_server(
    certificates: Certificates, tls_server: Ports
) -> None:
    failures: list[ck.KafkaError] = []
    distrustful = ck.Producer(
        {**_ssl(tls_server.ssl, certificates.other_ca), "error_cb": failures.append,
         "log_level": 0}
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not failures and time.monotonic() < deadline:
        distrustful.poll(0.2)
    # librdkafka names it _SSL or, in some versions, _TRANSPORT; the reason is the same.
    assert any(
        f.code() in (ck.KafkaError._SSL, ck.KafkaError._TRANSPORT)
        and "certificate verify failed" in f.str()
        for f in failures
    ), failures


def test_plain_kafka_on_a_tls_port_is_not_answered(tls_server: Ports) -> None:
    versions = request_frame(
        18, 3, ApiVersionsRequest(client_software_name="t", client_software_version="1")
    )
    with socket.create_connection(("127.0.0.1", tls_server.ssl), 5) as s:
        s.settimeout(10)
        s.sendall(versions)
        assert s.recv(100) in (
            b"",
            b"\x15\x03\x03\x00\x02\x02\x32",
            b"\x15\x03\x01\x00\x02\x02\x32",
        )
    # The PLAINTEXT listener of the same process answers it.
    with socket.create_connection(("127.0.0.1", tls_server.plaintext), 5) as s:
        s.settimeout(10)
        s.sendall(versions)
        assert len(s.recv(4)) == 4
