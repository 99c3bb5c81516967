"""DescribeUserScramCredentials and AlterUserScramCredentials (KIP-554): the SCRAM
credentials of ``kip98 users``' users, as Kafka's admin APIs show and change them."""

from __future__ import annotations

from app.errors import KafkaError, KafkaException
from app.protocol import (
    AlteredUser,
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
)
from app.security.users import alter_scram_credentials, describe_scram_credentials
from app.storage.context import BrokerContext


def describe_user_scram_credentials(
    broker: BrokerContext, req: DescribeUserScramCredentialsRequest
) -> DescribeUserScramCredentialsResponse:
    """A refusal of the whole request (the cluster's Describe) is its ``error_code``."""
    try:
        found = describe_scram_credentials(broker, req.users)
    except KafkaException as exc:
        return DescribeUserScramCredentialsResponse(exc.error.code(), exc.error.str())
    return DescribeUserScramCredentialsResponse(KafkaError.NO_ERROR, None, found)


def alter_user_scram_credentials(
    broker: BrokerContext, req: AlterUserScramCredentialsRequest
) -> AlterUserScramCredentialsResponse:
    """Each user answered on its own."""
    return AlterUserScramCredentialsResponse(
        [
            AlteredUser(name, KafkaError.NO_ERROR)
            if exc is None
            else AlteredUser(name, exc.error.code(), exc.error.str())
            for name, exc in alter_scram_credentials(broker, req.deletions, req.upsertions)
        ]
    )
