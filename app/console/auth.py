"""Logging in with kip98's users: the password checked against the stored SCRAM keys.

No crypto here: ``app.security.users`` derives the keys (``scramp``) and keeps them; a
password is right when, derived with a stored credential's salt and iterations, it gives
that credential's StoredKey (RFC 5802), whichever mechanism the user has one for.
"""

from __future__ import annotations

import hmac

from scramp import ScramException

from app.security.users import PLAIN, SCRAM_MECHANISMS, check_plain, scram_credential, scram_user
from app.storage.context import BrokerContext


def check_password(broker: BrokerContext, name: str, password: str) -> bool:
    """Whether ``password`` is user ``name``'s, by any of its credentials."""
    if not name or len(name) > 256 or len(password) > 1024:
        return False
    if check_plain(broker, name, password):
        return True
    for mechanism in SCRAM_MECHANISMS:
        stored = scram_user(broker, name, mechanism)
        if stored is None:
            continue
        try:
            derived = scram_credential(password, mechanism, stored.salt, stored.iterations)
        except ScramException:
            return False
        if hmac.compare_digest(derived.stored_key, stored.stored_key):
            return True
    return False


def principal(name: str) -> str:
    """The principal a console user acts as: Kafka's ``User:name``, as a SASL login."""
    return f"User:{name}"


__all__ = ["PLAIN", "check_password", "principal"]
