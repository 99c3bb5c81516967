"""The Produce RPCs: the checks a request passes before it is written (``broker.write``).

Weaker ``acks`` (plain producers only) relax the durability of the request's commit, as
Kafka's relax replication. With ``acks=all`` on a replicated database (docs/design.md
rules 41, 42), the request is refused, nothing written, while too few synchronous
standbys stream (NOT_ENOUGH_REPLICAS); a commit the standbys did not confirm within its
bound answers its batches NOT_ENOUGH_REPLICAS_AFTER_APPEND (a duplicate is decided under
its partition's row lock, which PostgreSQL writes to the WAL, so its commit waits for the
standbys too). A commit request (``end``) raises either failure instead, as a lost
connection: the Producer then sends the same request again (rule 16).
"""

from __future__ import annotations

from app.broker.write import answered_all, write
from app.errors import KafkaError
from app.log.insync import copies_needed
from app.protocol import (
    ACKS_ALL,
    ACKS_LEADER,
    ACKS_NONE,
    ProduceBatchesRequest,
    ProduceBatchesResponse,
    ProduceRequest,
    ProduceResponse,
)
from app.storage.context import BrokerContext
from app.storage.replication import Replicas, not_enough, replicas_short


def produce(context: BrokerContext, req: ProduceRequest) -> ProduceResponse:
    """One batch to one partition."""
    return write(context, ProduceBatchesRequest([req])).batches[0]


def produce_batches(context: BrokerContext, req: ProduceBatchesRequest) -> ProduceBatchesResponse:
    """Several partitions' batches; with ``end``, the Producer's commit."""
    if (why := acks_refusal(req)) is not None:
        refused = ProduceResponse(KafkaError.INVALID_REQUIRED_ACKS, error_message=why)
        return ProduceBatchesResponse([refused] * len(req.batches))
    if req.acks == ACKS_ALL and (short := _replicas_short(context, req)) is not None:
        if req.end is not None:
            raise not_enough(short)
        return answered_all(req, KafkaError.NOT_ENOUGH_REPLICAS, short.describe())
    return write(context, req)


def _replicas_short(context: BrokerContext, req: ProduceBatchesRequest) -> Replicas | None:
    """Too few in-sync copies for this acks=all request: the synchronous standbys the
    server waits for, or its topics' min.insync.replicas (``log.insync``)."""
    copies = copies_needed(context.engine, {b.topic for b in req.batches})
    return replicas_short(context.engine, copies)


def acks_refusal(req: ProduceBatchesRequest) -> str | None:
    """Why these acks cannot be honoured, or None: an unknown value, or weaker acks for a
    batch with a producer id, whose sequence and epoch must be durable before they are
    acknowledged (INVALID_REQUIRED_ACKS; Kafka's broker takes the latter, which its
    clients never send: docs/kafka-differences.md)."""
    if req.acks not in (ACKS_ALL, ACKS_LEADER, ACKS_NONE):
        return f"acks={req.acks} is none of -1, 0, 1"
    if req.acks != ACKS_ALL and (
        req.add is not None or req.end is not None or any(b.producer_id >= 0 for b in req.batches)
    ):
        return "idempotent and transactional batches need acks=all"
    return None
