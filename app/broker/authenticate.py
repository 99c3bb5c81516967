"""SaslPlain: a listener asks whether a SASL/PLAIN user and password go together, and
learns the principal the connection then acts as (``User:NAME``)."""

from __future__ import annotations

from app.errors import KafkaError
from app.protocol import SaslPlainRequest, SaslPlainResponse
from app.security.users import check_plain
from app.storage.context import BrokerContext


def sasl_plain(broker: BrokerContext, req: SaslPlainRequest) -> SaslPlainResponse:
    if not req.username or not check_plain(broker, req.username, req.password):
        return SaslPlainResponse(KafkaError.SASL_AUTHENTICATION_FAILED)
    return SaslPlainResponse(KafkaError.NO_ERROR, f"User:{req.username}")
