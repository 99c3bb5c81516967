"""A produce request's batches: admitted (ACLs, rule 6), registered with their
transaction when asked (KIP-890), appended by the log, in the request's DB transaction
(``append_batches``, the lock's way, also the combined commit's) or in one query string on
the rows the process remembers (``on_remembered``). ``broker.write`` runs them.
"""

from __future__ import annotations

from sqlalchemy import Connection

from app.broker.work import Work
from app.coordinator.guard import admitted_on_remembered, check_produce, load_for_produce
from app.coordinator.handlers import Registration, check_registration, record_registration
from app.coordinator.txn_log import share_version_query, version_matches
from app.errors import KafkaError, KafkaException
from app.log.append import append, append_one_query, check_request, keyless_refusal, refusal
from app.log.compacted import is_compacted
from app.log.copy_records import Columns
from app.protocol import (
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    ProduceBatchesRequest,
    ProduceBatchesResponse,
    ProduceRequest,
    ProduceResponse,
    TopicPartitionKey,
)
from app.security import needs
from app.security.authorizer import authorize_all
from app.storage.context import BrokerContext
from app.storage.one_query import Check, Refused


def _shapes(
    conn: Connection, requests: list[ProduceRequest]
) -> tuple[dict[int, ProduceResponse], dict[int, Columns]]:
    """Each batch's columns, or its refusal for its shape (``check_request``) or for a
    record without a key on a compacted topic."""
    responses: dict[int, ProduceResponse] = {}
    columns: dict[int, Columns] = {}
    for i, batch in enumerate(requests):
        try:
            cols = check_request(batch)
        except KafkaException as exc:
            responses[i] = refusal(exc)
            continue
        # Only a batch with a record without a key asks whether its topic is compacted.
        if None in cols.keys and is_compacted(conn, batch.topic):
            responses[i] = keyless_refusal(batch, cols)
        else:
            columns[i] = cols
    return responses, columns


def on_remembered(
    conn: Connection, context: BrokerContext, req: ProduceBatchesRequest
) -> ProduceBatchesResponse | Refused | None:
    """A produce's batches decided on their remembered partition rows and written in one
    query string (``write``'s one-query way for a produce); None (declined) where a batch
    is refused for its shape; ``Refused`` where a row moved. Nothing written either way."""
    refused, columns = _shapes(conn, req.batches)
    if refused:
        return None
    work = Work(context, conn)
    appended = _append_one_query(work, req.batches, columns)
    if appended is None or isinstance(appended, Refused):
        return appended
    work.remember()
    return ProduceBatchesResponse(appended)


def append_batches(
    work: Work, requests: list[ProduceRequest], add: AddPartitionsToTxnRequest | None
) -> tuple[AddPartitionsToTxnResponse | None, list[ProduceResponse]]:
    """The batches (after registering ``add``) in ``work``'s DB transaction; each batch is
    decided and answered on its own, a refused one writing nothing."""
    responses, columns = _shapes(work.conn, requests)
    registered, registration = None, None
    if add is not None:
        registered, registration = _check_registration(work, add)
        if registration is None and registered.error_code != KafkaError.NO_ERROR:
            for i in columns:
                code = registered.results.get((requests[i].topic, requests[i].partition))
                if code is not None:
                    responses[i] = ProduceResponse(code, error_message=registered.error_message)
    admitted = {}
    for i in sorted(columns, key=lambda i: (requests[i].topic, requests[i].partition)):
        if i not in responses:
            try:
                admit(work, requests[i])
                admitted[i] = (requests[i], columns[i])
            except KafkaException as exc:
                responses[i] = refusal(exc)
    responses.update(append(work, admitted))
    if add is not None and registration is not None:
        refused = _refused_partitions(requests, responses, add.transactional_id)
        registered, work.loaded[add.transactional_id] = record_registration(
            work.conn, registration, refused, work.record
        )
    return registered, [responses[i] for i in range(len(requests))]


def _check_registration(
    work: Work, add: AddPartitionsToTxnRequest
) -> tuple[AddPartitionsToTxnResponse, Registration | None]:
    """The coordinator's answer to the registration, as a partition leader asks it in
    KIP-890. Unless refused, ``work`` then holds the transaction as registered, which its
    batches are checked against; the registration is recorded once they are decided."""
    existing = None if work.locked is None else set(work.locked.rows)
    answer, registration = check_registration(
        work.conn, work.context, add, work.loaded.get(add.transactional_id), existing
    )
    if registration is not None:
        work.loaded[add.transactional_id] = registration.planned
    return answer, registration


def _append_one_query(
    work: Work, requests: list[ProduceRequest], columns: dict[int, Columns]
) -> list[ProduceResponse] | Refused | None:
    """The request's batches on their remembered partition rows, in one query string
    (docs/design.md §3.9); a transactional request's admitted on its id's row as this
    process last wrote or read it, the query string's first statement taking that row
    FOR SHARE and checking it is still that version (§3.12, rule 53). ``Refused`` or
    None (declined), with nothing written and no DB transaction open, where the request
    must be decided under the locks."""
    admitted = {i: (r, columns[i]) for i, r in enumerate(requests)}
    tid = requests[0].transactional_id if requests[0].is_transactional else None
    guard = None
    if tid is not None:
        memory = admitted_on_remembered(work.conn, tid, requests)
        if memory is None:
            return None
        read = share_version_query(work.conn, tid)
        moved = "the transactional id's row moved"
        guard = Check(read, lambda found: version_matches(found, memory), moved)
    appended = append_one_query(work, admitted, guard)
    if appended is None or isinstance(appended, Refused):
        return appended
    return [appended[i] for i in range(len(requests))]


def admit(work: Work, req: ProduceRequest) -> None:
    """The checks before any partition is locked: the ACLs and, for a transactional batch,
    its transaction (rule 6). A transactional id's row is read once per request, FOR SHARE,
    for all its batches, with its version: the process remembers it once the request
    commits (``Work.seen``)."""
    authorize_all(work.conn, work.context, needs.produce(req.topic, req.transactional_id))
    if req.is_transactional:
        tid = req.transactional_id
        assert tid is not None
        if tid not in work.loaded:
            loaded = load_for_produce(work.conn, tid)
            work.loaded[tid] = None if loaded is None else loaded.leased.meta
            if loaded is not None:
                work.seen[tid] = loaded
        check_produce(work.loaded[tid], req)


def _refused_partitions(
    requests: list[ProduceRequest], responses: dict[int, ProduceResponse], transactional_id: str
) -> dict[TopicPartitionKey, int]:
    """The partitions where every batch of ``transactional_id`` in the request was refused,
    with the error of the first: the request must not register them (rule 6 the other way
    round: no partition in a transaction for a batch that is not in its log)."""
    accepted: set[TopicPartitionKey] = set()
    refused: dict[TopicPartitionKey, int] = {}
    for i, req in enumerate(requests):
        if not (req.is_transactional and req.transactional_id == transactional_id):
            continue
        tp = (req.topic, req.partition)
        if responses[i].error_code == KafkaError.NO_ERROR:
            accepted.add(tp)
        else:
            refused.setdefault(tp, responses[i].error_code)
    return {tp: code for tp, code in refused.items() if tp not in accepted}
