"""The Produce RPCs: the one place a batch meets its transaction.

A produce request is one DB transaction: for each batch, the ACLs and, if transactional,
the coordinator's word that its transaction is ongoing with this identity and has its
partition (rule 6, ``coordinator.guard``); then the log appends every admitted batch
(``log.append``); ``broker.batches`` does this. With ``add`` (KIP-890's implicit AddPartitionsToTxn) the coordinator
first checks the registration, the batches are decided against the transaction as
registered, and the registration is recorded once they are: registration and data commit
together or not at all, and a partition none of whose batches got in is not registered.
With ``end`` the request goes on to end the transaction (``broker.commit``).

A single ``ProduceRequest`` is a set of one: there is one path. Weaker ``acks`` (plain
producers only) relax the durability of the request's commit, as Kafka's relax
replication. With ``acks=all`` on a replicated database (docs/design.md rules 41, 42),
the request is refused, nothing written, while too few synchronous standbys stream
(NOT_ENOUGH_REPLICAS); a commit the standbys did not confirm within its bound answers its
batches NOT_ENOUGH_REPLICAS_AFTER_APPEND; and a duplicate batch, which acknowledges what an
earlier commit wrote, is decided under its partition's row lock, which PostgreSQL writes
to the WAL, so its commit too waits for the standbys, which then hold the earlier one. A
commit
request (``end``) raises either failure instead, as a lost connection: the Producer then
sends the same request again, as for a commit whose outcome is unknown (rule 16).
"""

from __future__ import annotations

from app.broker import strategy
from app.broker.batches import append_batches
from app.broker.commit import produce_and_end_txn
from app.broker.commit_decision import answer
from app.broker.commit_remembered import on_remembered
from app.broker.work import Work
from app.coordinator.txn_log import remember_txn, written_txn
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
from app.storage.engine import lazy_transaction, retry_conflicts
from app.storage.replication import Replicas, not_enough, replicas_short, unconfirmed


def produce(context: BrokerContext, req: ProduceRequest) -> ProduceResponse:
    """One batch to one partition."""
    return _produce(context, ProduceBatchesRequest([req])).batches[0]


def produce_batches(context: BrokerContext, req: ProduceBatchesRequest) -> ProduceBatchesResponse:
    """Several partitions' batches; with ``end``, the Producer's commit."""
    if (why := acks_refusal(req)) is not None:
        refused = ProduceResponse(KafkaError.INVALID_REQUIRED_ACKS, error_message=why)
        return ProduceBatchesResponse([refused] * len(req.batches))
    if req.acks == ACKS_ALL and (short := _replicas_short(context, req)) is not None:
        if req.end is not None:
            raise not_enough(short)
        return _answered_all(req, KafkaError.NOT_ENOUGH_REPLICAS, short.describe())
    if req.end is not None:
        return produce_and_end_txn(context, req)
    return _produce(context, req)


def _replicas_short(context: BrokerContext, req: ProduceBatchesRequest) -> Replicas | None:
    """Too few in-sync copies for this acks=all request: the synchronous standbys the
    server waits for, or its topics' min.insync.replicas (``log.insync``)."""
    copies = copies_needed(context.engine, {b.topic for b in req.batches})
    return replicas_short(context.engine, copies)


# The durability each weaker acks asks of the request's commit (Kafka's acks=1 waits for
# the leader's log only; acks=0 for nothing).
_SYNCHRONOUS_COMMIT = {
    ACKS_LEADER: "SET LOCAL synchronous_commit TO 'local'",
    ACKS_NONE: "SET LOCAL synchronous_commit TO 'off'",
}


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


@retry_conflicts
def _produce(context: BrokerContext, req: ProduceBatchesRequest) -> ProduceBatchesResponse:
    answered: ProduceBatchesResponse | None = None
    kind = strategy.request_kind(req)
    try:
        with lazy_transaction(context.engine) as conn:
            work = Work(context, conn, one_query=strategy.one_query(context, conn, req))
            if kind == "register" and work.one_query:
                answered = strategy.attempted(kind, on_remembered(conn, context, req))
                if answered is not None:
                    return answered
                work.one_query = False
            if req.acks != ACKS_ALL:
                conn.exec_driver_sql(_SYNCHRONOUS_COMMIT[req.acks])
            registered, batches = append_batches(work, req.batches, req.add)
            answered = ProduceBatchesResponse(batches, registered)
            if req.add is not None and registered is not None and not registered.error_code:
                _see_registered(work, req.add.transactional_id)
    except Exception as exc:
        if not unconfirmed(exc):
            raise
        return _unconfirmed(req, answered)
    for memory in work.seen.values():  # committed: the next request may decide on them
        remember_txn(conn, memory.xmin, memory.leased)
    if not work.one_query:
        strategy.locked(kind)
    return answered


def _see_registered(work: Work, transactional_id: str) -> None:
    """The id's row as the registration, written at once under its FOR UPDATE lock, leaves
    it: the request's next batches are admitted on it (docs/design.md §3.12)."""
    meta = work.loaded.get(transactional_id)
    if meta is not None:
        work.seen[transactional_id] = written_txn(work.conn, meta)


def _answered_all(req: ProduceBatchesRequest, code: int, message: str) -> ProduceBatchesResponse:
    """Every batch (and the registration, if asked) answered ``code``."""
    refused = ProduceResponse(code, error_message=message)
    registered = answer(req.add, code, message)
    return ProduceBatchesResponse([refused] * len(req.batches), registered)


def _unconfirmed(
    req: ProduceBatchesRequest, answered: ProduceBatchesResponse | None
) -> ProduceBatchesResponse:
    """The answer to a request committed on the primary whose standbys did not confirm
    it: each batch the commit took (all of them, when it committed before its answers
    were known: a query string that commits itself) NOT_ENOUGH_REPLICAS_AFTER_APPEND; the
    batches it refused keep their own answers."""
    code = KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND
    message = "written on the primary; the synchronous standbys did not confirm it in time"
    if answered is None:
        return _answered_all(req, code, message)
    after = ProduceResponse(code, error_message=message)
    batches = [b if b.error_code else after for b in answered.batches]
    registered = answered.registered
    if registered is not None and not registered.error_code:
        registered = answer(req.add, code, message)
    return ProduceBatchesResponse(batches, registered)
