"""SaslHandshake naming a mechanism the broker does not enable, and a dynamic broker config
set on the node.

The suite's Kafka has no SASL listener, so the handshake's scenario runs against a
``kip98 serve`` on a SASL_PLAINTEXT listener alone, asserting what Kafka's
SaslServerAuthenticator does (``handleHandshakeRequest``): it answers
UNSUPPORTED_SASL_MECHANISM with its enabled mechanisms, then fails the authentication,
which closes the connection.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

from app.server.process import ServeProcess
from tests.conformance.harness import Observation, Target, documented_difference, same, wait_until
from tests.conformance.raw_calls import (
    API_VERSIONS,
    DESCRIBE_CONFIGS,
    INCREMENTAL_ALTER_CONFIGS,
    METADATA,
    call,
    call_frame,
    error,
)
from tests.helpers.wire_client import read_response, request_frame

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
RESOURCE_BROKER = 4
OP_SET, OP_DELETE = 0, 1
# A dynamic broker config librdkafka's own suite (0081) sets on a node and expects taken.
RELOGIN = "sasl.kerberos.min.time.before.relogin"


def scenario_an_unsupported_sasl_mechanism(target: Target) -> Observation:
    """SaslHandshake v1 for GSSAPI on a SASL listener enabling PLAIN and SCRAM: the answer,
    and whether the broker then closed the connection."""
    host, port = target.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), 10) as s:
        s.settimeout(10)
        s.sendall(request_frame(SASL_HANDSHAKE, 1, SaslHandshakeRequest(mechanism="GSSAPI")))
        answer = read_response(s, SASL_HANDSHAKE, 1)
        try:
            closed = s.recv(100) == b""
        except TimeoutError:
            closed = False  # still open, waiting for the client
        except ConnectionResetError:
            closed = True
    return {"error": error(answer.error_code), "mechanisms": sorted(answer.mechanisms),
            "closed": closed}  # fmt: skip


@pytest.fixture
def sasl_serve(db_url: str) -> Iterator[ServeProcess]:
    serve = ServeProcess(db_url, scheme="SASL_PLAINTEXT")
    serve.start()
    yield serve
    try:
        assert serve.stop() == 0
    finally:
        serve.kill()


def test_an_unsupported_sasl_mechanism_closes_the_connection(sasl_serve: ServeProcess) -> None:
    """Kafka's answer and close, from its SaslServerAuthenticator (the suite's Kafka has no
    SASL listener to observe it on)."""
    observed = scenario_an_unsupported_sasl_mechanism(Target("kip98", sasl_serve.address))
    assert observed == {
        "error": "UNSUPPORTED_SASL_MECHANISM",
        "mechanisms": ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"],
        "closed": True,
    }


def node_id(target: Target) -> str:
    """The node's id, as a BROKER resource names it."""
    return str(call(target, METADATA, 12, {"topics": []}).brokers[0].node_id)


def scenario_a_dynamic_broker_config(target: Target) -> Observation:
    """IncrementalAlterConfigs SET of a dynamic broker config on the node, DescribeConfigs
    of it, then its DELETE (leaving the broker as it was)."""
    node = node_id(target)

    def altered(operation: int) -> list[Any]:
        result = call(target, INCREMENTAL_ALTER_CONFIGS, 1, {
            "resources": [{"resource_type": RESOURCE_BROKER, "resource_name": node,
                           "configs": [{"name": RELOGIN, "config_operation": operation,
                                        "value": "58000"}]}],
            "validate_only": False,
        }).responses[0]  # fmt: skip
        return [error(result.error_code), result.error_message]

    def describe() -> Any:
        return call(target, DESCRIBE_CONFIGS, 4, {
            "resources": [{"resource_type": RESOURCE_BROKER, "resource_name": node,
                           "configuration_keys": [RELOGIN]}],
            "include_synonyms": False, "include_documentation": False,
        }).results[0]  # fmt: skip

    was_set = altered(OP_SET)
    described = describe()
    if was_set[0] == "NONE":
        # Kafka applies a taken alter when its metadata log reaches the broker, a moment
        # after answering it: described once it shows.
        described = wait_until(
            lambda: (found := describe()).configs and found.configs[0].value == "58000" and found,
            f"{RELOGIN} set on the node",
        )
    return {
        "set": was_set,
        "described": [error(described.error_code),
                      [[c.name, c.value, c.config_source, c.read_only]
                       for c in described.configs]],
        "deleted": altered(OP_DELETE),
    }  # fmt: skip


def test_a_dynamic_broker_config(targets: Any) -> None:
    documented_difference(
        "no-dynamic-broker-configs", scenario_a_dynamic_broker_config, *targets,
        kip98_expected={
            "set": ["INVALID_REQUEST", f"Cannot update these configs dynamically: Set({RELOGIN})"],
            "described": ["NONE", []],
            "deleted": ["NONE", None],
        },
        kafka_expected={
            "set": ["NONE", None],
            "described": ["NONE", [[RELOGIN, "58000", 2, False]]],  # DYNAMIC_BROKER_CONFIG
            "deleted": ["NONE", None],
        },
    )  # fmt: skip


def scenario_sasl_on_a_plaintext_listener(target: Target) -> Observation:
    """SaslHandshake then SaslAuthenticate on a listener without SASL, then ApiVersions on
    the same connection: the error codes, and whether the connection still answers."""
    host, port = target.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), 10) as s:
        s.settimeout(10)
        s.sendall(request_frame(SASL_HANDSHAKE, 1, SaslHandshakeRequest(mechanism="PLAIN")))
        handshake = read_response(s, SASL_HANDSHAKE, 1)
        s.sendall(call_frame(SASL_AUTHENTICATE, 2, {"auth_bytes": b"\0bob\0bob-secret"}))
        authenticate = read_response(s, SASL_AUTHENTICATE, 2)
        s.sendall(call_frame(API_VERSIONS, 3, {"client_software_name": "t",
                                               "client_software_version": "1"}))  # fmt: skip
        versions = read_response(s, API_VERSIONS, 3)
    return {
        "handshake": [error(handshake.error_code), sorted(handshake.mechanisms)],
        "authenticate": error(authenticate.error_code),
        "then": error(versions.error_code),
    }


def test_sasl_on_a_plaintext_listener(targets: Any) -> None:
    same(scenario_sasl_on_a_plaintext_listener, *targets)
