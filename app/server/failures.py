"""A request that fails is answered with an error code, never by closing its connection.

The broker's handlers answer refusals with their codes already; what is left is a
failure of the broker itself (the database lost or out of time, a bug). The wire handlers
reach the broker through ``AnsweringBroker``, whose ``handle`` turns such a failure into
the response the request would have had with every item of it failed: a handler that asks
one partition at a time gets that partition's error, one that asks for several at once
gets the error for each. The code says what failed: a lost connection or a bound reached
is retriable (REQUEST_TIMED_OUT on the wire), anything else UNKNOWN_SERVER_ERROR; the
failure is logged with its cause. (The native clients call the broker directly and get
the failure as a KafkaException, docs/design.md rule 25.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

from app import protocol
from app.broker import Broker
from app.broker.endpoint import kafka_error
from app.errors import KafkaError, KafkaException
from app.protocol import (
    AclCreationResult,
    AlterConfigsRequest,
    AlterConfigsResourceResponse,
    AlterConfigsResponse,
    AlteredUser,
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    AuthorizedOperationsRequest,
    AuthorizedOperationsResponse,
    ConsumerGroupDescribed,
    ConsumerGroupDescribeRequest,
    ConsumerGroupDescribeResponse,
    CreatableTopicResult,
    CreateAclsRequest,
    CreateAclsResponse,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreatePartitionsResult,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeletableTopicResult,
    DeleteAclsFilterResult,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DeletedGroup,
    DeletedRecords,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribeConfigsResult,
    DescribedGroup,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    DescribeProducersRequest,
    DescribeProducersResponse,
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    EpochEndOffset,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
    MetadataRequest,
    MetadataResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
    PartitionProducers,
    ProduceBatchesRequest,
    ProduceBatchesResponse,
    ProduceResponse,
    R,
    Request,
    TopicMetadata,
    TransactionStateResult,
)
from app.server.answer import NO_OPERATIONS

log = logging.getLogger(__name__)

Failed = Callable[[Any, int, str], Any]

# The requests whose response lists an answer per item: each item failed. The others'
# responses carry an error code first, which a failure fills.
_EVERY_ITEM: dict[type[Any], Failed] = {
    ProduceBatchesRequest: lambda r, c, m: ProduceBatchesResponse(
        [ProduceResponse(c, error_message=m) for _ in r.batches]
    ),
    MetadataRequest: lambda r, c, m: MetadataResponse(
        [TopicMetadata(c, name, error_message=m) for name in r.topics or []]
    ),
    CreateTopicsRequest: lambda r, c, m: CreateTopicsResponse(
        [CreatableTopicResult(t.name, c, m) for t in r.topics]
    ),
    DeleteTopicsRequest: lambda r, c, m: DeleteTopicsResponse(
        [DeletableTopicResult(n, c, m) for n in r.topic_names]
    ),
    CreatePartitionsRequest: lambda r, c, m: CreatePartitionsResponse(
        [CreatePartitionsResult(t.name, c, m) for t in r.topics]
    ),
    DeleteRecordsRequest: lambda r, c, m: DeleteRecordsResponse(
        [DeletedRecords(t, p, c, error_message=m) for t, p, _ in r.partitions]
    ),
    DescribeConfigsRequest: lambda r, c, m: DescribeConfigsResponse(
        [DescribeConfigsResult(x.resource_type, x.resource_name, c, m) for x in r.resources]
    ),
    AlterConfigsRequest: lambda r, c, m: AlterConfigsResponse(
        [AlterConfigsResourceResponse(x.resource_type, x.resource_name, c, m) for x in r.resources]
    ),
    IncrementalAlterConfigsRequest: lambda r, c, m: IncrementalAlterConfigsResponse(
        [AlterConfigsResourceResponse(x.resource_type, x.resource_name, c, m) for x in r.resources]
    ),
    CreateAclsRequest: lambda r, c, m: CreateAclsResponse(
        [AclCreationResult(c, m) for _ in r.creations]
    ),
    DeleteAclsRequest: lambda r, c, m: DeleteAclsResponse(
        [DeleteAclsFilterResult(c, m) for _ in r.filters]
    ),
    DescribeGroupsRequest: lambda r, c, m: DescribeGroupsResponse(
        [DescribedGroup(g, c, "Dead", "", "") for g in r.group_ids]
    ),
    DeleteGroupsRequest: lambda r, c, m: DeleteGroupsResponse(
        [DeletedGroup(g, c, m) for g in r.group_ids]
    ),
    ConsumerGroupDescribeRequest: lambda r, c, m: ConsumerGroupDescribeResponse(
        [ConsumerGroupDescribed(g, c, m) for g in r.group_ids]
    ),
    DescribeTransactionsRequest: lambda r, c, m: DescribeTransactionsResponse(
        [TransactionStateResult(t, c, None, m) for t in r.transactional_ids]
    ),
    DescribeProducersRequest: lambda r, c, m: DescribeProducersResponse(
        [PartitionProducers(t, p, c, m) for t, p in r.partitions]
    ),
    OffsetForLeaderEpochRequest: lambda r, c, m: OffsetForLeaderEpochResponse(
        [EpochEndOffset(q.topic, q.partition, c, error_message=m) for q in r.partitions]
    ),
    # The ACLs not read: each resource's operations "not worked out" (KIP-430's
    # INT32_MIN), which a client shows as unknown; the describe itself still answers.
    AuthorizedOperationsRequest: lambda r, c, m: AuthorizedOperationsResponse(
        dict.fromkeys(r.names, NO_OPERATIONS)
    ),
    # No live node read: whoever asked answers as its own node alone (cluster_apis).
    DescribeClusterRequest: lambda r, c, m: DescribeClusterResponse([]),
    AlterUserScramCredentialsRequest: lambda r, c, m: AlterUserScramCredentialsResponse(
        [
            AlteredUser(u, c, m)
            for u in dict.fromkeys([n for n, _ in r.deletions] + [u.user for u in r.upsertions])
        ]
    ),
}


def failure_code(exc: BaseException) -> KafkaError:
    """What a failure of the broker means to a client: a KafkaException's own error, a
    database failure's (``storage.errors``), else UNKNOWN_SERVER_ERROR."""
    if isinstance(exc, KafkaException):
        return exc.error
    found = kafka_error(exc)
    if found is not None:
        return found
    return KafkaError(KafkaError.UNKNOWN_SERVER_ERROR, f"{type(exc).__name__}: {exc}")


# The coordinators' requests. Kafka's coordinators answer a failed write to their log
# (timed out, too few replicas) with COORDINATOR_NOT_AVAILABLE, which clients meet by
# finding the coordinator again and retrying inside the call; REQUEST_TIMED_OUT from an
# EndTxn, say, reaches a librdkafka application as the call's failure.
_COORDINATED = (
    protocol.InitProducerIdRequest, protocol.AddPartitionsToTxnRequest,
    protocol.AddOffsetsToTxnRequest, protocol.EndTxnRequest, protocol.TxnOffsetCommitRequest,
    protocol.OffsetCommitRequest, protocol.OffsetFetchRequest, protocol.JoinGroupRequest,
    protocol.SyncGroupRequest, protocol.HeartbeatRequest, protocol.LeaveGroupRequest,
)  # fmt: skip
_UNAVAILABLE = (KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT)


def coordinator_failure(request: Request[Any], error: KafkaError) -> KafkaError:
    """``error`` as a coordinator answers it: the database lost or out of time is
    COORDINATOR_NOT_AVAILABLE (retriable) for a coordinator's request."""
    if isinstance(request, _COORDINATED) and error.code() in _UNAVAILABLE:
        return KafkaError(KafkaError.COORDINATOR_NOT_AVAILABLE, error.str(), retriable=True)
    return error


def failed_response(request: Request[R], error: KafkaError) -> R:
    """``request``'s response with every item of it answered ``error``."""
    code, message = error.code(), error.str()
    every = _EVERY_ITEM.get(type(request))
    if every is not None:
        return cast(R, every(request, code, message))
    kind = _response_type(type(request))
    return cast(R, kind(code, error_message=message) if _has_message(kind) else kind(code))


def _response_type(request: type[Request[Any]]) -> type[Any]:
    """The response type a request type names (``Request[R]``)."""
    for base in getattr(request, "__orig_bases__", ()):
        args = getattr(base, "__args__", ())
        if args:
            name = args[0] if isinstance(args[0], str) else args[0].__forward_arg__
            kind: type[Any] = getattr(protocol, name)
            return kind
    raise TypeError(f"{request.__name__} names no response type")


def _has_message(kind: type[Any]) -> bool:
    return "error_message" in getattr(kind, "__dataclass_fields__", {})


class AnsweringBroker(Broker):
    """The broker as the wire handlers reach it: a request it fails on is answered with
    its error in every item (``failed_response``), logged with the cause."""

    def handle(self, request: Request[R]) -> R:
        try:
            return super().handle(request)
        except Exception as exc:  # the broker failed: answered, not raised
            error = coordinator_failure(request, failure_code(exc))
            log.warning(
                "kip98 serve: %s failed; answered %s",
                type(request).__name__,
                error.name(),
                exc_info=exc,
            )
            return failed_response(request, error)
