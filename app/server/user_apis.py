"""The Kafka APIs of SCRAM credentials (KIP-554): DescribeUserScramCredentials and
AlterUserScramCredentials, onto the broker's requests. The wire names a mechanism by
Kafka's ScramMechanism code; a code kip98 has no name for is answered
UNSUPPORTED_SASL_MECHANISM for its user."""

from __future__ import annotations

from typing import Any

from app.broker import Broker
from app.protocol import (
    SCRAM_MECHANISM_CODES,
    AlterUserScramCredentialsRequest,
    DescribeUserScramCredentialsRequest,
    ScramUpsertion,
)
from app.server.node import Node

_MECHANISMS = {code: name for name, code in SCRAM_MECHANISM_CODES.items()}


def _mechanism(code: int) -> str:
    return _MECHANISMS.get(code, f"unknown ({code})")


def describe_user_scram_credentials(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    users = None if request.users is None else [u.name for u in request.users]
    a = broker.handle(DescribeUserScramCredentialsRequest(users or None))
    results = [
        {"user": r.user, "error_code": r.error_code, "error_message": r.error_message,
         "credential_infos": [
             {"mechanism": SCRAM_MECHANISM_CODES[m], "iterations": i} for m, i in r.credentials
         ]}
        for r in a.results
    ]  # fmt: skip
    return {"error_code": a.error_code, "error_message": a.error_message, "results": results}


def alter_user_scram_credentials(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    deletions = [(d.name, _mechanism(d.mechanism)) for d in request.deletions]
    upsertions = [
        ScramUpsertion(u.name, _mechanism(u.mechanism), u.iterations, bytes(u.salt),
                       bytes(u.salted_password))
        for u in request.upsertions
    ]  # fmt: skip
    users = dict.fromkeys([n for n, _ in deletions] + [u.user for u in upsertions])
    answers = [
        broker.handle(
            AlterUserScramCredentialsRequest(
                [d for d in deletions if d[0] == user], [u for u in upsertions if u.user == user]
            )
        ).results[0]
        for user in users
    ]  # each user on its own: a failure of one is its answer
    return {
        "results": [
            {"user": r.user, "error_code": r.error_code, "error_message": r.error_message}
            for r in answers
        ]
    }
