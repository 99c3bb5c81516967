"""The Kafka APIs the server answers, each mapped onto the broker's requests.

One function per API key: it reads kio's request entity of whatever version came in,
sends ``app.protocol`` requests to ``Broker.handle`` (the same handlers the native client
uses), and describes the response as plain values for ``codec.build``. The admin APIs'
functions are in ``topic_apis``, ``acl_apis`` and ``txn_apis``. ``APIS`` is exactly what
is advertised by ApiVersions: the versions implemented and tested.

"""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from typing import Any

from app.broker import Broker
from app.broker.endpoint import answer_by
from app.errors import KafkaError, KafkaException
from app.protocol import (
    BATCHES_WINDOW_FACTOR,
    COORDINATOR_GROUP,
    READ_COMMITTED,
    RECORD_OVERHEAD_BYTES,
    TOPIC,
    AbortedTransaction,
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    DescribeTransactionsRequest,
    EndTxnRequest,
    EpochQuery,
    FetchRequest,
    FetchResponse,
    FindCoordinatorRequest,
    InitProducerIdRequest,
    ListOffsetsRequest,
    MetadataRequest,
    OffsetAndMetadata,
    OffsetCommitRequest,
    OffsetForLeaderEpochRequest,
    ProduceBatchesRequest,
    ProduceRequest,
    ProduceResponse,
    TxnOffsetCommitRequest,
)
from app.server import acl_apis, features, topic_apis, txn_apis, txn_verify, user_apis
from app.server.answer import NO_OPERATIONS, Handler, Pending
from app.server.cluster_apis import (
    authorized_operations,
    cluster_operations,
    cluster_view,
    describe_cluster,
)
from app.server.groups import (
    consumer_group_describe,
    consumer_group_heartbeat,
    delete_groups,
    describe_groups,
    heartbeat,
    join_group,
    leave_group,
    list_groups,
    offset_delete,
    offset_fetch,
    sync_group,
)
from app.server.node import Node
from app.server.records import Served, encode_batches, produce_request
from app.server.sasl import sasl_authenticate, sasl_handshake


def api_versions(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    """The APIs served, and from v3 the feature levels (``features``)."""
    keys = [
        {"api_key": key, "min_version": low, "max_version": high}
        for key, (low, high, _) in sorted(APIS.items())
    ]
    levels = features.api_versions_features(
        features.features_of(broker.settings.features), request.__version__
    )
    return {"error_code": 0, "api_keys": keys, **levels}


def metadata(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    """Before v4 a request cannot say whether it allows auto-creation: Kafka takes it as
    allowed. From v10 a topic may be asked for by id (its name null): an id no topic has
    is UNKNOWN_TOPIC_ID. The brokers are the live nodes, each partition's leader among them
    (``cluster_apis``)."""
    asked = request.topics
    names = None if asked is None else [t.name for t in asked]
    unknown_ids: list[uuid.UUID] = []
    if names is not None and None in names:
        known = topic_apis.topics_by_id(broker)
        names = [t.name if t.name is not None else known.get(t.topic_id) for t in asked]
        unknown_ids = [t.topic_id for t in asked if t.name is None and t.topic_id not in known]
        names = [n for n in names if n is not None]
    # The live nodes before the epochs: a change of them commits its epochs' bumps with
    # it, so a leader placed here is never newer than the epoch read after (rule 40).
    view = cluster_view(broker, node)
    allow = getattr(request, "allow_auto_topic_creation", True)
    found = broker.handle(MetadataRequest(names, allow_auto_topic_creation=allow)).topics
    topics: list[dict[str, Any]] = [
        {"error_code": KafkaError.UNKNOWN_TOPIC_ID, "topic_id": topic_id, "partitions": [],
         "name": None if request.__version__ >= 12 else "", "is_internal": False}
        for topic_id in unknown_ids
    ]  # fmt: skip
    # KIP-430: the authorized operations of each topic found, and (v8 to v10) of the
    # cluster, when asked.
    operations: dict[str, int] = {}
    if getattr(request, "include_topic_authorized_operations", False):
        found_names = [t.topic for t in found if t.error_code == KafkaError.NO_ERROR]
        operations = authorized_operations(broker, TOPIC, found_names)
    for t in found:
        topics.append(
            {"error_code": t.error_code, "name": t.topic,
             "partitions": view.partitions(t.topic, t.leader_epochs),
             "topic_id": _uuid(t.topic_id), "is_internal": False,
             "topic_authorized_operations": operations.get(t.topic, NO_OPERATIONS)}
        )  # fmt: skip
    asked_cluster = getattr(request, "include_cluster_authorized_operations", False)
    return {
        "brokers": view.brokers(), "cluster_id": node.cluster_id,
        "controller_id": view.controller_id, "topics": topics,
        "cluster_authorized_operations": cluster_operations(broker, asked_cluster),
    }  # fmt: skip


def produce(broker: Broker, node: Node, request: Any) -> dict[str, Any] | None:
    """All partitions of the request in one DB transaction, each answered on its own.
    acks=0 gets no response, as Kafka gives none. From v12 (KIP-890's transaction version
    2) a transactional batch adds its partition to the transaction (``implicit_add``)."""
    batches: list[ProduceRequest] = []
    refused: dict[tuple[str, int], ProduceResponse] = {}
    order: list[tuple[str, int]] = []
    for topic in request.topic_data:
        for part in topic.partition_data:
            tp = (topic.name, part.index)
            order.append(tp)
            try:
                batches.append(
                    produce_request(topic.name, part.index, part.records, request.transactional_id)
                )
            except KafkaException as exc:
                refused[tp] = ProduceResponse(exc.error.code(), error_message=exc.error.str())
    if request.transactional_id is None and any(b.is_transactional for b in batches):
        # Kafka authorizes a request holding transactional batches on its transactional
        # id before anything else: without one, every partition is refused, nothing written.
        why = "transactional records in a produce request without a transactional id"
        unauthorized = ProduceResponse(
            KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, error_message=why
        )
        batches, refused = [], dict.fromkeys(order, unauthorized)
    answers = dict(refused)
    if batches:
        # acks=all: the commit's wait for the standbys ends within the request's timeout,
        # answered NOT_ENOUGH_REPLICAS_AFTER_APPEND (docs/design.md rule 41).
        timeout = request.timeout.total_seconds()
        by = time.monotonic() + timeout if request.acks == -1 and timeout > 0 else None
        add = implicit_add(batches, request.transactional_id, request.__version__)
        with answer_by(by):
            response = broker.handle(ProduceBatchesRequest(batches, add=add, acks=request.acks))
        for batch, answer in zip(batches, response.batches, strict=True):
            answer = _kafka_txn_code(answer, batch, add is not None, request.__version__)
            answers[(batch.topic, batch.partition)] = answer
    if request.acks == 0:
        return None
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for topic, partition in order:
        a = answers[(topic, partition)]
        by_topic.setdefault(topic, []).append(
            {"index": partition, "error_code": a.error_code, "base_offset": a.base_offset,
             "log_append_time": None if a.log_append_time < 0 else a.log_append_time,
             "log_start_offset": a.log_start_offset,
             "record_errors": [{"batch_index": i, "batch_index_error_message": m}
                               for i, m in a.record_errors],
             "error_message": a.error_message}
        )  # fmt: skip
    responses = [{"name": t, "partition_responses": p} for t, p in by_topic.items()]
    return {"responses": responses}


def _kafka_txn_code(
    answer: ProduceResponse, batch: ProduceRequest, added: bool, version: int
) -> ProduceResponse:
    """A transactional batch's refusal as Kafka's partition leader words it: its
    coordinator's PRODUCER_FENCED as INVALID_PRODUCER_EPOCH (what producers expect of a
    batch), and from v11 (KIP-1050) a partition outside the transaction as
    TRANSACTION_ABORTABLE, which the client may abort and go on after."""
    code = answer.error_code
    if added and code == KafkaError.PRODUCER_FENCED:
        return replace(answer, error_code=KafkaError.INVALID_PRODUCER_EPOCH)
    if batch.is_transactional and version >= 11 and code == KafkaError.INVALID_TXN_STATE:
        return replace(answer, error_code=KafkaError.TRANSACTION_ABORTABLE)
    return answer


def implicit_add(
    batches: list[ProduceRequest], transactional_id: str | None, version: int
) -> AddPartitionsToTxnRequest | None:
    """KIP-890's implicit AddPartitionsToTxn of a Produce v12+ (docs/design.md rule 64): the
    partitions of its transactional batches, registered in the produce's DB transaction as
    the native client's are, under the first such batch's producer id and epoch (each batch
    is checked against the transaction after). None before v12, where AddPartitionsToTxn
    comes first, or with no transactional batch."""
    if version < TV2_PRODUCE or transactional_id is None:
        return None
    txn = [b for b in batches if b.is_transactional]
    if not txn:
        return None
    partitions = sorted({(b.topic, b.partition) for b in txn})
    first = txn[0]
    return AddPartitionsToTxnRequest(
        transactional_id, first.producer_id, first.producer_epoch, partitions
    )


def fetch(broker: Broker, node: Node, request: Any) -> dict[str, Any] | Pending:
    """Each partition's batches as written, markers included; read_committed stops at the
    LSO and lists the aborted transactions, so clients filter as they do with Kafka.
    Short of ``min_bytes`` with ``max_wait`` left, the answer is ``Pending``: the listener
    looks again after a pause, holding no worker while it waits."""
    return _fetch_pass(broker, request, time.monotonic() + request.max_wait.total_seconds(), 0.005)


def _fetch_pass(
    broker: Broker, request: Any, deadline: float, pause: float
) -> dict[str, Any] | Pending:
    left = request.max_bytes
    responses, total = [], 0
    for topic in request.topics:
        partitions = []
        for part in topic.partitions:
            first = FetchRequest(
                topic.topic, part.partition, part.fetch_offset,
                max_bytes=max(1, min(part.partition_max_bytes, left)),
                isolation_level=request.isolation_level, min_one_record=total == 0, batches=True,
                current_leader_epoch=getattr(part, "current_leader_epoch", -1),
            )  # fmt: skip
            answer, records, aborted = _read(broker, first)
            total += len(records)
            left = max(0, left - len(records))
            partitions.append(_fetched(part.partition, answer, records, aborted))
        responses.append({"topic": topic.topic, "partitions": partitions})
    if total >= request.min_bytes or time.monotonic() + pause > deadline:
        return {"error_code": 0, "session_id": 0, "responses": responses}
    return Pending(pause, lambda: _fetch_pass(broker, request, deadline, min(pause * 2, 0.1)))


def _read(
    broker: Broker, first: FetchRequest
) -> tuple[FetchResponse, bytes, list[AbortedTransaction] | None]:
    """One partition's part of a fetch: reads of the log from ``first`` until its
    ``max_bytes`` are filled or what may be read is read. A Kafka client keeps one fetch in
    flight per broker, so the answer should fill max_bytes; each read costs a round trip
    and a look at the partition, so after the first (``fetch_max_records`` offsets) the
    next spans as many offsets as the bytes left will hold by the bytes per offset read so
    far (each counted with the log's record overhead, so it fits whole: a read cut at
    max_bytes pays a running sum up to the cut, dear over thousands of rows), and the last
    ``fetch_max_records`` again, cut where the bytes end. The answer is the last read's
    (its high watermark, LSO and log start); the aborted transactions are every read's."""
    committed = first.isolation_level == READ_COMMITTED
    out = bytearray()
    aborted: dict[tuple[int, int], AbortedTransaction] = {}
    answer, read_request = None, first
    window = cap = broker.settings.fetch_max_records
    widest = cap * BATCHES_WINDOW_FACTOR
    while True:
        read = broker.handle(read_request)
        if read.error_code != KafkaError.NO_ERROR and answer is not None:
            break  # what was read stands; the next fetch meets the error
        answer = read
        for a in read.aborted_transactions:
            aborted[(a.producer_id, a.first_offset)] = a
        out += encode_batches(read.log_records, _served(read))
        readable = read.last_stable_offset if committed else read.high_watermark
        # A whole read ends ``window`` offsets on; one that ends sooner met the end of what
        # may be read or was cut by max_bytes.
        offset = read_request.fetch_offset
        if read.error_code or read.next_offset >= readable or read.next_offset < offset + window:
            break
        left = max(1, first.max_bytes - len(out))
        if out:
            spanned = read.next_offset - first.fetch_offset
            fits = left * spanned // (len(out) + RECORD_OVERHEAD_BYTES * spanned)
            window = min(widest, fits) if fits > cap else cap
        read_request = replace(
            first,
            fetch_offset=read.next_offset,
            max_bytes=left,
            max_records=window,
            min_one_record=False,
        )
    return answer, bytes(out), list(aborted.values()) if committed else None


def _served(read: FetchResponse) -> Served:
    return Served(
        read.log_append_time, read.compression_type, read.leader_epoch, read.epochs,
        read.epoch_starts,
    )  # fmt: skip


def _fetched(
    partition: int,
    answer: FetchResponse,
    records: bytes,
    aborted: list[AbortedTransaction] | None,
) -> dict[str, Any]:
    listed = None
    if aborted is not None:
        listed = [{"producer_id": a.producer_id, "first_offset": a.first_offset} for a in aborted]
    if answer.error_code:  # as Kafka answers a partition's error: no bounds
        answer = replace(answer, high_watermark=-1, last_stable_offset=-1, log_start_offset=-1)
    return {
        "partition_index": partition, "error_code": answer.error_code,
        "high_watermark": answer.high_watermark, "last_stable_offset": answer.last_stable_offset,
        "log_start_offset": answer.log_start_offset, "aborted_transactions": listed,
        "preferred_read_replica": -1, "records": records,
    }  # fmt: skip


def list_offsets(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    isolation = getattr(request, "isolation_level", 0)
    topics = []
    for topic in request.topics:
        partitions = []
        for part in topic.partitions:
            a = broker.handle(
                ListOffsetsRequest(
                    topic.name, part.partition_index, part.timestamp, isolation,
                    getattr(part, "current_leader_epoch", -1),
                )
            )  # fmt: skip
            partitions.append(
                {"partition_index": part.partition_index, "error_code": a.error_code,
                 "timestamp": a.timestamp, "offset": a.offset, "leader_epoch": a.leader_epoch}
            )  # fmt: skip
        topics.append({"name": topic.name, "partitions": partitions})
    return {"topics": topics}


def offset_for_leader_epoch(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    """A consumer's question (KIP-320): where each epoch it read in ended. Its replica id
    is a consumer's (-1, or -2 unset); a follower's fetching is PostgreSQL's, not this."""
    queries = [
        EpochQuery(t.topic, p.partition, p.leader_epoch, p.current_leader_epoch)
        for t in request.topics
        for p in t.partitions
    ]
    answers = broker.handle(OffsetForLeaderEpochRequest(queries)).results
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for a in answers:
        by_topic.setdefault(a.topic, []).append(
            {"error_code": a.error_code, "partition": a.partition,
             "leader_epoch": a.leader_epoch, "end_offset": a.end_offset}
        )  # fmt: skip
    return {"topics": [{"topic": t, "partitions": p} for t, p in by_topic.items()]}


def find_coordinator(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    """Each key's coordinator among the live nodes (``cluster_apis``); v4 asks for several
    keys at once. Any node serves any group or transactional id, so a client that asks
    the wrong one is answered all the same."""
    key_type = getattr(request, "key_type", COORDINATOR_GROUP)
    view = None

    def one(key: str) -> dict[str, Any]:
        nonlocal view
        a = broker.handle(FindCoordinatorRequest(key, key_type))
        if a.error_code != KafkaError.NO_ERROR:
            return {"key": key, "error_code": a.error_code, "error_message": a.error_message,
                    "node_id": -1, "host": "", "port": -1}  # fmt: skip
        view = view or cluster_view(broker, node)
        node_id, endpoint = view.coordinator(key_type, key)
        return {"key": key, "error_code": 0, "node_id": node_id, "host": endpoint.host,
                "port": endpoint.port}  # fmt: skip

    if request.__version__ >= 4:
        return {"coordinators": [one(key) for key in request.coordinator_keys]}
    return one(request.key)


def init_producer_id(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    a = broker.handle(
        InitProducerIdRequest(
            request.transactional_id,
            int(request.transaction_timeout.total_seconds() * 1000),
            getattr(request, "producer_id", -1),
            getattr(request, "producer_epoch", -1),
        )
    )
    return {"error_code": a.error_code, "producer_id": a.producer_id,
            "producer_epoch": a.producer_epoch}  # fmt: skip


def add_partitions_to_txn(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    """A client's AddPartitionsToTxn (v0-3), or from v4 a partition leader's: several
    transactions, each added or (``verify_only``) checked, answered each on its own, for
    a caller allowed ClusterAction on the cluster, as Kafka's broker checks
    (``txn_verify``)."""
    if request.__version__ < BROKER_ADD_PARTITIONS:
        tid, pid = request.v3_and_below_transactional_id, request.v3_and_below_producer_id
        epoch, topics = request.v3_and_below_producer_epoch, request.v3_and_below_topics
        wanted = [(t.name, p) for t in topics for p in t.partitions]
        a = broker.handle(AddPartitionsToTxnRequest(tid, pid, epoch, wanted))
        codes = {tp: a.results.get(tp, a.error_code) for tp in wanted}
        return {"results_by_topic_v3_and_below": txn_verify.topic_results(codes)}
    if not cluster_operations(broker, True) & txn_verify.CLUSTER_ACTION_BIT:
        return {"error_code": KafkaError.CLUSTER_AUTHORIZATION_FAILED, "results_by_transaction": []}
    results = []
    for t in request.transactions:
        wanted = [(topic.name, p) for topic in t.topics for p in topic.partitions]
        if t.verify_only:
            found = broker.handle(DescribeTransactionsRequest([t.transactional_id]))
            codes = txn_verify.verified(
                found.transaction_states[0], t.producer_id, t.producer_epoch, wanted
            )
        else:
            a = broker.handle(
                AddPartitionsToTxnRequest(
                    t.transactional_id, t.producer_id, t.producer_epoch, wanted
                )
            )
            codes = {tp: a.results.get(tp, a.error_code) for tp in wanted}
        results.append(
            {"transactional_id": t.transactional_id,
             "topic_results": txn_verify.topic_results(codes)}
        )  # fmt: skip
    return {"error_code": 0, "results_by_transaction": results}


def add_offsets_to_txn(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    a = broker.handle(
        AddOffsetsToTxnRequest(
            request.transactional_id, request.producer_id, request.producer_epoch,
            request.group_id,
        )
    )  # fmt: skip
    return {"error_code": a.error_code}


def end_txn(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    """From v5 (KIP-890's transaction version 2) the end bumps the epoch and the answer
    carries the identity to use next: a new producer id once the epochs are spent. Before
    v5 the client keeps its epoch (docs/design.md rule 64)."""
    tv2 = request.__version__ >= TV2_END_TXN
    a = broker.handle(
        EndTxnRequest(
            request.transactional_id, request.producer_id, request.producer_epoch,
            request.committed, bump_epoch=tv2, after_abort_is_retry=tv2,
        )
    )  # fmt: skip
    if a.error_code:  # as Kafka answers a refusal: no identity
        return {"error_code": a.error_code}
    return {"error_code": 0, "producer_id": a.producer_id, "producer_epoch": a.producer_epoch}


def txn_offset_commit(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    """From v5 (KIP-890's transaction version 2) the commit adds the group's offsets to the
    transaction itself: no AddOffsetsToTxn before it."""
    offsets = _offsets(request.topics)
    a = broker.handle(
        TxnOffsetCommitRequest(
            request.transactional_id, request.group_id, request.producer_id,
            request.producer_epoch, offsets, getattr(request, "generation_id", -1),
            getattr(request, "member_id", ""),
            add_offsets=request.__version__ >= TV2_TXN_OFFSET_COMMIT,
            group_instance_id=getattr(request, "group_instance_id", None),
        )
    )  # fmt: skip
    return {"topics": _partition_codes(offsets, a.results, a.error_code)}


def offset_commit(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    """From v10 topics travel by id (KIP-848's follow-up): a topic id no topic has answers
    UNKNOWN_TOPIC_ID on each of its partitions and never reaches the group (nothing left:
    the group is not asked), the others are committed by name, as Kafka 4.4 does."""
    if request.__version__ < 10:
        return {"topics": _committed(broker, request, _offsets(request.topics))}
    names = topic_apis.topics_by_id(broker)
    known = [t for t in request.topics if t.topic_id in names]
    offsets = _offsets(known, names)
    codes = {t["name"]: t["partitions"] for t in _committed(broker, request, offsets)}
    answered: list[dict[str, Any]] = []
    for t in request.topics:
        name = names.get(t.topic_id)
        if name is None:
            partitions = [{"partition_index": p.partition_index,
                           "error_code": KafkaError.UNKNOWN_TOPIC_ID} for p in t.partitions]  # fmt: skip
        else:
            partitions = codes.pop(name, [])
        if partitions:
            answered.append({"topic_id": t.topic_id, "partitions": partitions})
    return {"topics": answered}


def _committed(
    broker: Broker, request: Any, offsets: dict[tuple[str, int], OffsetAndMetadata]
) -> list[dict[str, Any]]:
    """The group's answer to an OffsetCommit of ``offsets``, topics by name."""
    if not offsets and request.__version__ >= 10:
        return []
    generation = getattr(
        request, "generation_id_or_member_epoch", getattr(request, "generation_id", -1)
    )
    instance = getattr(request, "group_instance_id", None)
    a = broker.handle(
        OffsetCommitRequest(
            request.group_id, offsets, generation, request.member_id, instance,
            before_member_epochs=request.__version__ < 9,
        )
    )  # fmt: skip
    return _partition_codes(offsets, a.results, a.error_code)


def _offsets(
    topics: Any, names: dict[uuid.UUID, str] | None = None
) -> dict[tuple[str, int], OffsetAndMetadata]:
    """The offsets of a commit's topics, by name (``names``: by topic id, from v10)."""
    return {
        (t.name if names is None else names[t.topic_id], p.partition_index): OffsetAndMetadata(
            p.committed_offset, p.committed_metadata, getattr(p, "committed_leader_epoch", -1)
        )
        for t in topics
        for p in t.partitions
    }


def _partition_codes(
    offsets: dict[tuple[str, int], OffsetAndMetadata],
    results: dict[tuple[str, int], int],
    code: int,
) -> list[dict[str, Any]]:
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for topic, partition in offsets:
        by_topic.setdefault(topic, []).append(
            {"partition_index": partition, "error_code": results.get((topic, partition), code)}
        )
    return [{"name": t, "partitions": p} for t, p in by_topic.items()]


def _uuid(text: str | None) -> uuid.UUID | None:
    return None if text is None else uuid.UUID(text)


# The first versions of KIP-890's transaction version 2 (docs/design.md rule 64): Produce
# adds its partitions, EndTxn bumps the epoch, TxnOffsetCommit adds the group's offsets.
# Kafka's clients send them only with ``transaction.version`` 2 finalized (``features``).
TV2_PRODUCE, TV2_END_TXN, TV2_TXN_OFFSET_COMMIT = 12, 5, 5
# From this version AddPartitionsToTxn is a partition leader's, batched by transaction.
BROKER_ADD_PARTITIONS = 4

# api key -> (lowest version, highest version, handler): what ApiVersions advertises.
APIS: dict[int, tuple[int, int, Handler]] = {
    0:  (3, 12, produce),  # v12: KIP-890's implicit AddPartitionsToTxn
    1:  (4, 12, fetch),
    2:  (1, 7, list_offsets),
    3:  (1, 12, metadata),
    8:  (2, 10, offset_commit),  # v9: a KIP-848 member's epoch; v10: topics by id
    9:  (1, 10, offset_fetch),  # v8: several groups; v9: a member's epoch; v10: topic ids
    10: (0, 4, find_coordinator),
    11: (0, 9, join_group),
    12: (0, 4, heartbeat),
    13: (0, 5, leave_group),
    14: (0, 5, sync_group),
    15: (0, 5, describe_groups),
    16: (0, 5, list_groups),
    17: (0, 1, sasl_handshake),  # v0: the tokens follow as bare frames (sasl.sasl_token)
    18: (0, 4, api_versions),
    19: (2, 7, topic_apis.create_topics),
    20: (1, 6, topic_apis.delete_topics),
    21: (0, 2, topic_apis.delete_records),
    22: (0, 5, init_producer_id),
    23: (2, 4, offset_for_leader_epoch),
    24: (0, 5, add_partitions_to_txn),  # v4: a partition leader's, several transactions
    25: (0, 4, add_offsets_to_txn),
    26: (0, 5, end_txn),  # v5: KIP-890's epoch bump per transaction
    27: (1, 1, txn_apis.write_txn_markers),  # v2's transaction_version: markers of KIP-890
    28: (0, 5, txn_offset_commit),  # v5: KIP-890's implicit AddOffsetsToTxn
    29: (1, 3, acl_apis.describe_acls),
    30: (1, 3, acl_apis.create_acls),
    31: (1, 3, acl_apis.delete_acls),
    32: (1, 4, topic_apis.describe_configs),
    33: (0, 2, topic_apis.alter_configs),
    36: (0, 2, sasl_authenticate),
    37: (0, 3, topic_apis.create_partitions),
    42: (0, 2, delete_groups),
    44: (0, 1, topic_apis.incremental_alter_configs),
    47: (0, 0, offset_delete),
    50: (0, 0, user_apis.describe_user_scram_credentials),
    51: (0, 0, user_apis.alter_user_scram_credentials),
    60: (0, 1, describe_cluster),
    61: (0, 0, txn_apis.describe_producers),
    65: (0, 0, txn_apis.describe_transactions),
    66: (0, 1, txn_apis.list_transactions),
    68: (0, 1, consumer_group_heartbeat),  # KIP-848; UNSUPPORTED_VERSION at group.version 0
    69: (0, 1, consumer_group_describe),
}  # fmt: skip
API_VERSIONS_KEY = 18
