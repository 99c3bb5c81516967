"""The broker: the one request boundary, as Kafka's KafkaApis.

``Broker.handle(request)`` answers every RPC of ``app.protocol`` (the table is in
``app.broker.apis``). It is a ``BrokerContext`` (the database, clock, settings and
principal every handler runs with), so the libraries beneath take it as they are and never
import this package.
"""

from __future__ import annotations

from typing import Any, overload

from app.broker import apis
from app.protocol import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    FetchRequest,
    FetchResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    ProduceRequest,
    ProduceResponse,
    SyncGroupRequest,
    SyncGroupResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
    WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
)
from app.storage.context import BrokerContext, principal_from_env

__all__ = ["Broker", "BrokerContext", "principal_from_env"]


class Broker(BrokerContext):
    @overload
    def handle(self, request: ProduceRequest) -> ProduceResponse: ...
    @overload
    def handle(self, request: FetchRequest) -> FetchResponse: ...
    @overload
    def handle(self, request: ListOffsetsRequest) -> ListOffsetsResponse: ...
    @overload
    def handle(self, request: FindCoordinatorRequest) -> FindCoordinatorResponse: ...
    @overload
    def handle(self, request: InitProducerIdRequest) -> InitProducerIdResponse: ...
    @overload
    def handle(self, request: AddPartitionsToTxnRequest) -> AddPartitionsToTxnResponse: ...
    @overload
    def handle(self, request: AddOffsetsToTxnRequest) -> AddOffsetsToTxnResponse: ...
    @overload
    def handle(self, request: EndTxnRequest) -> EndTxnResponse: ...
    @overload
    def handle(self, request: WriteTxnMarkersRequest) -> WriteTxnMarkersResponse: ...
    @overload
    def handle(self, request: TxnOffsetCommitRequest) -> TxnOffsetCommitResponse: ...
    @overload
    def handle(self, request: OffsetCommitRequest) -> OffsetCommitResponse: ...
    @overload
    def handle(self, request: OffsetFetchRequest) -> OffsetFetchResponse: ...
    @overload
    def handle(self, request: JoinGroupRequest) -> JoinGroupResponse: ...
    @overload
    def handle(self, request: SyncGroupRequest) -> SyncGroupResponse: ...
    @overload
    def handle(self, request: HeartbeatRequest) -> HeartbeatResponse: ...
    @overload
    def handle(self, request: LeaveGroupRequest) -> LeaveGroupResponse: ...

    def handle(self, request: Any) -> Any:
        """The response to one request (docs/architecture.md: how a request travels)."""
        return apis.handle(self, request)
