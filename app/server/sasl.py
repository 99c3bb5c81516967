"""SASL on a ``SASL_PLAINTEXT`` listener: who a connection is, before it may ask anything
else.

As a Kafka broker with ``sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512``: a
client sends SaslHandshake naming its mechanism, then its tokens: for PLAIN one, RFC
4616's message ``[authzid] NUL authcid NUL passwd``; for SCRAM two, the client-first then
the client-final message of RFC 5802, each answered with the server's (``scramp`` runs the
exchange with the user's stored credential; the password never travels). After a v1
handshake each token travels in a SaslAuthenticate request; after a v0 one (which Kafka
4 still serves, and librdkafka's check of the broker's versions asks for) each is a bare
frame, a 4-byte size and the token, answered the same way (``sasl_token``), and a failure
closes the connection unanswered, as Kafka's SaslServerAuthenticator does. The users are
``kip98 users``' (``app.security.users``, asked through the broker's SaslPlainRequest and
SaslScramRequest); a user logs in by the mechanism it was added with. A connection that
authenticates acts as ``User:NAME`` from then on, which the ACLs decide about; one that
fails is answered SASL_AUTHENTICATION_FAILED and closed, as is a handshake naming a mechanism
not enabled (UNSUPPORTED_SASL_MECHANISM with the enabled ones); any other request before
authentication closes the connection (the listener counts it as ``unauthenticated``), as
Kafka's brokers do (docs/design.md rule 30).
"""

from __future__ import annotations

from typing import Any

from scramp import ScramException, ScramMechanism
from scramp.core import Nonce, Salt

from app.broker import Broker
from app.errors import KafkaError
from app.protocol import SaslPlainRequest, SaslScramRequest
from app.server.node import Node, Session

# scramp refuses salts under 12 bytes; Kafka takes whatever salt a client chose for its
# credential (AlterUserScramCredentials: confluent-kafka's own test sets b"salt"), and RFC
# 5802 sets no floor. A stored credential's salt, whatever its length, is the one its
# exchange must use.
Salt.MIN_LENGTH = 1

PLAIN = "PLAIN"
SCRAM = ("SCRAM-SHA-256", "SCRAM-SHA-512")
MECHANISMS = [PLAIN, *SCRAM]
FAILED = "Authentication failed: Invalid username or password"
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


def sasl_handshake(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    session = node.session
    if session is None or not session.enabled:
        # A listener without SASL: as Kafka's KafkaApis answers a handshake there.
        return {"error_code": KafkaError.ILLEGAL_SASL_STATE, "mechanisms": []}
    if session.principal is not None or session.mechanism is not None:
        return {"error_code": KafkaError.ILLEGAL_SASL_STATE, "mechanisms": MECHANISMS}
    if request.mechanism not in MECHANISMS:
        # Answered with the mechanisms it could have named, then closed, as Kafka's
        # SaslServerAuthenticator does (its handshake fails as an authentication does).
        session.failed = True
        return {"error_code": KafkaError.UNSUPPORTED_SASL_MECHANISM, "mechanisms": MECHANISMS}
    session.mechanism = request.mechanism
    session.bare_tokens = request.__version__ == 0
    return {"error_code": KafkaError.NO_ERROR, "mechanisms": MECHANISMS}


def sasl_authenticate(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    session = node.session
    if session is None or not session.enabled or session.mechanism is None:
        return _authenticated(KafkaError.ILLEGAL_SASL_STATE, "no SaslHandshake first")
    if session.principal is not None:
        return _authenticated(KafkaError.ILLEGAL_SASL_STATE, "already authenticated")
    return _exchange(broker, session, bytes(request.auth_bytes))


def sasl_token(broker: Broker, session: Session, token: bytes) -> bytes | None:
    """A bare token after a v0 SaslHandshake: the server's token as a bare frame (for
    PLAIN an empty one), or None when the login failed (``session.failed``): v0 has no
    way to say why, so the connection is closed."""
    answer = _exchange(broker, session, token)
    if answer["error_code"] != KafkaError.NO_ERROR:
        session.failed = True
        return None
    reply: bytes = answer["auth_bytes"]
    return len(reply).to_bytes(4, "big") + reply


def scram_username(client_first: bytes) -> str | None:
    """The user a SCRAM client-first message names (RFC 5802 ``n=``, with ``=2C`` and
    ``=3D`` for "," and "="), or None if it names none."""
    try:
        text = client_first.decode()
    except UnicodeDecodeError:
        return None
    for part in text.split(",")[2:3]:
        if part.startswith("n="):
            return part[2:].replace("=2C", ",").replace("=3D", "=")
    return None


def _exchange(broker: Broker, session: Session, token: bytes) -> dict[str, Any]:
    """One token of the session's mechanism, answered as SaslAuthenticate's values."""
    if session.mechanism == PLAIN:
        return _plain(broker, session, token)
    if session.scram is None:
        return _scram_first(broker, session, token)
    return _scram_final(session, token)


def _plain(broker: Broker, session: Session, token: bytes) -> dict[str, Any]:
    credentials = plain_credentials(token)
    session.tried = _user(credentials[0] if credentials else _plain_user(token))
    answer = None if credentials is None else broker.handle(SaslPlainRequest(*credentials))
    if answer is None or answer.error_code != KafkaError.NO_ERROR:
        return _failed(session)
    session.principal = answer.principal
    return _authenticated(KafkaError.NO_ERROR, None)


def _scram_first(broker: Broker, session: Session, token: bytes) -> dict[str, Any]:
    """The client-first message: the user's credential is looked up and the server-first
    message (the salt, the iteration count, the nonce) answered. An unknown user fails
    here, as Kafka's SCRAM server fails it."""
    assert session.mechanism is not None
    session.tried = _user(scram_username(token))

    def credential(username: str) -> tuple[bytes, bytes, bytes, int] | None:
        answer = broker.handle(SaslScramRequest(username, str(session.mechanism)))
        if (found := answer.credential) is None:
            return None
        session.scram_principal = answer.principal
        return found.salt, found.stored_key, found.server_key, found.iterations

    server = ScramMechanism(session.mechanism).make_server(credential)
    try:
        server.set_client_first(token.decode())
        first = server.get_server_first()
    except (ScramException, UnicodeDecodeError):
        return _failed(session)
    session.scram = server
    return _authenticated(KafkaError.NO_ERROR, None, first.encode())


def _scram_final(session: Session, token: bytes) -> dict[str, Any]:
    """The client-final message: its proof checked against StoredKey; the answer carries
    the server's signature, which proves to the client that the server knew its
    credential."""
    assert session.scram is not None
    try:
        _take_kafkas_nonce(session.scram, token.decode())
        session.scram.set_client_final(token.decode())
        final = session.scram.get_server_final()
    except (ScramException, UnicodeDecodeError):
        return _failed(session)
    session.principal, session.scram = session.scram_principal, None
    return _authenticated(KafkaError.NO_ERROR, None, final.encode())


def _take_kafkas_nonce(server: Any, client_final: str) -> None:
    """Kafka's SCRAM server takes a client-final nonce that ends with the server-first's
    (ScramSaslServer checks ``endsWith``), RFC 5802 one equal to it: librdkafka 2.0 (Debian
    12's kcat) sends its own nonce once more in front. The proof is still checked over
    the message as sent, and the server's random part must still end it."""
    sent = next((p[2:] for p in client_final.split(",") if p.startswith("r=")), None)
    expected = str(server.nonce)
    if sent is not None and sent != expected and sent.endswith(expected):
        server.nonce = Nonce(sent)  # scramp compares its own server.nonce with the sent one


def _plain_user(token: bytes) -> str | None:
    """The user a PLAIN token that is not one names, if any (for the log line only)."""
    parts = token.split(b"\0")
    return parts[1].decode(errors="replace") if len(parts) == 3 and parts[1] else None


def _user(name: str | None) -> str | None:
    return None if name is None else f"User:{name}"


def _failed(session: Session) -> dict[str, Any]:
    """SASL_AUTHENTICATION_FAILED, after which the listener closes the connection."""
    session.failed, session.scram = True, None
    return _authenticated(KafkaError.SASL_AUTHENTICATION_FAILED, FAILED)


def _authenticated(code: int, message: str | None, token: bytes = b"") -> dict[str, Any]:
    return {
        "error_code": code,
        "error_message": message,
        "auth_bytes": token,
        "session_lifetime": 0,
    }
