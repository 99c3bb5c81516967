"""SASL users of ``kip98 serve``: ``kip98 users add|delete|list``, checking a PLAIN
password, and the SCRAM credential a listener's exchange needs.

A password is kept as SCRAM keeps a credential (RFC 5802, as Kafka's SCRAM credentials
are): a random salt, the iteration count, StoredKey and ServerKey, derived by ``scramp``
(SASLprep, PBKDF2, HMAC). Neither key is the password nor logs anyone in. A user has a
credential per mechanism, as Kafka keeps one per SCRAM mechanism, and logs in by a
mechanism it has one for: SCRAM-SHA-256 or SCRAM-SHA-512 by that exchange (the listener
runs it with these keys), PLAIN by its password, checked by deriving StoredKey (SHA-256)
from it. Kafka's DescribeUserScramCredentials and AlterUserScramCredentials read and write
the same rows: an upsertion brings the salted password (RFC 5802's SaltedPassword, which
the client derives), from which StoredKey and ServerKey are derived here. Managing users
needs Alter on the cluster, describing them Describe, as in Kafka.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections import Counter
from dataclasses import dataclass

from scramp import ScramException, ScramMechanism

from app.errors import KafkaError, KafkaException, fail
from app.protocol import ScramCredential, ScramUpsertion, UserScramCredentials
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
    """Create ``name``, or give it a new password, for ``mechanism`` (a user's credentials
    for other mechanisms stay)."""
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
        row = conn.execute(sql.SASL_USER, {"name": name, "mechanism": PLAIN}).first()
    known = row is not None
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
    if mechanism not in SCRAM_MECHANISMS:
        return None
    with broker.engine.connect() as conn:
        row = conn.execute(sql.SASL_USER, {"name": name, "mechanism": mechanism}).first()
    if row is None:
        return None
    return ScramCredential(
        bytes(row.salt), row.iterations, bytes(row.stored_key), bytes(row.server_key)
    )


# What Kafka's ScramCredentialUtils accepts of an upsertion (ScramMechanism's bounds).
MIN_ITERATIONS, MAX_ITERATIONS = 4096, 16384
_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


def scram_keys(mechanism: str, salted_password: bytes) -> tuple[bytes, bytes]:
    """StoredKey and ServerKey from SaltedPassword (RFC 5802 §3): what a SCRAM server
    keeps; the salted password itself is not kept."""
    name = _HASHES[mechanism]
    client_key = hmac.new(salted_password, b"Client Key", name).digest()
    server_key = hmac.new(salted_password, b"Server Key", name).digest()
    return hashlib.new(name, client_key).digest(), server_key


def describe_scram_credentials(
    broker: BrokerContext, names: list[str] | None
) -> list[UserScramCredentials]:
    """Each user's SCRAM credentials, as (mechanism, iterations); a user without one is
    RESOURCE_NOT_FOUND, a name asked twice DUPLICATE_RESOURCE. ``names`` None: every user
    that has one. Needs Describe on the cluster."""
    with broker.engine.connect() as conn:
        authorize_all(conn, broker, needs.describe_acls())
        rows = conn.execute(
            sql.SCRAM_CREDENTIALS, {"names": None if names is None else list(set(names))}
        ).all()
    found: dict[str, list[tuple[str, int]]] = {}
    for r in rows:
        found.setdefault(r.name, []).append((r.mechanism, r.iterations))
    if names is None:
        return [UserScramCredentials(n, KafkaError.NO_ERROR, None, c) for n, c in found.items()]
    counts = Counter(names)
    out = []
    for name in dict.fromkeys(names):
        if counts[name] > 1:
            out.append(UserScramCredentials(name, KafkaError.DUPLICATE_RESOURCE,
                                            f"user {name!r} asked for twice"))  # fmt: skip
        elif name not in found:
            out.append(UserScramCredentials(name, KafkaError.RESOURCE_NOT_FOUND,
                                            f"user {name!r} has no SCRAM credential"))  # fmt: skip
        else:
            out.append(UserScramCredentials(name, KafkaError.NO_ERROR, None, found[name]))
    return out


def upsertion_refusal(u: ScramUpsertion) -> KafkaException | None:
    """Pure checks of one upsertion, Kafka's: a user name, a SCRAM mechanism, iterations
    within its bounds, a salt and a salted password."""
    if not u.user or "\0" in u.user:
        return fail(
            KafkaError.UNACCEPTABLE_CREDENTIAL, "a user name must be non-empty, without NUL"
        )
    if u.mechanism not in SCRAM_MECHANISMS:
        return fail(KafkaError.UNSUPPORTED_SASL_MECHANISM, f"unknown mechanism {u.mechanism!r}")
    if not MIN_ITERATIONS <= u.iterations <= MAX_ITERATIONS:
        return fail(
            KafkaError.UNACCEPTABLE_CREDENTIAL,
            f"iterations {u.iterations} outside [{MIN_ITERATIONS}, {MAX_ITERATIONS}]",
        )
    if not u.salt or not u.salted_password:
        return fail(KafkaError.UNACCEPTABLE_CREDENTIAL, "a salt and a salted password are needed")
    return None


def alter_scram_credentials(
    broker: BrokerContext, deletions: list[tuple[str, str]], upsertions: list[ScramUpsertion]
) -> list[tuple[str, KafkaException | None]]:
    """Each user's alterations together or not at all, in a DB transaction of its own:
    refused whole if one is (an unknown mechanism, iterations out of bounds, a credential
    to delete it does not have, a mechanism altered twice: DUPLICATE_RESOURCE). Needs
    Alter on the cluster."""
    users = list(dict.fromkeys([n for n, _ in deletions] + [u.user for u in upsertions]))
    out: list[tuple[str, KafkaException | None]] = []
    for name in users:
        mine_d = [m for n, m in deletions if n == name]
        mine_u = [u for u in upsertions if u.user == name]
        try:
            _alter_user(broker, name, mine_d, mine_u)
        except KafkaException as exc:
            out.append((name, exc))
        else:
            out.append((name, None))
    return out


def _alter_user(
    broker: BrokerContext, name: str, deletions: list[str], upsertions: list[ScramUpsertion]
) -> None:
    touched = Counter([*deletions, *(u.mechanism for u in upsertions)])
    if any(n > 1 for n in touched.values()):
        raise fail(KafkaError.DUPLICATE_RESOURCE, f"a mechanism of {name!r} is altered twice")
    if not name:
        raise fail(KafkaError.UNACCEPTABLE_CREDENTIAL, "a user name must be non-empty")
    for mechanism in deletions:
        if mechanism not in SCRAM_MECHANISMS:
            raise fail(KafkaError.UNSUPPORTED_SASL_MECHANISM, f"unknown mechanism {mechanism!r}")
    for u in upsertions:
        if refused := upsertion_refusal(u):
            raise refused
    with broker.engine.begin() as conn:
        authorize_all(conn, broker, needs.alter_acls())
        held = {r.mechanism for r in conn.execute(sql.LOCK_SASL_USER, {"name": name})}
        for mechanism in deletions:
            if mechanism not in held:
                raise fail(
                    KafkaError.RESOURCE_NOT_FOUND, f"user {name!r} has no {mechanism} credential"
                )
            conn.execute(sql.DELETE_SASL_CREDENTIAL, {"name": name, "mechanism": mechanism})
        for u in upsertions:
            stored_key, server_key = scram_keys(u.mechanism, u.salted_password)
            conn.execute(
                sql.UPSERT_SASL_USER,
                {"name": name, "mechanism": u.mechanism, "salt": u.salt,
                 "iterations": u.iterations, "stored_key": stored_key,
                 "server_key": server_key, "now": broker.clock.now_ms()},
            )  # fmt: skip
