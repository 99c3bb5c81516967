"""DescribeUserScramCredentials (50) and AlterUserScramCredentials (51): the SCRAM
credentials of ``kip98 users``' users, a credential per mechanism, as Kafka's admin APIs
show and change them: with confluent-kafka (its own integration test's steps) and
kafka-python against a real ``kip98 serve``, then logging in with what they set."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient as CkAdmin
from confluent_kafka.admin import ScramCredentialInfo as CkInfo
from confluent_kafka.admin import ScramMechanism as CkMechanism
from confluent_kafka.admin import UserScramCredentialDeletion as CkDeletion
from confluent_kafka.admin import UserScramCredentialUpsertion as CkUpsertion
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient
from kafka.admin._users import ScramMechanism as KpMechanism
from kafka.admin._users import UserScramCredentialDeletion as KpDeletion
from kafka.admin._users import UserScramCredentialUpsertion as KpUpsertion
from kafka.errors import KafkaError as KafkaPythonError

from app.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialsDescription,
    UserScramCredentialUpsertion,
)
from app.broker import Broker
from app.errors import KafkaError, KafkaException
from app.log.topics import create_topic
from app.protocol import ScramUpsertion
from app.security.users import add_user, alter_scram_credentials, describe_scram_credentials
from app.server.process import ServeProcess, free_port
from app.settings import BrokerSettings
from tests.helpers.cli_runner import run_kip98


def _upsertion(
    user: str, mechanism: str = "SCRAM-SHA-256", iterations: int = 4096
) -> ScramUpsertion:
    return ScramUpsertion(user, mechanism, iterations, b"salt", b"\x01" * 32)


def _codes(broker: Broker, deletions: list[tuple[str, str]], upsertions: list[ScramUpsertion]):
    return {
        user: (0 if exc is None else exc.error.code())
        for user, exc in alter_scram_credentials(broker, deletions, upsertions)
    }


def test_the_rules_of_alterations(db_url: str) -> None:
    """Each user's alterations together or not at all; Kafka's checks: iterations within
    4096..16384, a SCRAM mechanism, a credential to delete that exists, a mechanism not
    altered twice; Alter on the cluster needed, Describe to describe."""
    broker = Broker.connect(db_url)
    add_user(broker, "plain", "pw")  # a PLAIN user has no SCRAM credential
    assert _codes(broker, [], [_upsertion("a"), _upsertion("a", "SCRAM-SHA-512", 8192)]) == {"a": 0}
    refused = [
        _upsertion("c", iterations=4095),
        _upsertion("d", iterations=16385),
        _upsertion("e", "PLAIN"),
        _upsertion(""),
        _upsertion("f"),
        _upsertion("f"),
    ]
    assert _codes(broker, [("b", "SCRAM-SHA-256")], refused) == {
        "b": KafkaError.RESOURCE_NOT_FOUND,
        "c": KafkaError.UNACCEPTABLE_CREDENTIAL,
        "d": KafkaError.UNACCEPTABLE_CREDENTIAL,
        "e": KafkaError.UNSUPPORTED_SASL_MECHANISM,
        "": KafkaError.UNACCEPTABLE_CREDENTIAL,
        "f": KafkaError.DUPLICATE_RESOURCE,
    }
    # Refused as a whole (a mechanism altered twice): nothing of it is done.
    assert _codes(broker, [("a", "SCRAM-SHA-512"), ("a", "SCRAM-SHA-256")],
                  [_upsertion("a", iterations=5000)]) == {"a": KafkaError.DUPLICATE_RESOURCE}  # fmt: skip
    found = {u.user: u for u in describe_scram_credentials(broker, None)}
    assert set(found) == {"a"}
    assert found["a"].credentials == [("SCRAM-SHA-256", 4096), ("SCRAM-SHA-512", 8192)]
    named = describe_scram_credentials(broker, ["a", "plain", "nobody", "a"])
    assert [(u.user, u.error_code) for u in named] == [
        ("a", KafkaError.DUPLICATE_RESOURCE), ("plain", KafkaError.RESOURCE_NOT_FOUND),
        ("nobody", KafkaError.RESOURCE_NOT_FOUND),
    ]  # fmt: skip
    assert _codes(broker, [("a", "SCRAM-SHA-512")], []) == {"a": 0}
    assert [u.credentials for u in describe_scram_credentials(broker, ["a"])] == [
        [("SCRAM-SHA-256", 4096)]
    ]

    settings = replace(BrokerSettings.from_env(), authorization=1)
    alice = Broker.connect(db_url, settings=settings, principal="User:alice")
    assert _codes(alice, [], [_upsertion("x")]) == {"x": KafkaError.CLUSTER_AUTHORIZATION_FAILED}
    with pytest.raises(KafkaException) as refused:
        describe_scram_credentials(alice, None)
    assert refused.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED


def test_the_native_admin_client(db_url: str) -> None:
    with AdminClient({"database.url": db_url}) as admin:
        upsert = UserScramCredentialUpsertion(
            "u", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"pw", b"salt"
        )
        assert admin.alter_user_scram_credentials([upsert])["u"].result() is None
        everyone = admin.describe_user_scram_credentials()
        assert everyone.result() == {  # type: ignore[union-attr]
            "u": UserScramCredentialsDescription(
                "u", [ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)]
            )
        }
        named = admin.describe_user_scram_credentials(["nobody"])
        with pytest.raises(KafkaException) as missing:
            named["nobody"].result()  # type: ignore[index]
        assert missing.value.args[0].code() == KafkaError.RESOURCE_NOT_FOUND
        gone = UserScramCredentialDeletion("u", ScramMechanism.SCRAM_SHA_512)
        assert admin.alter_user_scram_credentials([gone])["u"].result() is None
    listed = run_kip98("users", "list", "--output", "json")
    assert json.loads(listed.stdout) == []


@pytest.fixture
def two_listeners(db_url: str) -> Iterator[tuple[str, str]]:
    """A server with a PLAINTEXT listener (for the admin calls) and a SASL_PLAINTEXT one
    (for logging in)."""
    create_topic(Broker.connect(db_url), "t", 1)
    sasl = free_port()
    serve = ServeProcess(db_url, args=("--listen", f"SASL_PLAINTEXT://127.0.0.1:{sasl}"))
    serve.start()
    try:
        yield serve.address, f"127.0.0.1:{sasl}"
    finally:
        try:
            assert serve.stop() == 0
        finally:
            serve.kill()


def _logs_in(server: str, user: str, password: str, mechanism: str) -> bool:
    """Whether librdkafka logs in as ``user``: its record delivered."""
    producer = ck.Producer({"bootstrap.servers": server, "security.protocol": "SASL_PLAINTEXT",
                            "sasl.mechanisms": mechanism, "sasl.username": user,
                            "sasl.password": password})  # fmt: skip
    errors: list[ck.KafkaError] = []
    producer.produce("t", b"x", on_delivery=lambda err, msg: errors.append(err))
    producer.flush(30)
    return errors == [None]


def _refused(server: str, user: str, password: str, mechanism: str) -> bool:
    """Whether a login as ``user`` is refused: kafka-python's record is never delivered
    (its metadata never comes). (librdkafka tells the same by a message timeout, but
    confluent-kafka 2.16 then leaves a TypeError pending for the next client made.)"""
    producer = KafkaProducer(bootstrap_servers=server, security_protocol="SASL_PLAINTEXT",
                             sasl_mechanism=mechanism, sasl_plain_username=user,
                             sasl_plain_password=password, api_version=(3, 0, 0),
                             max_block_ms=5_000)  # fmt: skip
    try:
        producer.send("t", b"x").get(timeout=10)
    except KafkaPythonError:
        return True
    finally:
        producer.close()
    return False


def test_confluent_kafka_as_its_own_integration_test(two_listeners: tuple[str, str]) -> None:
    """confluent-kafka's test_user_scram_credentials, step by step; the user then logs in
    with librdkafka by each mechanism it has, and not by one it had deleted."""
    plain, sasl = two_listeners
    admin = CkAdmin({"bootstrap.servers": plain})
    user, mechanism, iterations, password = "newuser", CkMechanism.SCRAM_SHA_256, 10000, b"pw"
    with pytest.raises(ck.KafkaException) as missing:
        admin.describe_user_scram_credentials([user])[user].result(30)
    assert missing.value.args[0].code() == ck.KafkaError.RESOURCE_NOT_FOUND
    info = CkInfo(mechanism, iterations)
    assert (
        admin.alter_user_scram_credentials([CkUpsertion(user, info, password, b"salt")])[
            user
        ].result(30)
        is None
    )
    both = [CkUpsertion(user, info, password, b"salt"),
            # With a salt of its own: confluent-kafka 2.16's binding leaves a TypeError
            # pending when none is given, which the next call of the process then raises.
            CkUpsertion(user, CkInfo(CkMechanism.SCRAM_SHA_512, 10000), password,
                        b"another salt")]  # fmt: skip
    assert admin.alter_user_scram_credentials(both)[user].result(30) is None
    assert _logs_in(sasl, user, "pw", "SCRAM-SHA-512")
    assert (
        admin.alter_user_scram_credentials([CkDeletion(user, CkMechanism.SCRAM_SHA_512)])[
            user
        ].result(30)
        is None
    )
    everyone = admin.describe_user_scram_credentials().result(30)
    assert [(i.mechanism, i.iterations) for i in everyone[user].scram_credential_infos] == [
        (mechanism, iterations)
    ]
    assert _logs_in(sasl, user, "pw", "SCRAM-SHA-256")
    assert _refused(sasl, user, "pw", "SCRAM-SHA-512")
    assert _refused(sasl, user, "wrong", "SCRAM-SHA-256")
    assert (
        admin.alter_user_scram_credentials([CkDeletion(user, mechanism)])[user].result(30) is None
    )
    with pytest.raises(ck.KafkaException):
        admin.describe_user_scram_credentials([user])[user].result(30)


def test_kafka_python_alters_and_describes(two_listeners: tuple[str, str]) -> None:
    plain, sasl = two_listeners
    admin = KafkaAdminClient(bootstrap_servers=plain)
    try:
        done = admin.alter_user_scram_credentials([
            KpUpsertion("kp", KpMechanism.SCRAM_SHA_512, "secret", iterations=4096),
            KpUpsertion("bad", KpMechanism.SCRAM_SHA_256, "x", iterations=100),
        ])  # fmt: skip
        assert done["kp"] is None and done["bad"] is not None
        described = admin.describe_user_scram_credentials(["kp", "bad"])
        assert described["kp"]["credential_infos"] == [
            {"mechanism": KpMechanism.SCRAM_SHA_512, "iterations": 4096}
        ]
        assert described["bad"]["error"] is not None
        producer = KafkaProducer(bootstrap_servers=sasl, security_protocol="SASL_PLAINTEXT",
                                 sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="kp",
                                 sasl_plain_password="secret")  # fmt: skip
        try:
            producer.send("t", b"by kafka-python").get(timeout=30)
        finally:
            producer.close()
        assert admin.alter_user_scram_credentials(
            [KpDeletion("kp", KpMechanism.SCRAM_SHA_512)]
        ) == {"kp": None}
        assert admin.describe_user_scram_credentials() == {}
    finally:
        admin.close()


def test_users_keep_a_credential_per_mechanism(db_url: str) -> None:
    """``kip98 users add`` sets one mechanism's credential, the others stay; ``delete``
    removes them all; the user logs in by each."""
    for mechanism in ("PLAIN", "SCRAM-SHA-256"):
        assert run_kip98("users", "add", "u", "--password", f"{mechanism}-pw", "--mechanism",
                         mechanism).returncode == 0  # fmt: skip
    listed = json.loads(run_kip98("users", "list", "--output", "json").stdout)
    assert [(u["name"], u["mechanism"]) for u in listed] == [("u", "PLAIN"), ("u", "SCRAM-SHA-256")]
    broker = Broker.connect(db_url)
    from app.security.users import check_plain, scram_user

    assert check_plain(broker, "u", "PLAIN-pw") and not check_plain(broker, "u", "SCRAM-SHA-256-pw")
    assert scram_user(broker, "u", "SCRAM-SHA-256") is not None
    assert scram_user(broker, "u", "SCRAM-SHA-512") is None
    assert run_kip98("users", "delete", "u").returncode == 0
    assert json.loads(run_kip98("users", "list", "--output", "json").stdout) == []
