"""KIP-664's transaction tooling: ListTransactions, DescribeTransactions, DescribeProducers,
and kafka-transactions.sh's find-hanging and abort, each one request."""

from __future__ import annotations

from app.coordinator.inspect import list_transactions as transactions_of
from app.coordinator.machines import OPEN_STATES, TXN_STATES
from app.errors import KafkaError, KafkaException
from app.log.inspect import abort_hanging, find_hanging
from app.log.inspect import describe_producers as producers_of
from app.protocol import (
    AbortTransactionRequest,
    AbortTransactionResponse,
    DescribeProducersRequest,
    DescribeProducersResponse,
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    FindHangingTransactionsRequest,
    FindHangingTransactionsResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
    PartitionProducers,
    TransactionListing,
    TransactionStateResult,
)
from app.storage.context import BrokerContext


def list_transactions(
    broker: BrokerContext, req: ListTransactionsRequest
) -> ListTransactionsResponse:
    """The duration filter keeps the transactions still open (begun or preparing) that
    began longer ago than it: those are the ones that can hold a partition's LSO back."""
    states = req.state_filters
    found = transactions_of(broker, states=states)
    if req.producer_id_filters:
        wanted = set(req.producer_id_filters)
        found = [d for d in found if d.producer_id in wanted]
    if req.duration_filter_ms >= 0:
        now = broker.clock.now_ms()
        found = [
            d
            for d in found
            if d.state in OPEN_STATES and now - d.txn_start_ms > req.duration_filter_ms
        ]
    return ListTransactionsResponse(
        KafkaError.NO_ERROR,
        [TransactionListing(d.transactional_id, d.producer_id, d.state) for d in found],
        [s for s in states or () if s not in TXN_STATES],
    )


def describe_transactions(
    broker: BrokerContext, req: DescribeTransactionsRequest
) -> DescribeTransactionsResponse:
    found = {
        d.transactional_id: d for d in transactions_of(broker, ids=list(req.transactional_ids))
    }
    missing = KafkaError.TRANSACTIONAL_ID_NOT_FOUND
    return DescribeTransactionsResponse(
        [
            TransactionStateResult(t, KafkaError.NO_ERROR, found[t])
            if t in found
            else TransactionStateResult(t, missing, None, f"unknown transactional id {t!r}")
            for t in req.transactional_ids
        ]
    )


def describe_producers(
    broker: BrokerContext, req: DescribeProducersRequest
) -> DescribeProducersResponse:
    results = []
    for topic, partition in req.partitions:
        try:
            active = producers_of(broker, topic, partition)
        except KafkaException as exc:
            results.append(PartitionProducers(topic, partition, exc.error.code(), exc.error.str()))
        else:
            results.append(PartitionProducers(topic, partition, KafkaError.NO_ERROR, None, active))
    return DescribeProducersResponse(results)


def find_hanging_transactions(
    broker: BrokerContext, req: FindHangingTransactionsRequest
) -> FindHangingTransactionsResponse:
    return FindHangingTransactionsResponse(find_hanging(broker, req.max_transaction_timeout_ms))


def abort_transaction(
    broker: BrokerContext, req: AbortTransactionRequest
) -> AbortTransactionResponse:
    try:
        written = abort_hanging(broker, req.topic, req.partition, req.start_offset)
    except KafkaException as exc:
        return AbortTransactionResponse(exc.error.code(), exc.error.str())
    return AbortTransactionResponse(KafkaError.NO_ERROR, written=written)
