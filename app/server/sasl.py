"""SASL/PLAIN on a ``SASL_PLAINTEXT`` listener: who a connection is, before it may ask
anything else.

As a Kafka broker with ``sasl.enabled.mechanisms=PLAIN``: a client sends SaslHandshake
(v1: the token then travels in SaslAuthenticate) and SaslAuthenticate with RFC 4616's
message, ``[authzid] NUL authcid NUL passwd``. The users and passwords come from a file
of ``name=password`` lines, as Kafka's JAAS ``user_NAME="password"`` entries give them.
A connection that authenticates acts as ``User:NAME`` from then on, which the ACLs
decide about; one that fails is answered SASL_AUTHENTICATION_FAILED and closed; any other
request before authentication closes the connection (the listener counts it as
``unauthenticated``), as Kafka's brokers do.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.broker import Broker
from app.errors import KafkaError
from app.server.answer import Node

PLAIN = "PLAIN"
# What a connection may send before it has authenticated.
SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY, API_VERSIONS_KEY = 17, 36, 18
BEFORE_AUTHENTICATION = frozenset({SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY, API_VERSIONS_KEY})


class UsersFileError(ValueError):
    """The users file cannot be read as ``name=password`` lines."""


def load_users(path: Path) -> dict[str, str]:
    """``name=password`` per line (spaces around either are not part of it); blank lines
    and ``#`` comments are skipped. A name may not be empty nor repeated."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsersFileError(f"{path}: {exc.strerror}") from exc
    users: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, password = line.partition("=")
        name, password = name.strip(), password.strip()
        if not sep or not name:
            raise UsersFileError(f"{path}:{number}: not a name=password line")
        if name in users:
            raise UsersFileError(f"{path}:{number}: user {name!r} given twice")
        users[name] = password
    return users


def plain_user(token: bytes, users: dict[str, str]) -> str | None:
    """The user a PLAIN token authenticates (RFC 4616), or None. An authorization id, if
    given, must be the user itself: one user does not act as another."""
    parts = token.split(b"\0")
    if len(parts) != 3:
        return None
    try:
        authzid, authcid, passwd = (p.decode() for p in parts)
    except UnicodeDecodeError:
        return None
    if not authcid or authzid not in ("", authcid):
        return None
    expected = users.get(authcid)
    # Compared in constant time, and a missing user costs as much as a wrong password.
    given, wanted = passwd.encode(), (expected if expected is not None else passwd + "\0").encode()
    if not hmac.compare_digest(given, wanted) or expected is None:
        return None
    return authcid


@dataclass
class Session:
    """One connection's authentication: whom it authenticated as (``principal``), and
    whether it failed (then the listener closes it after the answer)."""

    users: dict[str, str] | None  # None: the listener does not take SASL
    mechanism: str | None = None
    principal: str | None = None
    failed: bool = False

    @property
    def admits(self) -> bool:
        """Whether requests other than the SASL ones may be answered."""
        return self.users is None or self.principal is not None


def sasl_handshake(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    session = node.session
    if session is None or session.users is None:
        return {"error_code": KafkaError.UNSUPPORTED_SASL_MECHANISM, "mechanisms": []}
    if session.principal is not None:
        return {"error_code": KafkaError.ILLEGAL_SASL_STATE, "mechanisms": [PLAIN]}
    if request.mechanism != PLAIN:
        return {"error_code": KafkaError.UNSUPPORTED_SASL_MECHANISM, "mechanisms": [PLAIN]}
    session.mechanism = PLAIN
    return {"error_code": KafkaError.NO_ERROR, "mechanisms": [PLAIN]}


def sasl_authenticate(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    session = node.session
    if session is None or session.users is None or session.mechanism != PLAIN:
        return _authenticated(KafkaError.ILLEGAL_SASL_STATE, "no SaslHandshake for PLAIN first")
    if session.principal is not None:
        return _authenticated(KafkaError.ILLEGAL_SASL_STATE, "already authenticated")
    user = plain_user(bytes(request.auth_bytes), session.users)
    if user is None:
        session.failed = True
        return _authenticated(
            KafkaError.SASL_AUTHENTICATION_FAILED,
            "Authentication failed: Invalid username or password",
        )
    session.principal = f"User:{user}"
    return _authenticated(KafkaError.NO_ERROR, None)


def _authenticated(code: int, message: str | None) -> dict[str, Any]:
    return {"error_code": code, "error_message": message, "auth_bytes": b"", "session_lifetime": 0}
