"""SASL/PLAIN on a ``SASL_PLAINTEXT`` listener: who a connection is, before it may ask
anything else.

As a Kafka broker with ``sasl.enabled.mechanisms=PLAIN``: a client sends SaslHandshake
(v1: the token then travels in SaslAuthenticate) and SaslAuthenticate with RFC 4616's
message, ``[authzid] NUL authcid NUL passwd``. The users are ``kip98 users``'
(``app.security.users``, asked through the broker's SaslPlainRequest). A connection that
authenticates acts as ``User:NAME`` from then on, which the ACLs decide about; one that
fails is answered SASL_AUTHENTICATION_FAILED and closed; any other request before
authentication closes the connection (the listener counts it as ``unauthenticated``), as
Kafka's brokers do (docs/design.md rule 30).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.broker import Broker
from app.errors import KafkaError
from app.protocol import SaslPlainRequest
from app.server.answer import Node

PLAIN = "PLAIN"
# What a connection may send before it has authenticated.
SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY, API_VERSIONS_KEY = 17, 36, 18
BEFORE_AUTHENTICATION = frozenset({SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY, API_VERSIONS_KEY})


def plain_credentials(token: bytes) -> tuple[str, str] | None:
    """The user and password of a PLAIN token (RFC 4616), or None if it is not one. An
    authorization id, if given, must be the user itself: one user does not act as
    another."""
    parts = token.split(b"\0")
    if len(parts) != 3:
        return None
    try:
        authzid, authcid, passwd = (p.decode() for p in parts)
    except UnicodeDecodeError:
        return None
    if not authcid or authzid not in ("", authcid):
        return None
    return authcid, passwd


@dataclass
class Session:
    """One connection's authentication: whom it authenticated as (``principal``), and
    whether it failed (then the listener closes it after the answer)."""

    enabled: bool  # False: a PLAINTEXT listener, which takes no SASL
    mechanism: str | None = None
    principal: str | None = None
    failed: bool = False

    @property
    def admits(self) -> bool:
        """Whether requests other than the SASL ones may be answered."""
        return not self.enabled or self.principal is not None


def sasl_handshake(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    session = node.session
    if session is None or not session.enabled:
        return {"error_code": KafkaError.UNSUPPORTED_SASL_MECHANISM, "mechanisms": []}
    if session.principal is not None:
        return {"error_code": KafkaError.ILLEGAL_SASL_STATE, "mechanisms": [PLAIN]}
    if request.mechanism != PLAIN:
        return {"error_code": KafkaError.UNSUPPORTED_SASL_MECHANISM, "mechanisms": [PLAIN]}
    session.mechanism = PLAIN
    return {"error_code": KafkaError.NO_ERROR, "mechanisms": [PLAIN]}


def sasl_authenticate(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    session = node.session
    if session is None or not session.enabled or session.mechanism != PLAIN:
        return _authenticated(KafkaError.ILLEGAL_SASL_STATE, "no SaslHandshake for PLAIN first")
    if session.principal is not None:
        return _authenticated(KafkaError.ILLEGAL_SASL_STATE, "already authenticated")
    credentials = plain_credentials(bytes(request.auth_bytes))
    answer = None if credentials is None else broker.handle(SaslPlainRequest(*credentials))
    if answer is None or answer.error_code != KafkaError.NO_ERROR:
        session.failed = True
        return _authenticated(
            KafkaError.SASL_AUTHENTICATION_FAILED,
            "Authentication failed: Invalid username or password",
        )
    session.principal = answer.principal
    return _authenticated(KafkaError.NO_ERROR, None)


def _authenticated(code: int, message: str | None) -> dict[str, Any]:
    return {"error_code": code, "error_message": message, "auth_bytes": b"", "session_lifetime": 0}
