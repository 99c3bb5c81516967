"""One handler per RPC of ``app.protocol``, as Kafka's KafkaApis: the table below is the
whole request surface of the broker. Every front end (the in-process clients today, the
Kafka wire protocol next) reaches the log, the coordinators and the groups through it.

Handlers answer refusals with the error code of their response, as Kafka's do; an
exception out of one is a failure of the broker itself (the database gone, a bug).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.broker.offsets import txn_offset_commit
from app.broker.produce import produce, produce_batches
from app.coordinator.handlers import (
    add_offsets_to_txn,
    add_partitions_to_txn,
    end_txn,
    find_coordinator,
    write_txn_markers,
)
from app.coordinator.producer_id import init_producer_id
from app.errors import KafkaError, fail
from app.groups.membership import (
    describe_groups,
    heartbeat,
    join_group,
    leave_group,
    list_groups,
    sync_group,
)
from app.groups.offsets import offset_commit, offset_fetch
from app.log.fetch import fetch, list_offsets
from app.log.topics import metadata
from app.protocol import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    DescribeGroupsRequest,
    EndTxnRequest,
    FetchRequest,
    FindCoordinatorRequest,
    HeartbeatRequest,
    InitProducerIdRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    ListGroupsRequest,
    ListOffsetsRequest,
    MetadataRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    ProduceBatchesRequest,
    ProduceRequest,
    Request,
    SyncGroupRequest,
    TxnOffsetCommitRequest,
    WriteTxnMarkersRequest,
)
from app.storage.context import BrokerContext

Handler = Callable[[BrokerContext, Any], Any]

# request type                -> handler                  (KIP-98's RPC summary, and the groups')
HANDLERS: dict[type[Request[Any]], Handler] = {
    ProduceRequest:               produce,
    ProduceBatchesRequest:        produce_batches,
    MetadataRequest:              metadata,
    FetchRequest:                 fetch,
    ListOffsetsRequest:           list_offsets,
    FindCoordinatorRequest:       find_coordinator,
    InitProducerIdRequest:        init_producer_id,
    AddPartitionsToTxnRequest:    add_partitions_to_txn,
    AddOffsetsToTxnRequest:       add_offsets_to_txn,
    EndTxnRequest:                end_txn,
    WriteTxnMarkersRequest:       write_txn_markers,
    TxnOffsetCommitRequest:       txn_offset_commit,
    OffsetCommitRequest:          offset_commit,
    OffsetFetchRequest:           offset_fetch,
    JoinGroupRequest:             join_group,
    SyncGroupRequest:             sync_group,
    HeartbeatRequest:             heartbeat,
    LeaveGroupRequest:            leave_group,
    ListGroupsRequest:            list_groups,
    DescribeGroupsRequest:        describe_groups,
}  # fmt: skip


def handle(context: BrokerContext, request: Request[Any]) -> Any:
    """The response to ``request``; a request of no known RPC is refused as Kafka refuses
    an unknown API key."""
    handler = HANDLERS.get(type(request))
    if handler is None:
        raise fail(KafkaError.INVALID_REQUEST, f"no handler for {type(request).__name__}")
    return handler(context, request)
