"""CreateAcls, DescribeAcls, DeleteAcls. The creations of one request are stored together
or not at all, so a refusal is every creation's answer; each delete filter runs on its own."""

from __future__ import annotations

from app.errors import KafkaError, KafkaException
from app.protocol import (
    AclCreationResult,
    AuthorizedOperationsRequest,
    AuthorizedOperationsResponse,
    CreateAclsRequest,
    CreateAclsResponse,
    DeleteAclsFilterResult,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
)
from app.security import acls, operations
from app.storage.context import BrokerContext


def create_acls(broker: BrokerContext, req: CreateAclsRequest) -> CreateAclsResponse:
    try:
        acls.create_acls(broker, req.creations)
        outcome = AclCreationResult(KafkaError.NO_ERROR)
    except KafkaException as exc:
        outcome = AclCreationResult(exc.error.code(), exc.error.str())
    return CreateAclsResponse([outcome] * len(req.creations))


def describe_acls(broker: BrokerContext, req: DescribeAclsRequest) -> DescribeAclsResponse:
    try:
        found = acls.describe_acls(broker, req.acl_filter)
    except KafkaException as exc:
        return DescribeAclsResponse(exc.error.code(), exc.error.str())
    return DescribeAclsResponse(KafkaError.NO_ERROR, None, found)


def delete_acls(broker: BrokerContext, req: DeleteAclsRequest) -> DeleteAclsResponse:
    results = []
    for f in req.filters:
        try:
            deleted = acls.delete_acls(broker, f)
        except KafkaException as exc:
            results.append(DeleteAclsFilterResult(exc.error.code(), exc.error.str()))
        else:
            results.append(DeleteAclsFilterResult(KafkaError.NO_ERROR, None, deleted))
    return DeleteAclsResponse(results)


def authorized_operations(
    broker: BrokerContext, req: AuthorizedOperationsRequest
) -> AuthorizedOperationsResponse:
    """Without an authorizer every supported operation, as Kafka answers (no query)."""
    if not broker.settings.authorization:
        every = operations.bit_field(operations.SUPPORTED[req.resource_type])
        return AuthorizedOperationsResponse(dict.fromkeys(req.names, every))
    with broker.engine.connect() as conn:
        found = operations.authorized_operations(conn, broker, req.resource_type, req.names)
        conn.rollback()
    return AuthorizedOperationsResponse(found)
