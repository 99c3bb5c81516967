"""Which way a produce, a registration or a commit is written (docs/design.md §3.9): in one
query string checked by the versions of the rows this process remembers (``one_query``),
or under the locks in a DB transaction (``locked``). ``one_query`` is the one function
that decides it, before anything is read; a one-query write its rows then refuse (a
version moved) or decline (the decision needs the locks) falls back to the locks once.
Each choice and each fallback is counted (``kip98_broker_write_strategy_total``).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Literal, TypeVar

from sqlalchemy import Connection

from app.coordinator.guard import admitted_on_remembered
from app.coordinator.metadata import bumped_identity, end_retry_outcome
from app.coordinator.txn_log import remembered_txn
from app.log.append import on_remembered_rows
from app.log.partition_lock import remembered
from app.protocol import NO_PRODUCER_ID, ProduceBatchesRequest, ProduceRequest, TopicPartitionKey
from app.storage.context import BrokerContext
from app.storage.driver import in_transaction
from app.storage.one_query import Refused

log = logging.getLogger(__name__)

Request = Literal["produce", "register", "commit"]
REQUESTS: tuple[Request, ...] = ("produce", "register", "commit")
ONE_QUERY, LOCKED = "one_query", "locked"
STRATEGIES = (ONE_QUERY, LOCKED)
# sent: the request was written that way; refused: a one-query write its reads refused (a
# row moved), nothing written; declined: the decision on the remembered rows needed the
# locks (a refusal, a duplicate, a read of the database), nothing sent.
SENT, REFUSED, DECLINED = "sent", "refused", "declined"
OUTCOMES = (SENT, REFUSED, DECLINED)
METRIC = "kip98_broker_write_strategy"

T = TypeVar("T")

_counts: Counter[tuple[str, str, str]] = Counter()
_counting = threading.Lock()


def counts() -> dict[tuple[str, str, str], int]:
    """This process's writes so far, by (request, strategy, outcome)."""
    with _counting:
        return dict(_counts)


def _count(request: Request, strategy: str, outcome: str) -> None:
    with _counting:
        _counts[(request, strategy, outcome)] += 1


def request_kind(req: ProduceBatchesRequest) -> Request:
    """A commit carries ``end``; a registration ``add`` (KIP-890); else a produce."""
    if req.end is not None:
        return "commit"
    return "register" if req.add is not None else "produce"


def registered_already(
    conn: Connection, req: ProduceBatchesRequest
) -> ProduceBatchesRequest | None:
    """``req`` without its registration where that registers nothing: its id's remembered
    row holds every partition in the ongoing transaction of the same identity, and admits
    every batch (``guard.admitted_on_remembered``). Kafka's partition leader likewise asks
    the coordinator to add a partition only until its producer's transaction is open on
    it (KIP-890); Kafka 4's producers register with every batch. Written as a
    transactional produce, whose query string checks the id's row is still that version
    (docs/design.md §3.12): the check proves the partitions registered. Else None."""
    add = req.add
    if add is None or req.end is not None:
        return None
    memory = admitted_on_remembered(conn, add.transactional_id, req.batches)
    meta = None if memory is None else memory.leased.meta
    if meta is None or (add.producer_id, add.producer_epoch) != (
        meta.producer_id,
        meta.producer_epoch,
    ):
        return None
    if not set(add.partitions) <= set(meta.partitions):
        return None
    if any(b.transactional_id != add.transactional_id for b in req.batches):
        return None
    return replace(req, add=None)


def one_query(context: BrokerContext, conn: Connection, req: ProduceBatchesRequest) -> bool:
    """Whether ``req`` is first tried in one query string on the rows this process
    remembers; False sends it under the locks from the start. Only where nothing the
    one-query way cannot know is needed: no ACLs to read (``authorization``), no DB
    transaction open on ``conn`` (a request under a deadline begins its own at once),
    batches to carry the query string's end (its last COPY), each with a producer id, and
    every row the request decides on remembered: a commit's or a registration's
    transactional id and its partitions (a commit's markers' too), each last written by
    its producer, a
    produce's partitions, each last written by its producer in an epoch the row holds
    (else the issued epochs are read), and a transactional produce's id row taking every
    batch. A commit retried after it ended reads the batches it recorded, and one whose
    epoch bump spends the producer id's epochs allocates a new one: locked."""
    if context.settings.authorization or not req.batches:
        return False
    if conn.in_transaction() or in_transaction(conn):
        return False
    kind = request_kind(req)
    if kind == "produce":
        return _produce_eligible(conn, req.batches)
    named = req.end if req.end is not None else req.add
    assert named is not None
    tid = named.transactional_id
    if any(not (b.is_transactional and b.transactional_id == tid) for b in req.batches):
        return False
    memory = remembered_txn(conn, tid)
    meta = None if memory is None else memory.leased.meta
    if meta is None:
        return False
    touched: set[TopicPartitionKey] = {(b.topic, b.partition) for b in req.batches}
    if req.add is not None:
        touched |= set(req.add.partitions)
    if req.end is not None:
        end = req.end
        if end_retry_outcome(meta, end.producer_id, end.producer_epoch, end.committed):
            return False
        if end.bump_epoch and bumped_identity(meta.producer_id, meta.producer_epoch).needs_new_id:
            return False  # the epochs are spent: a new producer id is allocated
        touched |= set(meta.partitions)  # the markers' partitions too
    for tp in touched:
        hint = remembered(conn, tp)
        if hint is None or hint.row.s_producer_id != meta.producer_id:
            return False
    return True


def _produce_eligible(conn: Connection, batches: Sequence[ProduceRequest]) -> bool:
    if any(b.producer_id == NO_PRODUCER_ID for b in batches):
        return False
    tids = {b.transactional_id if b.is_transactional else None for b in batches}
    if len(tids) != 1:
        return False  # plain idempotent and transactional batches, or several ids
    [tid] = tids
    if tid is not None and admitted_on_remembered(conn, tid, batches) is None:
        return False
    return on_remembered_rows(conn, batches)


def attempted(request: Request, attempt: T | Refused | None) -> T | None:
    """Count a one-query write's outcome; its answer if it was sent, else None: the
    request then goes under the locks (``locked``)."""
    if attempt is None:
        _count(request, ONE_QUERY, DECLINED)
        return None
    if isinstance(attempt, Refused):
        _count(request, ONE_QUERY, REFUSED)
        log.debug("%s refused in one query (%s): taken under the locks", request, attempt.why)
        return None
    _count(request, ONE_QUERY, SENT)
    return attempt


def locked(request: Request) -> None:
    """Count a request written under the locks."""
    _count(request, LOCKED, SENT)
