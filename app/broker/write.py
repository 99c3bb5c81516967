"""One way down for every produce, registration (KIP-890's implicit add) and commit
(docs/design.md §3.9): ``strategy.one_query`` chooses, before anything is read, whether
the request is first tried in one query string on the rows this process remembers
(``batches.on_remembered`` for a produce, ``commit_remembered.on_remembered`` for a
registration or a commit; a registration of partitions the transaction holds already is
tried as a produce, ``strategy.registered_already``). Else, or if that is refused or declined, it is written under
the locks by this module's executor (``under_locks``): one DB transaction that reads under
the locks, decides the whole request into one ``Plan`` (``batches.append_batches``; a
commit ``commit.decide_under_locks``), sends it, commits, and then remembers the rows it
left (``Work.remember``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection

from app.broker import batches, commit, commit_remembered, strategy
from app.broker.commit_decision import answer
from app.broker.work import Plan, Work
from app.coordinator.txn_log import (
    Leased,
    RememberedTxn,
    TransitionBatch,
    txn_lease_read,
    txn_version_read,
)
from app.errors import KafkaError
from app.faults import crash_point
from app.log.append import copy_rows
from app.log.partition_lock import versions_read
from app.protocol import (
    ACKS_ALL,
    ACKS_LEADER,
    ACKS_NONE,
    ProduceBatchesRequest,
    ProduceBatchesResponse,
    ProduceResponse,
)
from app.storage.context import BrokerContext
from app.storage.driver import WriteBehind
from app.storage.engine import lazy_transaction, retry_conflicts
from app.storage.one_query import Refused
from app.storage.replication import unconfirmed

OnRemembered = Callable[
    [Connection, BrokerContext, ProduceBatchesRequest], ProduceBatchesResponse | Refused | None
]
_ON_REMEMBERED: dict[strategy.Request, OnRemembered] = {
    "produce": batches.on_remembered,
    "register": commit_remembered.on_remembered,
    "commit": commit_remembered.on_remembered,
}

# The durability each weaker acks asks of the request's commit (Kafka's acks=1 waits for
# the leader's log only; acks=0 for nothing).
_SYNCHRONOUS_COMMIT = {
    ACKS_LEADER: "SET LOCAL synchronous_commit TO 'local'",
    ACKS_NONE: "SET LOCAL synchronous_commit TO 'off'",
}


@retry_conflicts
def write(context: BrokerContext, req: ProduceBatchesRequest) -> ProduceBatchesResponse:
    """``req`` written one way or the other; a commit the standbys did not confirm
    (rule 41) raises, as a lost connection does, for the client to retry it; a produce's
    or a registration's batches are answered NOT_ENOUGH_REPLICAS_AFTER_APPEND."""
    kind = strategy.request_kind(req)
    answered: ProduceBatchesResponse | None = None
    try:
        with lazy_transaction(context.engine) as conn:
            tried = strategy.registered_already(conn, req) or req
            if strategy.one_query(context, conn, tried):
                attempt = _ON_REMEMBERED[strategy.request_kind(tried)](conn, context, tried)
                answered = strategy.attempted(kind, attempt)
                if answered is not None:
                    if tried is not req:  # registered already: the registration's answer
                        registered = answer(req.add, KafkaError.NO_ERROR)
                        return ProduceBatchesResponse(answered.batches, registered)
                    return answered
            work, answered = under_locks(context, conn, req)
    except Exception as exc:
        if kind == "commit" or not unconfirmed(exc):
            raise
        return _unconfirmed(req, answered)
    work.remember()
    strategy.locked(kind)
    return answered


def under_locks(
    context: BrokerContext, conn: Connection, req: ProduceBatchesRequest
) -> tuple[Work, ProduceBatchesResponse]:
    """The lock's executor: the request in ``conn``'s DB transaction, its rows read under
    their locks, decided into one ``Plan`` (nothing written yet), the plan sent with the
    reads of the versions it leaves its rows at; not yet committed (the caller commits,
    then ``Work.remember``)."""
    if req.acks != ACKS_ALL:
        conn.exec_driver_sql(_SYNCHRONOUS_COMMIT[req.acks])
    work = Work(context, conn, transitions=TransitionBatch(), writes=WriteBehind(), copies=[])
    if strategy.request_kind(req) == "commit":
        assert req.end is not None
        response, ended = commit.decide_under_locks(work, req)
        plan = work.plan(response)
        if ended is None:
            _send(conn, plan, [])
        else:
            [[(version,)]] = _send(conn, plan, [txn_version_read(req.end.transactional_id)])
            work.leave(str(version), Leased(ended.left, ended.coordinator_epoch), ended.written())
        crash_point("commit_request.before_commit")  # every write done, none committed
        return work, response
    registered, answers = batches.append_batches(work, req.batches, req.add)
    plan = work.plan(ProduceBatchesResponse(answers, registered))
    reads = [versions_read(work.appended)] if work.appended else []
    # The id's row as a registration leaves it (written under its FOR UPDATE lock,
    # docs/design.md §3.12).
    meta = None
    if req.add is not None and registered is not None and not registered.error_code:
        meta = work.loaded.get(req.add.transactional_id)
    if meta is not None:
        reads.append(txn_lease_read(meta.transactional_id))
    found = _send(conn, plan, reads)
    if work.appended:
        versions = {(t, p): str(v) for t, p, v in found[0]}
        work.left.update((tp, (versions[tp], row)) for tp, row in work.appended.items())
    if meta is not None:
        [(version, lease_epoch)] = found[-1]
        work.seen[meta.transactional_id] = RememberedTxn(
            str(version), Leased(meta, int(lease_epoch))
        )
    return work, plan.response


def _send(
    conn: Connection, plan: Plan, reads: list[tuple[str, dict[str, Any]]]
) -> list[list[tuple[Any, ...]]]:
    """A plan decided under the locks, sent in the DB transaction holding them: its
    writes pipelined with ``reads`` after them (each one's rows returned), then its
    COPYs."""
    writes = WriteBehind()
    for statement, params in plan.writes:
        writes.add(statement, params)
    found = writes.send_reading(conn, reads)
    if plan.copies:
        copy_rows(conn, plan.copies)
    return found


def answered_all(req: ProduceBatchesRequest, code: int, message: str) -> ProduceBatchesResponse:
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
        return answered_all(req, code, message)
    after = ProduceResponse(code, error_message=message)
    batches_ = [b if b.error_code else after for b in answered.batches]
    registered = answered.registered
    if registered is not None and not registered.error_code:
        registered = answer(req.add, code, message)
    return ProduceBatchesResponse(batches_, registered)
