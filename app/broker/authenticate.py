"""The SASL lookups of a listener (``kip98 serve``): whether a PLAIN user and password go
together, and a SCRAM user's credential for the exchange the listener runs; either way the
principal the connection then acts as (``User:NAME``)."""

from __future__ import annotations

from app.errors import KafkaError
from app.protocol import SaslPlainRequest, SaslPlainResponse, SaslScramRequest, SaslScramResponse
from app.security.users import check_plain, scram_user
from app.storage.context import BrokerContext


def sasl_plain(broker: BrokerContext, req: SaslPlainRequest) -> SaslPlainResponse:
    if not req.username or not check_plain(broker, req.username, req.password):
        return SaslPlainResponse(KafkaError.SASL_AUTHENTICATION_FAILED)
    return SaslPlainResponse(KafkaError.NO_ERROR, f"User:{req.username}")


def sasl_scram(broker: BrokerContext, req: SaslScramRequest) -> SaslScramResponse:
    credential = scram_user(broker, req.username, req.mechanism) if req.username else None
    if credential is None:
        return SaslScramResponse(KafkaError.SASL_AUTHENTICATION_FAILED)
    return SaslScramResponse(KafkaError.NO_ERROR, f"User:{req.username}", credential)
