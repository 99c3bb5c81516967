"""One handler per RPC of ``app.protocol``, as Kafka's KafkaApis: the table below is the
whole request surface of the broker. Every front end (the in-process clients, the Kafka
wire protocol of ``kip98 serve``) reaches the log, the coordinators, the groups and the
ACLs through it.

Handlers answer refusals with the error code of their response, as Kafka's do; an
exception out of one is a failure of the broker itself (the database gone, a bug).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.broker.admin import acls, configs, scram, topics, transactions
from app.broker.authenticate import sasl_plain, sasl_scram
from app.broker.offsets import txn_offset_commit
from app.broker.produce import produce, produce_batches
from app.cluster import registrations
from app.coordinator.handlers import (
    add_offsets_to_txn,
    add_partitions_to_txn,
    end_txn,
    find_coordinator,
    write_txn_markers,
)
from app.coordinator.producer_id import init_producer_id
from app.errors import KafkaError, fail
from app.groups.consumer import consumer_group_describe, consumer_group_heartbeat
from app.groups.deletion import delete_groups, offset_delete
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
from app.log.leader_epoch import offset_for_leader_epoch
from app.log.topics import metadata
from app.protocol import (
    AbortTransactionRequest,
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    AlterConfigsRequest,
    AlterUserScramCredentialsRequest,
    AuthorizedOperationsRequest,
    BrokerHeartbeatRequest,
    BrokerRegistrationRequest,
    ConsumerGroupDescribeRequest,
    ConsumerGroupHeartbeatRequest,
    CreateAclsRequest,
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteAclsRequest,
    DeleteGroupsRequest,
    DeleteRecordsRequest,
    DeleteTopicsRequest,
    DescribeAclsRequest,
    DescribeClusterRequest,
    DescribeConfigsRequest,
    DescribeGroupsRequest,
    DescribeProducersRequest,
    DescribeTransactionsRequest,
    DescribeUserScramCredentialsRequest,
    EndTxnRequest,
    FetchRequest,
    FindCoordinatorRequest,
    FindHangingTransactionsRequest,
    HeartbeatRequest,
    IncrementalAlterConfigsRequest,
    InitProducerIdRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    ListGroupsRequest,
    ListOffsetsRequest,
    ListTopicsRequest,
    ListTransactionsRequest,
    MetadataRequest,
    OffsetCommitRequest,
    OffsetDeleteRequest,
    OffsetFetchRequest,
    OffsetForLeaderEpochRequest,
    ProduceBatchesRequest,
    ProduceRequest,
    Request,
    SaslPlainRequest,
    SaslScramRequest,
    SyncGroupRequest,
    TxnOffsetCommitRequest,
    UnregisterBrokerRequest,
    WriteTxnMarkersRequest,
)
from app.storage.context import BrokerContext

Handler = Callable[[BrokerContext, Any], Any]

# request type                -> handler        (KIP-98's RPC summary, the groups', the admin's)
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
    DeleteGroupsRequest:          delete_groups,
    OffsetDeleteRequest:          offset_delete,
    ConsumerGroupHeartbeatRequest: consumer_group_heartbeat,
    ConsumerGroupDescribeRequest: consumer_group_describe,
    OffsetForLeaderEpochRequest:  offset_for_leader_epoch,
    CreateTopicsRequest:          topics.create_topics,
    DeleteTopicsRequest:          topics.delete_topics,
    ListTopicsRequest:            topics.list_topics,
    CreatePartitionsRequest:      topics.create_partitions,
    DeleteRecordsRequest:         topics.delete_records,
    DescribeConfigsRequest:       configs.describe_configs,
    AlterConfigsRequest:          configs.alter_configs,
    IncrementalAlterConfigsRequest: configs.incremental_alter_configs,
    CreateAclsRequest:            acls.create_acls,
    DescribeAclsRequest:          acls.describe_acls,
    DeleteAclsRequest:            acls.delete_acls,
    SaslPlainRequest:             sasl_plain,
    SaslScramRequest:             sasl_scram,
    DescribeUserScramCredentialsRequest: scram.describe_user_scram_credentials,
    AlterUserScramCredentialsRequest: scram.alter_user_scram_credentials,
    ListTransactionsRequest:      transactions.list_transactions,
    DescribeTransactionsRequest:  transactions.describe_transactions,
    DescribeProducersRequest:     transactions.describe_producers,
    FindHangingTransactionsRequest: transactions.find_hanging_transactions,
    AbortTransactionRequest:      transactions.abort_transaction,
    BrokerRegistrationRequest:    registrations.register,
    BrokerHeartbeatRequest:       registrations.heartbeat,
    UnregisterBrokerRequest:      registrations.unregister,
    DescribeClusterRequest:       registrations.describe_cluster,
    AuthorizedOperationsRequest:  acls.authorized_operations,
}  # fmt: skip


def handle(context: BrokerContext, request: Request[Any]) -> Any:
    """The response to ``request``; a request of no known RPC is refused as Kafka refuses
    an unknown API key."""
    handler = HANDLERS.get(type(request))
    if handler is None:
        raise fail(KafkaError.INVALID_REQUEST, f"no handler for {type(request).__name__}")
    return handler(context, request)
