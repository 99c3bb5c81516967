"""The Produce RPCs: the one place a batch meets its transaction.

A produce request is one DB transaction: for each batch, the ACLs and, if transactional,
the coordinator's word that its transaction is ongoing with this identity and has its
partition (rule 6, ``coordinator.guard``); then the log appends every admitted batch
(``log.append``); ``broker.batches`` does this. With ``add`` (KIP-890's implicit AddPartitionsToTxn) the coordinator
first checks the registration, the batches are decided against the transaction as
registered, and the registration is recorded once they are: registration and data commit
together or not at all, and a partition none of whose batches got in is not registered.
With ``end`` the request goes on to end the transaction (``broker.commit``).

A single ``ProduceRequest`` is a set of one: there is one path.
"""

from __future__ import annotations

from app.broker.batches import append_batches
from app.broker.commit import produce_and_end_txn
from app.broker.work import Work
from app.protocol import (
    ProduceBatchesRequest,
    ProduceBatchesResponse,
    ProduceRequest,
    ProduceResponse,
)
from app.storage.context import BrokerContext
from app.storage.engine import retry_conflicts


def produce(context: BrokerContext, req: ProduceRequest) -> ProduceResponse:
    """One batch to one partition."""
    return _produce(context, ProduceBatchesRequest([req])).batches[0]


def produce_batches(context: BrokerContext, req: ProduceBatchesRequest) -> ProduceBatchesResponse:
    """Several partitions' batches; with ``end``, the Producer's commit."""
    if req.end is not None:
        return produce_and_end_txn(context, req)
    return _produce(context, req)


@retry_conflicts
def _produce(context: BrokerContext, req: ProduceBatchesRequest) -> ProduceBatchesResponse:
    with context.engine.begin() as conn:
        registered, batches = append_batches(Work(context, conn), req.batches, req.add)
    return ProduceBatchesResponse(batches, registered)
