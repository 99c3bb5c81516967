"""SASL users of ``kip98 serve``: ``kip98 users add|delete|list``, checking a PLAIN
password, and the SCRAM credential a listener's exchange needs.

A password is kept as SCRAM keeps a credential (RFC 5802, as Kafka's SCRAM credentials
are): a random salt, the iteration count, StoredKey and ServerKey, derived by ``scramp``
(SASLprep, PBKDF2, HMAC). Neither key is the password nor logs anyone in. A user logs in
by the mechanism it was added with, as Kafka keeps a credential per mechanism: SCRAM-SHA-256
or SCRAM-SHA-512 users by that exchange (the listener runs it with these keys), PLAIN users
by their password, checked by deriving StoredKey (SHA-256) from it. Managing users needs
Alter on the cluster, as Kafka's AlterUserScramCredentials does.
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass

from scramp import ScramException, ScramMechanism

from app.errors import KafkaError, fail
from app.protocol import ScramCredential
from app.security import needs, sql
from app.security.authorizer import authorize_all
from app.storage.context import BrokerContext

PLAIN = "PLAIN"
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
MECHANISMS = (PLAIN, *SCRAM_MECHANISMS)
# The SCRAM keys a mechanism's users are kept with (PLAIN's: SCRAM-SHA-256's).
_KEYS_OF = {PLAIN: "SCRAM-SHA-256", **{m: m for m in SCRAM_MECHANISMS}}
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


def scram_credential(
    password: str, mechanism: str, salt: bytes | None = None, iterations: int = ITERATIONS
) -> ScramCredential:
    """``password``'s credential for ``mechanism`` (a fresh salt unless one is given)."""
    keys = ScramMechanism(_KEYS_OF[mechanism])
    salt, stored_key, server_key, iterations = keys.make_auth_info(
        password, iteration_count=iterations, salt=salt or os.urandom(_SALT_BYTES)
    )
    return ScramCredential(salt, iterations, stored_key, server_key)


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
    try:
        credential = scram_credential(password, mechanism)
    except ScramException as exc:  # SASLprep refused the password
        raise fail(KafkaError.INVALID_REQUEST, f"the password cannot be used: {exc}") from exc
    with broker.engine.begin() as conn:
        authorize_all(conn, broker, needs.alter_acls())
        conn.execute(
            sql.UPSERT_SASL_USER,
            {
                "name": name,
                "mechanism": mechanism,
                "salt": credential.salt,
                "iterations": credential.iterations,
                "stored_key": credential.stored_key,
                "server_key": credential.server_key,
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
    """Whether ``password`` is PLAIN user ``name``'s (the server's own check: no ACL
    asked)."""
    with broker.engine.connect() as conn:
        row = conn.execute(sql.SASL_USER, {"name": name}).first()
    known = row is not None and row.mechanism == PLAIN
    salt, iterations, stored = _DECOY
    if row is not None and known:
        salt, iterations, stored = row.salt, row.iterations, row.stored_key
    try:
        derived = scram_credential(password, PLAIN, bytes(salt), iterations).stored_key
    except ScramException:  # not a password SASLprep accepts: no user has it
        return False
    return hmac.compare_digest(derived, bytes(stored)) and known


def scram_user(broker: BrokerContext, name: str, mechanism: str) -> ScramCredential | None:
    """``name``'s credential if it is a ``mechanism`` user (the server's own lookup)."""
    with broker.engine.connect() as conn:
        row = conn.execute(sql.SASL_USER, {"name": name}).first()
    if row is None or row.mechanism != mechanism or mechanism not in SCRAM_MECHANISMS:
        return None
    return ScramCredential(
        bytes(row.salt), row.iterations, bytes(row.stored_key), bytes(row.server_key)
    )
