"""SASL users of ``kip98 serve``: ``kip98 users add|delete|list``, and checking a password.

A password is kept as SCRAM-SHA-256 keeps a credential (RFC 5802, as Kafka's SCRAM
credentials are): a random salt, the iteration count, StoredKey = H(HMAC(SaltedPassword,
"Client Key")) and ServerKey = HMAC(SaltedPassword, "Server Key"), where SaltedPassword is
PBKDF2-HMAC-SHA256 of the password. Neither key is the password nor logs anyone in; a
PLAIN login is checked by deriving StoredKey from the password given. Managing users
needs Alter on the cluster, as Kafka's AlterUserScramCredentials does.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass

from app.errors import KafkaError, fail
from app.security import needs, sql
from app.security.authorizer import authorize_all
from app.storage.context import BrokerContext

MECHANISMS = ("PLAIN",)
ITERATIONS = 4096  # SCRAM's minimum, and Kafka's default for SCRAM credentials
_SALT_BYTES = 16
# A PLAIN check for a user that does not exist still derives a key, so the time it takes
# does not tell whether the user exists.
_DECOY = (b"\0" * _SALT_BYTES, ITERATIONS, b"")


@dataclass(frozen=True)
class SaslUser:
    name: str
    mechanism: str
    created_ms: int


def scram_keys(password: str, salt: bytes, iterations: int) -> tuple[bytes, bytes]:
    """(StoredKey, ServerKey) of ``password`` for SCRAM-SHA-256 (RFC 5802 §3)."""
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    server_key = hmac.digest(salted, b"Server Key", "sha256")
    return hashlib.sha256(client_key).digest(), server_key


def validate_user(name: str, password: str, mechanism: str) -> None:
    """A name without NUL (PLAIN separates with it) and not empty; a password not empty."""
    if not isinstance(name, str) or not name or "\0" in name:
        raise fail(KafkaError.INVALID_REQUEST, "a user name must be non-empty, without NUL")
    if not isinstance(password, str) or not password:
        raise fail(KafkaError.INVALID_REQUEST, "a password must be non-empty")
    if mechanism not in MECHANISMS:
        raise fail(
            KafkaError.UNSUPPORTED_SASL_MECHANISM,
            f"mechanism {mechanism!r} is not served (only {', '.join(MECHANISMS)})",
        )


def add_user(broker: BrokerContext, name: str, password: str, mechanism: str = "PLAIN") -> None:
    """Create ``name``, or give it a new password."""
    validate_user(name, password, mechanism)
    salt = os.urandom(_SALT_BYTES)
    stored_key, server_key = scram_keys(password, salt, ITERATIONS)
    with broker.engine.begin() as conn:
        authorize_all(conn, broker, needs.alter_acls())
        conn.execute(
            sql.UPSERT_SASL_USER,
            {
                "name": name,
                "mechanism": mechanism,
                "salt": salt,
                "iterations": ITERATIONS,
                "stored_key": stored_key,
                "server_key": server_key,
                "now": broker.clock.now_ms(),
            },
        )


def delete_user(broker: BrokerContext, name: str) -> None:
    with broker.engine.begin() as conn:
        authorize_all(conn, broker, needs.alter_acls())
        if conn.execute(sql.DELETE_SASL_USER, {"name": name}).first() is None:
            raise fail(KafkaError.RESOURCE_NOT_FOUND, f"no user {name!r}")


def list_users(broker: BrokerContext) -> list[SaslUser]:
    with broker.engine.connect() as conn:
        authorize_all(conn, broker, needs.describe_acls())
        return [SaslUser(r.name, r.mechanism, r.created_ms) for r in conn.execute(sql.SASL_USERS)]


def check_plain(broker: BrokerContext, name: str, password: str) -> bool:
    """Whether ``password`` is ``name``'s (the server's own check: no ACL asked)."""
    with broker.engine.connect() as conn:
        row = conn.execute(sql.SASL_USER, {"name": name}).first()
    salt, iterations, stored = _DECOY if row is None else (row.salt, row.iterations, row.stored_key)
    derived, _ = scram_keys(password, bytes(salt), iterations)
    return hmac.compare_digest(derived, bytes(stored)) and row is not None
