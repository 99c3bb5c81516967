"""Typed requests and responses, one pair per RPC of KIP-98's "RPC Protocol Summary".

Handlers take a request and return a response carrying a Kafka error code, never raising
for a protocol-level refusal: that keeps them callable unchanged from a wire-protocol front
end later. Field names are the KIP's.
"""

from __future__ import annotations

import base64
import binascii
import json
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from operator import itemgetter
from typing import Any, Final, Generic, NamedTuple, TypeVar

from app.errors import KafkaError, fail

R = TypeVar("R")


class Request(Generic[R]):
    """A request whose answer is an ``R``: ``Broker.handle`` is typed by it, and the RPC
    table (``app.broker.apis``) must name a handler for every subclass."""


NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1

READ_UNCOMMITTED = 0
READ_COMMITTED = 1

# ListOffsets sentinel timestamps (Kafka's ListOffsetsRequest).
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
# The record with the largest timestamp (KIP-734, ListOffsets v7).
MAX_TIMESTAMP = -3

# Kafka's acks: every write is durable before the answer (-1, "all"); durable on this
# server only (1); answered without waiting for durability (0).
ACKS_ALL = -1
ACKS_LEADER = 1
ACKS_NONE = 0

# Kafka's ControlRecordType.
CONTROL_ABORT = 0
CONTROL_COMMIT = 1


class RecordIn(NamedTuple):
    """One record of a produce batch; headers already encoded for storage."""

    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: list[dict[str, Any]] | None = None


# A produce batch's record as a plain tuple, in ``RecordIn``'s field order: what the
# Produce handler reads (it takes a batch apart column by column, never by name). The
# native Producer queues its records this way, because the garbage collector stops
# tracking a plain tuple of bytes and ints at its first look but keeps re-scanning a
# NamedTuple (any tuple subclass), which with many thousands of records queued made its
# full collections most of ``produce()``'s time. A ``RecordIn`` is one too.
RecordFields = tuple[bytes | None, bytes | None, int, list[dict[str, Any]] | None]


# One record as a fetch returns it (data records only: markers never reach clients):
# (offset, timestamp, key, value, headers, producer_id), with headers the stored JSON text
# (``encode_headers``' list), left for the client to decode when the application asks, as
# a Kafka broker leaves record headers to clients.
#
# A plain tuple on purpose, not a NamedTuple: psycopg builds plain tuples in C, and the
# garbage collector stops tracking a plain tuple of ints, bytes and strings after one look,
# where it keeps re-scanning tuple subclasses; with thousands of records buffered per
# partition, that difference was most of a consumer's time.
RecordOut = tuple[int, int, bytes | None, bytes | None, str | None, int]
# Field positions in a RecordOut.
RECORD_OFFSET: Final = 0
RECORD_TIMESTAMP: Final = 1
RECORD_KEY: Final = 2
RECORD_VALUE: Final = 3
RECORD_HEADERS: Final = 4
RECORD_PRODUCER_ID: Final = 5

# One record as stored (a fetch with ``batches``): (offset, timestamp, key, value, headers,
# batch_base_offset, batch). ``batch`` is what the record's batch was written with, given on
# the first record of each run of one batch in a fetch (None on the others, which share
# it): [producer_id, producer_epoch, sequence (the record's own), is_transactional,
# is_control, control_type, coordinator_epoch], the flags as 0 or 1. A batch's records
# have consecutive offsets from its base and a marker is a batch of its own, so bases
# never decrease along the log: a run ends where the base changes.
LogBatch = list[int | None]
LogRecord = tuple[int, int, bytes | None, bytes | None, str | None, int, LogBatch | None]
LOG_BATCH_BASE_OFFSET: Final = 5
LOG_BATCH: Final = 6

_key_of = itemgetter(RECORD_KEY)
_value_of = itemgetter(RECORD_VALUE)
_headers_of = itemgetter(RECORD_HEADERS)

# Kafka's sequences are int32 and wrap.
INT32_MAX = 2**31 - 1

# What one record costs beyond its key, value and headers, in every size the broker and
# the clients count (message.max.bytes, fetch.max.bytes, batch.size).
RECORD_OVERHEAD_BYTES = 24


def increment_sequence(sequence: int, increment: int) -> int:
    """Kafka's sequence arithmetic: sequences wrap from 2^31-1 to 0."""
    if sequence > INT32_MAX - increment:
        return increment - (INT32_MAX - sequence) - 1
    return sequence + increment


def record_size_bytes(
    key: bytes | None, value: bytes | None, headers: list[dict[str, Any]] | None
) -> int:
    """One record's size as produce counts it, for ``message.max.bytes`` checks."""
    size = RECORD_OVERHEAD_BYTES + len(key or b"") + len(value or b"")
    return size + len(json.dumps(headers)) if headers else size


def stored_headers(headers: Iterable[tuple[str, bytes | None]]) -> list[dict[str, str | None]]:
    """Headers as the log stores them: JSON-able, values base64-encoded, ``None`` kept as
    null. Base64 keeps arbitrary bytes intact through JSON while leaving the keys readable
    in SQL. Every front end writes this form (the native Producer, ``kip98 serve``)."""
    return [
        {"key": key, "value": None if value is None else base64.b64encode(value).decode("ascii")}
        for key, value in headers
    ]


def headers_of_stored(
    stored: str | bytes | Iterable[Mapping[str, Any]] | None,
) -> list[tuple[str, bytes | None]]:
    """The inverse of ``stored_headers``; also takes the JSON text a fetch returns.
    ValueError if ``stored`` is not that form."""
    entries: Any = json.loads(stored) if isinstance(stored, str | bytes) else stored
    if entries is None:
        return []
    result: list[tuple[str, bytes | None]] = []
    try:
        for entry in entries:
            raw = entry["value"]
            value = None if raw is None else base64.b64decode(raw, validate=True)
            result.append((str(entry["key"]), value))
    except (KeyError, TypeError, binascii.Error) as exc:
        raise ValueError(f"malformed stored headers: {exc}") from exc
    return result


def payload_bytes(records: list[RecordOut]) -> int:
    """The bytes a fetch counted for these records against max_bytes (the fetch statements'
    record size), summed in C (no loop in Python): what the consumer's fetch.max.bytes is
    charged for a partition's response."""
    keys = sum(map(len, filter(None, map(_key_of, records))))
    values = sum(map(len, filter(None, map(_value_of, records))))
    headers = sum(map(len, map(str.encode, filter(None, map(_headers_of, records)))))
    return RECORD_OVERHEAD_BYTES * len(records) + keys + values + headers


@dataclass(frozen=True)
class ProduceRequest(Request["ProduceResponse"]):
    topic: str
    partition: int
    records: Sequence[RecordFields]
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    base_sequence: int = NO_SEQUENCE
    transactional_id: str | None = None
    is_transactional: bool = False
    # The batch's size as a Kafka client sent it (its record batch, compressed if it was),
    # which message.max.bytes limits, as Kafka's brokers count it; None: the size of its
    # records as the native client counts them (record_size_bytes).
    size_bytes: int | None = None


@dataclass(frozen=True)
class ProduceResponse:
    error_code: int
    base_offset: int = -1
    log_start_offset: int = -1
    error_message: str | None = None
    # True when the batch was a retry of one already in the log (nothing was written).
    duplicate: bool = False
    # The time its records were stamped with, for a topic of message.timestamp.type
    # LogAppendTime; -1 otherwise (the producer's timestamps were kept).
    log_append_time: int = -1
    # KIP-467: the records that made the batch refused, (index in the batch, why).
    record_errors: tuple[tuple[int, str | None], ...] = ()


@dataclass(frozen=True)
class ProduceBatchesRequest(Request["ProduceBatchesResponse"]):
    """Kafka's ProduceRequest: one batch for each of several partitions, each answered on
    its own as if sent alone, all committed in one DB transaction.

    ``add``: KIP-890's implicit AddPartitionsToTxn, the transaction's partitions to
    register in that same DB transaction (a partition whose every batch is refused is left
    out). ``end``: kip98's combined commit, the EndTxn run after the batches when every one
    was accepted, so a Producer's commit with batches still unsent is one request.
    ``acks``: Kafka's, for plain producers: 1 commits without waiting for a standby, 0
    without waiting for the WAL flush (PostgreSQL's ``synchronous_commit`` local, off);
    idempotent and transactional batches need ``ACKS_ALL``, as in Kafka.
    """

    batches: list[ProduceRequest]
    add: AddPartitionsToTxnRequest | None = None
    end: EndTxnRequest | None = None
    acks: int = ACKS_ALL


@dataclass(frozen=True)
class ProduceBatchesResponse:
    """Each batch's answer, in request order; the registration's (None if there was none
    to make); EndTxn's (None if not asked; OPERATION_NOT_ATTEMPTED when a batch or the
    registration was refused)."""

    batches: list[ProduceResponse]
    registered: AddPartitionsToTxnResponse | None = None
    end: EndTxnResponse | None = None


@dataclass(frozen=True)
class MetadataRequest(Request["MetadataResponse"]):
    """Kafka's MetadataRequest, for what a client needs of it: the topics' partitions.
    ``topics`` None asks for every topic. ``allow_auto_topic_creation``: a topic asked for
    that does not exist is created (with the broker's num.partitions), if the broker
    allows it (KIP98_AUTO_CREATE_TOPICS) and the principal may create it."""

    topics: list[str] | None = None
    allow_auto_topic_creation: bool = False


@dataclass(frozen=True)
class TopicMetadata:
    error_code: int
    topic: str
    num_partitions: int = 0
    topic_id: str | None = None
    # Each partition's leader epoch, in partition order.
    leader_epochs: tuple[int, ...] = ()
    error_message: str | None = None


@dataclass(frozen=True)
class MetadataResponse:
    topics: list[TopicMetadata]


# How many times ``fetch_max_records`` the window of a fetch of batches may span when its
# caller asks: the cut at max_bytes bounds what it reads and returns.
BATCHES_WINDOW_FACTOR: Final = 8


@dataclass(frozen=True)
class FetchRequest(Request["FetchResponse"]):
    topic: str
    partition: int
    fetch_offset: int
    max_bytes: int = 1_048_576
    isolation_level: int = READ_COMMITTED
    # The window of offsets read, at most the broker's ``fetch_max_records`` (a fetch of
    # ``batches``, bounded by its bytes, up to BATCHES_WINDOW_FACTOR times it).
    max_records: int | None = None
    # Whether the first record comes back even when larger than max_bytes (Kafka's
    # minOneMessage): true but for the partitions of a consumer's fill after one that
    # returned records, which fetch.max.bytes may leave nothing for.
    min_one_record: bool = True
    # Kafka's view of the log (the wire protocol's): every record below the bound, markers
    # and aborted records included, with the fields of the batch each was written in, as
    # ``log_records``; clients skip markers and, in read_committed, filter by
    # ``aborted_transactions`` themselves.
    batches: bool = False
    # The leader epoch the client believes current (KIP-320; -1: not checked).
    current_leader_epoch: int = -1


@dataclass(frozen=True)
class AbortedTransaction:
    producer_id: int
    first_offset: int


def epoch_at(epochs: Sequence[int], starts: Sequence[int], offset: int) -> int:
    """The leader epoch a record at ``offset`` was written in: the last epoch begun at or
    before it (``epochs`` ascending, with the offsets they began at; none: epoch 0)."""
    if not epochs:
        return 0
    i = bisect_right(starts, offset)
    return epochs[max(i - 1, 0)]


@dataclass(frozen=True)
class FetchResponse:
    error_code: int
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    records: list[RecordOut] = field(default_factory=list)
    # Where the next fetch starts: past the last record returned, and past any markers or
    # aborted records the fetch stepped over.
    next_offset: int = -1
    aborted_transactions: list[AbortedTransaction] = field(default_factory=list)
    error_message: str | None = None
    # With ``FetchRequest.batches``: the records as stored, in offset order.
    log_records: list[LogRecord] = field(default_factory=list)
    # The topic's message.timestamp.type is LogAppendTime; the codec its batches are
    # served in (compression.type); the partition's leader epoch and, once it has had
    # several, each epoch with the offset it began at (``leader_epoch.epoch_at``).
    log_append_time: bool = False
    compression_type: str = "producer"
    leader_epoch: int = 0
    epochs: tuple[int, ...] = ()
    epoch_starts: tuple[int, ...] = ()


@dataclass(frozen=True)
class ListOffsetsRequest(Request["ListOffsetsResponse"]):
    topic: str
    partition: int
    timestamp: int
    isolation_level: int = READ_UNCOMMITTED
    # The leader epoch the client believes current (KIP-320; -1: not checked).
    current_leader_epoch: int = -1


@dataclass(frozen=True)
class ListOffsetsResponse:
    error_code: int
    offset: int = -1
    timestamp: int = -1
    error_message: str | None = None
    # The epoch the offset's record was written in (the current one for the log end).
    leader_epoch: int = -1


@dataclass(frozen=True)
class InitProducerIdRequest(Request["InitProducerIdResponse"]):
    transactional_id: str | None
    transaction_timeout_ms: int
    # KIP-360: a producer that already has an id may ask to bump its epoch.
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


@dataclass(frozen=True)
class InitProducerIdResponse:
    error_code: int
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    error_message: str | None = None


@dataclass(frozen=True)
class AddPartitionsToTxnRequest(Request["AddPartitionsToTxnResponse"]):
    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: list[tuple[str, int]]


@dataclass(frozen=True)
class AddPartitionsToTxnResponse:
    error_code: int
    # Per-partition results, as Kafka's response carries them.
    results: dict[tuple[str, int], int] = field(default_factory=dict)
    error_message: str | None = None


@dataclass(frozen=True)
class AddOffsetsToTxnRequest(Request["AddOffsetsToTxnResponse"]):
    transactional_id: str
    producer_id: int
    producer_epoch: int
    group_id: str


@dataclass(frozen=True)
class AddOffsetsToTxnResponse:
    error_code: int
    error_message: str | None = None


@dataclass(frozen=True)
class EndTxnRequest(Request["EndTxnResponse"]):
    transactional_id: str
    producer_id: int
    producer_epoch: int
    committed: bool
    # KIP-890's transaction version 2: ending the transaction bumps the epoch, and the
    # answer carries the next identity (the native client, EndTxn v5+). False for Kafka
    # clients of the first version (EndTxn v0-4), which keep their epoch across
    # transactions; their markers then carry the epoch of the data.
    bump_epoch: bool = True
    # Kafka's clients on transaction version 2 (EndTxn v5+): an EndTxn at the epoch the
    # coordinator's own abort (the transaction's timeout) bumped past is a retry of that
    # abort, as Kafka 4.4 takes it: ABORT answered OK with the current identity, COMMIT
    # INVALID_TXN_STATE. False for the native client, fenced there as librdkafka is.
    after_abort_is_retry: bool = False


@dataclass(frozen=True)
class EndTxnResponse:
    error_code: int
    # KIP-890: the identity to use for the next transaction.
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    error_message: str | None = None


@dataclass(frozen=True)
class WriteTxnMarkersRequest(Request["WriteTxnMarkersResponse"]):
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    committed: bool
    partitions: list[tuple[str, int]]


@dataclass(frozen=True)
class WriteTxnMarkersResponse:
    results: dict[tuple[str, int], int]


COORDINATOR_GROUP = 0
COORDINATOR_TRANSACTION = 1


@dataclass(frozen=True)
class FindCoordinatorRequest(Request["FindCoordinatorResponse"]):
    key: str
    key_type: int = COORDINATOR_TRANSACTION


@dataclass(frozen=True)
class FindCoordinatorResponse:
    error_code: int
    node_id: int = -1
    host: str = ""
    port: int = -1
    error_message: str | None = None


# ---------------------------------------------------------------- the cluster of kip98 serve nodes


@dataclass(frozen=True)
class NodeEndpoint:
    """Where a node's clients of one listener connect: its advertised address, by the
    listener's security protocol (which names the listener, as Kafka's default names do)."""

    security_protocol: str
    host: str
    port: int


@dataclass(frozen=True)
class ClusterNode:
    """A live ``kip98 serve`` node: its id, listeners and rack, where it runs (``host``,
    ``pid``), since when, its last heartbeat and lease expiry (ms), and how many requests
    it had answered at that heartbeat."""

    node_id: int
    endpoints: tuple[NodeEndpoint, ...]
    rack: str | None = None
    host: str = ""
    pid: int = 0
    registered_ms: int = 0
    heartbeat_ms: int = 0
    expires_ms: int = 0
    requests: int = 0

    def endpoint(self, security_protocol: str) -> NodeEndpoint | None:
        return next((e for e in self.endpoints if e.security_protocol == security_protocol), None)


# A BrokerRegistrationRequest's node id when the database is to assign one.
ANY_NODE_ID = -1


@dataclass(frozen=True)
class BrokerRegistrationRequest(Request["BrokerRegistrationResponse"]):
    """Kafka's BrokerRegistration (KIP-631): a node joins the cluster with ``node_id``
    (``ANY_NODE_ID``: the smallest one free), refused with DUPLICATE_BROKER_REGISTRATION
    while a live node holds it. ``incarnation`` (Kafka's incarnation id) tells this run of
    the node from another holding the same id later; registering again with the same one
    renews the registration."""

    node_id: int
    incarnation: str
    endpoints: tuple[NodeEndpoint, ...]
    rack: str | None = None
    host: str = ""
    pid: int = 0


@dataclass(frozen=True)
class BrokerRegistrationResponse:
    error_code: int
    node_id: int = -1
    error_message: str | None = None


@dataclass(frozen=True)
class BrokerHeartbeatRequest(Request["BrokerHeartbeatResponse"]):
    """Kafka's BrokerHeartbeat: the registration's lease renewed, and the requests the
    node has answered so far noted. STALE_BROKER_EPOCH if the registration is gone or has
    lapsed (the node registers again)."""

    node_id: int
    incarnation: str
    requests: int = 0


@dataclass(frozen=True)
class BrokerHeartbeatResponse:
    error_code: int
    error_message: str | None = None


@dataclass(frozen=True)
class UnregisterBrokerRequest(Request["UnregisterBrokerResponse"]):
    """Kafka's UnregisterBroker: the node leaves the cluster at once (a node stopping)."""

    node_id: int
    incarnation: str


@dataclass(frozen=True)
class UnregisterBrokerResponse:
    error_code: int
    error_message: str | None = None


@dataclass(frozen=True)
class DescribeClusterRequest(Request["DescribeClusterResponse"]):
    """Kafka's DescribeCluster, for what every answer naming nodes needs: the live nodes."""


@dataclass(frozen=True)
class DescribeClusterResponse:
    nodes: list[ClusterNode]


@dataclass(frozen=True)
class AuthorizedOperationsRequest(Request["AuthorizedOperationsResponse"]):
    """KIP-430: the operations the principal may perform on each of ``names`` (resources of
    ``resource_type``: topic, group, cluster or transactional_id), as Kafka's bit field."""

    resource_type: str
    names: tuple[str, ...]


@dataclass(frozen=True)
class AuthorizedOperationsResponse:
    operations: dict[str, int]


# ---------------------------------------------------------------- group coordinator

# A partition as the libraries key it, (topic, partition): the one internal name for it.
# The clients' public class is app.client.message.TopicPartition (confluent-kafka's).
TopicPartitionKey = tuple[str, int]


@dataclass(frozen=True)
class OffsetAndMetadata:
    offset: int
    metadata: str | None = None
    # KIP-320: the leader epoch of the last record consumed before ``offset``, kept with
    # it and handed back by OffsetFetch so a consumer can detect a truncated log (-1: none).
    leader_epoch: int = -1


@dataclass(frozen=True)
class OffsetCommitRequest(Request["OffsetCommitResponse"]):
    group_id: str
    offsets: dict[TopicPartitionKey, OffsetAndMetadata]
    generation_id: int = -1
    member_id: str = ""
    # KIP-345: a static member's instance id, which must still name ``member_id``.
    group_instance_id: str | None = None
    # Sent at an OffsetCommit version before 9, which has a generation, not KIP-848's
    # member epoch: a consumer-protocol member's commit at one is UNSUPPORTED_VERSION.
    before_member_epochs: bool = False


@dataclass(frozen=True)
class OffsetCommitResponse:
    error_code: int
    results: dict[TopicPartitionKey, int] = field(default_factory=dict)
    error_message: str | None = None


@dataclass(frozen=True)
class TxnOffsetCommitRequest(Request["TxnOffsetCommitResponse"]):
    transactional_id: str
    group_id: str
    producer_id: int
    producer_epoch: int
    offsets: dict[TopicPartitionKey, OffsetAndMetadata]
    # KIP-447: the consumer's group metadata, so a zombie of an old generation is fenced.
    generation_id: int = -1
    member_id: str = ""
    # KIP-890's transaction version 2: the commit also does AddOffsetsToTxn's work (the
    # group's offsets join the transaction, if they have not yet), in its DB transaction.
    add_offsets: bool = False
    # KIP-345: a static member's instance id, which must still name ``member_id``.
    group_instance_id: str | None = None


@dataclass(frozen=True)
class TxnOffsetCommitResponse:
    error_code: int
    results: dict[TopicPartitionKey, int] = field(default_factory=dict)
    error_message: str | None = None


@dataclass(frozen=True)
class OffsetFetchRequest(Request["OffsetFetchResponse"]):
    group_id: str
    partitions: list[TopicPartitionKey] | None = None
    require_stable: bool = False
    # KIP-848 (OffsetFetch v9): the consumer group member asking, checked at its epoch;
    # None and -1 for anyone else (an admin, a classic consumer).
    member_id: str | None = None
    member_epoch: int = -1


@dataclass(frozen=True)
class OffsetFetchResponse:
    """``partition_errors``: a partition's own error (KIP-447: UNSTABLE_OFFSET_COMMIT for
    one with a transactional commit pending, under ``require_stable``; its offset then -1).
    While there is one, ``error_code`` is UNSTABLE_OFFSET_COMMIT too, the summary a native
    client retries on; the wire answers it per partition only, as Kafka does."""

    error_code: int
    offsets: dict[TopicPartitionKey, OffsetAndMetadata] = field(default_factory=dict)
    error_message: str | None = None
    partition_errors: dict[TopicPartitionKey, int] = field(default_factory=dict)


@dataclass(frozen=True)
class GroupProtocol:
    """One assignment protocol a member of a classic group supports: its name and the
    member's metadata for it (for "consumer", the subscription), opaque to the coordinator."""

    name: str
    metadata: bytes


@dataclass(frozen=True)
class JoinGroupRequest(Request["JoinGroupResponse"]):
    """``protocol_type`` None: the coordinator assigns partitions itself (range), as the
    native client expects. Otherwise Kafka's classic protocol: the group picks one of
    ``protocols`` that every member supports and its leader assigns partitions.
    ``rebalance_timeout_ms`` is how long the members already in the group have to rejoin
    once a rebalance starts (-1: as long as they keep heartbeating)."""

    group_id: str
    member_id: str
    topics: list[str]
    session_timeout_ms: int
    client_id: str = ""
    group_instance_id: str | None = None
    # Where the member connects from (a wire client's address, "/127.0.0.1"; "" in process).
    client_host: str = ""
    protocol_type: str | None = None
    protocols: tuple[GroupProtocol, ...] = ()
    rebalance_timeout_ms: int = -1
    # KIP-394 (JoinGroup v4 and later): a dynamic member joining without a member id is
    # handed one with MEMBER_ID_REQUIRED, pending until it joins again with it.
    require_known_member_id: bool = False
    # KIP-345's JoinGroup v9: a static leader restarted into a Stable group may be told to
    # skip the assignment (else it is named a follower, and syncs for its own).
    skip_assignment_supported: bool = False
    # The partitions the member says it owns (its consumer protocol subscription, v1+):
    # what a classic member of a consumer group still holds when it rejoins (KIP-848).
    owned_partitions: tuple[TopicPartitionKey, ...] = ()


@dataclass(frozen=True)
class GroupMember:
    """A member as the classic protocol's leader sees it: its metadata for the chosen
    protocol."""

    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True)
class JoinGroupResponse:
    """``rebalancing``: other members have yet to rejoin; a wire front end asks again
    (Kafka holds the JoinGroup response until the join phase ends). ``members`` is filled
    for the leader of a classic group only."""

    error_code: int
    member_id: str = ""
    generation_id: int = -1
    error_message: str | None = None
    rebalancing: bool = False
    leader_id: str = ""
    protocol_type: str | None = None
    protocol_name: str | None = None
    members: list[GroupMember] = field(default_factory=list)
    skip_assignment: bool = False


@dataclass(frozen=True)
class HeartbeatRequest(Request["HeartbeatResponse"]):
    group_id: str
    member_id: str
    generation_id: int
    group_instance_id: str | None = None


@dataclass(frozen=True)
class HeartbeatResponse:
    error_code: int
    error_message: str | None = None


# KIP-848's server-side assignors kip98 serves, by the names a member's
# ``server_assignor`` (the Java client's group.remote.assignor) gives.
CONSUMER_GROUP_ASSIGNORS: Final = ("uniform", "range")


MIGRATION_POLICIES = ("bidirectional", "upgrade", "downgrade", "disabled")


def migration_policy(text: str) -> tuple[bool, bool]:
    """``KIP98_GROUP_CONSUMER_MIGRATION_POLICY`` (Kafka's group.consumer.migration.policy,
    case-insensitive): whether a classic group may be upgraded to a consumer group, and a
    consumer group downgraded back; INVALID_CONFIG for another value, so ``kip98 serve``
    refuses it at start in one line."""
    policy = text.strip().lower()
    if policy not in MIGRATION_POLICIES:
        raise fail(
            KafkaError.INVALID_CONFIG,
            f"KIP98_GROUP_CONSUMER_MIGRATION_POLICY: {text!r} not among {list(MIGRATION_POLICIES)}",
        )
    return policy in ("bidirectional", "upgrade"), policy in ("bidirectional", "downgrade")


def configured_assignors(text: str) -> tuple[str, ...]:
    """``KIP98_GROUP_CONSUMER_ASSIGNORS``, the first the default: INVALID_CONFIG for a
    name not served, or none, so ``kip98 serve`` refuses it at start in one line."""
    names = tuple(a.strip() for a in text.split(",") if a.strip())
    unknown = [a for a in names if a not in CONSUMER_GROUP_ASSIGNORS]
    if unknown or not names:
        raise fail(
            KafkaError.INVALID_CONFIG,
            f"KIP98_GROUP_CONSUMER_ASSIGNORS: {unknown or text!r} not among "
            f"{list(CONSUMER_GROUP_ASSIGNORS)}",
        )
    return names


@dataclass(frozen=True)
class ConsumerGroupHeartbeatRequest(Request["ConsumerGroupHeartbeatResponse"]):
    """KIP-848's heartbeat. Fields None (or -1) are "unchanged since the last heartbeat";
    ``owned``: the partitions the member holds, by topic name (None: not said)."""

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: dict[str, tuple[int, ...]] | None = None
    client_id: str = ""
    client_host: str = ""
    # Owned partitions of topic ids no topic has: they are held by nobody here.
    unknown_topic_ids: int = 0


@dataclass(frozen=True)
class ConsumerGroupHeartbeatResponse:
    """``assignment``: the partitions the member may consume now, by topic name (None:
    unchanged, not sent)."""

    error_code: int
    error_message: str | None = None
    member_id: str | None = None
    member_epoch: int = -1
    heartbeat_interval_ms: int = 0
    assignment: dict[str, tuple[int, ...]] | None = None


@dataclass(frozen=True)
class ConsumerGroupDescribeRequest(Request["ConsumerGroupDescribeResponse"]):
    group_ids: tuple[str, ...]


@dataclass(frozen=True)
class ConsumerGroupDescribedMember:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    assignment: dict[str, tuple[int, ...]]
    target_assignment: dict[str, tuple[int, ...]]
    state: str = "stable"
    # KIP-848's member type: 1 a consumer-protocol member, 0 a classic one (online upgrade).
    member_type: int = 1


@dataclass(frozen=True)
class ConsumerGroupDescribed:
    group_id: str
    error_code: int
    error_message: str | None = None
    state: str = "Dead"
    group_epoch: int = 0
    assignment_epoch: int = 0
    assignor_name: str = ""
    members: tuple[ConsumerGroupDescribedMember, ...] = ()


@dataclass(frozen=True)
class ConsumerGroupDescribeResponse:
    groups: list[ConsumerGroupDescribed] = field(default_factory=list)


@dataclass(frozen=True)
class MemberAssignment:
    """The leader's assignment for one member: the bytes its members read back, and the
    partitions they name when the front end could decode them (for views and the CLI)."""

    assignment: bytes
    partitions: tuple[TopicPartitionKey, ...] = ()


@dataclass(frozen=True)
class SyncGroupRequest(Request["SyncGroupResponse"]):
    """``assignments``: in a classic group, the leader's plan by member id (what a
    follower sends is not read)."""

    group_id: str
    member_id: str
    generation_id: int
    assignments: Mapping[str, MemberAssignment] | None = None
    group_instance_id: str | None = None


@dataclass(frozen=True)
class SyncGroupResponse:
    """``assignment`` for a coordinator-assigned group; ``member_assignment`` (the leader's
    bytes) for a classic one. ``awaiting_leader``: the leader has not sent its plan yet; a
    wire front end asks again, as Kafka holds the SyncGroup response until then."""

    error_code: int
    assignment: list[TopicPartitionKey] = field(default_factory=list)
    error_message: str | None = None
    member_assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None
    awaiting_leader: bool = False
    # A classic member of a consumer group (KIP-848): the coordinator's ``assignment``,
    # which the wire front end encodes as a ConsumerProtocolAssignment of this version.
    assignment_version: int | None = None


@dataclass(frozen=True)
class LeaveGroupRequest(Request["LeaveGroupResponse"]):
    """A static member (KIP-345) may leave by ``group_instance_id`` with an empty
    ``member_id``; if both are given they must name the same member."""

    group_id: str
    member_id: str
    group_instance_id: str | None = None


@dataclass(frozen=True)
class LeaveGroupResponse:
    error_code: int
    error_message: str | None = None


@dataclass(frozen=True)
class ListGroupsRequest(Request["ListGroupsResponse"]):
    """``states``: only groups in these states (Kafka's KIP-518 filter); None for all."""

    states: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ListedGroup:
    group_id: str
    protocol_type: str
    state: str
    group_type: str = "classic"


@dataclass(frozen=True)
class ListGroupsResponse:
    error_code: int
    groups: list[ListedGroup] = field(default_factory=list)
    error_message: str | None = None


@dataclass(frozen=True)
class DescribeGroupsRequest(Request["DescribeGroupsResponse"]):
    group_ids: tuple[str, ...]


@dataclass(frozen=True)
class DescribedMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    metadata: bytes
    assignment: bytes
    partitions: tuple[TopicPartitionKey, ...]
    client_host: str = ""


@dataclass(frozen=True)
class DescribedGroup:
    """A group as DescribeGroups shows it; an unknown group is Kafka's "Dead" with no
    members, and a refused one carries its error code."""

    group_id: str
    error_code: int
    state: str
    protocol_type: str
    protocol_name: str
    members: list[DescribedMember] = field(default_factory=list)


@dataclass(frozen=True)
class DescribeGroupsResponse:
    groups: list[DescribedGroup]


@dataclass(frozen=True)
class DeleteGroupsRequest(Request["DeleteGroupsResponse"]):
    """Kafka's DeleteGroups: each group, empty of members, with its committed offsets."""

    group_ids: list[str]


@dataclass(frozen=True)
class DeletedGroup:
    group_id: str
    error_code: int
    error_message: str | None = None


@dataclass(frozen=True)
class DeleteGroupsResponse:
    results: list[DeletedGroup]


@dataclass(frozen=True)
class OffsetDeleteRequest(Request["OffsetDeleteResponse"]):
    """Kafka's OffsetDelete (KIP-496): a group's committed offsets of these partitions,
    forgotten unless the group's members are subscribed to their topic."""

    group_id: str
    partitions: list[TopicPartitionKey]


@dataclass(frozen=True)
class OffsetDeleteResponse:
    """``error_code``: the whole request's (no such group, its ACL); else each
    partition's in ``results``."""

    error_code: int
    results: dict[TopicPartitionKey, int] = field(default_factory=dict)
    error_message: str | None = None


# ---------------------------------------------------------------- leader epochs


@dataclass(frozen=True)
class EpochQuery:
    """One partition of an OffsetForLeaderEpoch: the epoch asked about, and the one the
    client believes current (-1: not checked)."""

    topic: str
    partition: int
    leader_epoch: int
    current_leader_epoch: int = -1


@dataclass(frozen=True)
class OffsetForLeaderEpochRequest(Request["OffsetForLeaderEpochResponse"]):
    partitions: list[EpochQuery]


@dataclass(frozen=True)
class EpochEndOffset:
    """The largest epoch at or below the one asked and where it ended (the log end for
    the current one); -1 and -1 for an epoch the partition never had after."""

    topic: str
    partition: int
    error_code: int
    leader_epoch: int = -1
    end_offset: int = -1
    error_message: str | None = None


@dataclass(frozen=True)
class OffsetForLeaderEpochResponse:
    results: list[EpochEndOffset]


# ---------------------------------------------------------------- administration
#
# The AdminClient's RPCs: Kafka's admin APIs for topics and ACLs (KIP-4), configs (KIP-133,
# KIP-339), and the transaction tooling of KIP-664. Each response answers every item of its
# request, in request order, with that item's own error code, as Kafka's responses do: one
# bad topic, resource or filter does not fail the others.

# -------------------------------- topics


@dataclass(frozen=True)
class PartitionInfo:
    partition: int
    log_start_offset: int
    high_watermark: int
    last_stable_offset: int


@dataclass(frozen=True)
class TopicInfo:
    topic: str
    num_partitions: int
    config: dict[str, Any]
    partitions: tuple[PartitionInfo, ...] = ()


@dataclass(frozen=True)
class CreatableTopic:
    """One topic to create; ``configs`` as the tools send them (strings) or as Python values."""

    name: str
    num_partitions: int = 1
    configs: dict[str, Any] | None = None


@dataclass(frozen=True)
class CreateTopicsRequest(Request["CreateTopicsResponse"]):
    """Each topic is created on its own (a refused one leaves the others created).
    ``validate_only``: every check, the authorization and the name's uniqueness included,
    and nothing written."""

    topics: list[CreatableTopic]
    validate_only: bool = False


@dataclass(frozen=True)
class CreatableTopicResult:
    name: str
    error_code: int
    error_message: str | None = None
    num_partitions: int = -1


@dataclass(frozen=True)
class CreateTopicsResponse:
    topics: list[CreatableTopicResult]


@dataclass(frozen=True)
class DeleteTopicsRequest(Request["DeleteTopicsResponse"]):
    topic_names: list[str]


@dataclass(frozen=True)
class DeletableTopicResult:
    name: str
    error_code: int
    error_message: str | None = None


@dataclass(frozen=True)
class DeleteTopicsResponse:
    responses: list[DeletableTopicResult]


@dataclass(frozen=True)
class PartitionCount:
    """A topic to grow to ``count`` partitions (Kafka's CreatePartitions topic)."""

    name: str
    count: int


@dataclass(frozen=True)
class CreatePartitionsRequest(Request["CreatePartitionsResponse"]):
    """Each topic on its own; a topic only grows. ``validate_only``: every check, nothing
    written."""

    topics: list[PartitionCount]
    validate_only: bool = False


@dataclass(frozen=True)
class CreatePartitionsResult:
    name: str
    error_code: int
    error_message: str | None = None


@dataclass(frozen=True)
class CreatePartitionsResponse:
    results: list[CreatePartitionsResult]


@dataclass(frozen=True)
class DeleteRecordsRequest(Request["DeleteRecordsResponse"]):
    """Kafka's DeleteRecords: (topic, partition, offset) each, the offset the new log
    start (-1: the high watermark). Each partition on its own."""

    partitions: list[tuple[str, int, int]]


@dataclass(frozen=True)
class DeletedRecords:
    """One partition's answer: its log start after the deletion (Kafka's low watermark)."""

    topic: str
    partition: int
    error_code: int
    low_watermark: int = -1
    error_message: str | None = None


@dataclass(frozen=True)
class DeleteRecordsResponse:
    results: list[DeletedRecords]


@dataclass(frozen=True)
class ListTopicsRequest(Request["ListTopicsResponse"]):
    """Kafka's Admin.listTopics, with what kafka-topics.sh --describe adds to it: each
    partition's offsets and the topic's config overrides."""


@dataclass(frozen=True)
class ListTopicsResponse:
    topics: list[TopicInfo]


# -------------------------------- configs

# Kafka's ConfigResource.Type; topics are the only resources with configs here.
RESOURCE_TOPIC = 2
# Kafka's ConfigSource, for the two a topic's config can come from.
CONFIG_SOURCE_DYNAMIC_TOPIC = 1
CONFIG_SOURCE_DEFAULT = 5
# Kafka's AlterConfigOp.OpType (IncrementalAlterConfigs, KIP-339).
OP_SET = 0
OP_DELETE = 1
OP_APPEND = 2
OP_SUBTRACT = 3


@dataclass(frozen=True)
class DescribeConfigsResource:
    resource_type: int
    resource_name: str
    # None for every config.
    configuration_keys: list[str] | None = None


@dataclass(frozen=True)
class DescribeConfigsRequest(Request["DescribeConfigsResponse"]):
    resources: list[DescribeConfigsResource]
    # The node answering, which a BROKER resource must name (None: in process, any).
    node_id: int | None = None


@dataclass(frozen=True)
class DescribeConfigsResourceResult:
    """One config of a resource: its value, where it comes from (the topic's override or
    the default), the default under it, Kafka's type code and what it does here."""

    name: str
    value: str
    config_source: int
    read_only: bool = False
    is_sensitive: bool = False
    default_value: str | None = None
    config_type: int = 0
    documentation: str | None = None


@dataclass(frozen=True)
class DescribeConfigsResult:
    resource_type: int
    resource_name: str
    error_code: int
    error_message: str | None = None
    configs: list[DescribeConfigsResourceResult] = field(default_factory=list)


@dataclass(frozen=True)
class DescribeConfigsResponse:
    results: list[DescribeConfigsResult]


@dataclass(frozen=True)
class AlterConfigsResource:
    """The configs a resource is to have, replacing its overrides. A None value sets
    nothing, but its name must still be a known config."""

    resource_type: int
    resource_name: str
    configs: dict[str, Any]


@dataclass(frozen=True)
class AlterConfigsRequest(Request["AlterConfigsResponse"]):
    """Kafka's AlterConfigs: the given set replaces the resource's overrides."""

    resources: list[AlterConfigsResource]
    validate_only: bool = False
    node_id: int | None = None


@dataclass(frozen=True)
class AlterConfigsResourceResponse:
    resource_type: int
    resource_name: str
    error_code: int
    error_message: str | None = None


@dataclass(frozen=True)
class AlterConfigsResponse:
    responses: list[AlterConfigsResourceResponse]


@dataclass(frozen=True)
class AlterableConfig:
    name: str
    config_operation: int = OP_SET
    value: Any = None


@dataclass(frozen=True)
class IncrementalAlterConfigsResource:
    resource_type: int
    resource_name: str
    configs: list[AlterableConfig]


@dataclass(frozen=True)
class IncrementalAlterConfigsRequest(Request["IncrementalAlterConfigsResponse"]):
    """KIP-339: each operation (set, delete, append to or subtract from a list config)
    applies on top of the overrides the resource has; the others stay."""

    resources: list[IncrementalAlterConfigsResource]
    validate_only: bool = False
    node_id: int | None = None


@dataclass(frozen=True)
class IncrementalAlterConfigsResponse:
    responses: list[AlterConfigsResourceResponse]


# -------------------------------- ACLs
#
# The ACL model's values: a request carries them, and both the client and the broker check
# them, as Kafka's AclBinding and CreateAclsRequest refuse unknown or wildcard values
# before anything is sent (the broker checks again: a wire client may send anything).
# Their meaning, when an ACL applies and what it decides, is app.security.rules'.

TOPIC = "topic"
GROUP = "group"
TRANSACTIONAL_ID = "transactional_id"
CLUSTER = "cluster"
RESOURCE_TYPES = (TOPIC, GROUP, TRANSACTIONAL_ID, CLUSTER)

# Kafka's only cluster resource is named kafka-cluster.
CLUSTER_NAME = "kafka-cluster"

LITERAL = "literal"
PREFIXED = "prefixed"
PATTERN_TYPES = (LITERAL, PREFIXED)
# A filter's pattern type only (Kafka's PatternType.MATCH): the ACLs that would decide
# about the resource named, whatever their pattern (app.security.rules.filter_matches).
MATCH = "match"

READ = "read"
WRITE = "write"
CREATE = "create"
DELETE = "delete"
DESCRIBE = "describe"
ALTER = "alter"
CLUSTER_ACTION = "cluster_action"
ALL = "all"
OPERATIONS = (READ, WRITE, CREATE, DELETE, DESCRIBE, ALTER, CLUSTER_ACTION, ALL)

ALLOW = "allow"
DENY = "deny"
PERMISSIONS = (ALLOW, DENY)

ANY_NAME = "*"


@dataclass(frozen=True)
class AclBinding:
    """One ACL: ``principal`` may (``allow``) or may not (``deny``) perform ``operation`` on
    the resources that ``resource_type``/``resource_name``/``pattern_type`` select."""

    principal: str
    resource_type: str
    resource_name: str
    operation: str
    permission: str = ALLOW
    pattern_type: str = LITERAL


@dataclass(frozen=True)
class AclBindingFilter:
    """Selects ACLs for describe/delete: None matches any value of that field."""

    principal: str | None = None
    resource_type: str | None = None
    resource_name: str | None = None
    operation: str | None = None
    permission: str | None = None
    pattern_type: str | None = None


def check_text(value: str, what: str) -> None:
    """A name stored in a PostgreSQL text column: NUL cannot be stored, so it is refused
    as a bad request rather than failing in the database."""
    if "\x00" in value:
        raise fail(KafkaError.INVALID_REQUEST, f"{what} must not contain NUL")


def validate_binding(acl: object) -> AclBinding:
    """An ACL fit to store: known enumerations, a ``Type:name`` principal, a name."""
    if not isinstance(acl, AclBinding):
        raise fail(KafkaError._INVALID_ARG, f"expected AclBinding, got {type(acl).__name__}")
    for value, allowed, what in (
        (acl.resource_type, RESOURCE_TYPES, "resource type"),
        (acl.pattern_type, PATTERN_TYPES, "pattern type"),
        (acl.operation, OPERATIONS, "operation"),
        (acl.permission, PERMISSIONS, "permission"),
    ):
        if value not in allowed:
            raise fail(
                KafkaError.INVALID_REQUEST,
                f"unknown {what} {value!r}; expected one of {', '.join(allowed)}",
            )
    if not isinstance(acl.principal, str) or ":" not in acl.principal.strip(":"):
        raise fail(
            KafkaError.INVALID_REQUEST, f"principal {acl.principal!r} must look like User:name"
        )
    if not isinstance(acl.resource_name, str) or not acl.resource_name:
        raise fail(KafkaError.INVALID_REQUEST, "resource name must be a non-empty string")
    check_text(acl.principal, "principal")
    check_text(acl.resource_name, "resource name")
    if acl.resource_type == CLUSTER and acl.resource_name != CLUSTER_NAME:
        raise fail(KafkaError.INVALID_REQUEST, f"the cluster resource is named {CLUSTER_NAME}")
    if acl.pattern_type == PREFIXED and acl.resource_name == ANY_NAME:
        raise fail(KafkaError.INVALID_REQUEST, "a prefixed ACL cannot use the wildcard name")
    return acl


def validate_filter(acl_filter: object) -> AclBindingFilter:
    if not isinstance(acl_filter, AclBindingFilter):
        raise fail(
            KafkaError._INVALID_ARG, f"expected AclBindingFilter, got {type(acl_filter).__name__}"
        )
    for value, allowed, what in (
        (acl_filter.resource_type, RESOURCE_TYPES, "resource type"),
        (acl_filter.pattern_type, (*PATTERN_TYPES, MATCH), "pattern type"),
        (acl_filter.operation, OPERATIONS, "operation"),
        (acl_filter.permission, PERMISSIONS, "permission"),
    ):
        if value is not None and value not in allowed:
            raise fail(KafkaError.INVALID_REQUEST, f"unknown {what} {value!r}")
    for value, what in (
        (acl_filter.principal, "principal"),
        (acl_filter.resource_name, "resource name"),
    ):
        if value is not None and not isinstance(value, str):
            raise fail(KafkaError.INVALID_REQUEST, f"{what} must be a string")
        if value is not None:
            check_text(value, what)
    return acl_filter


@dataclass(frozen=True)
class SaslPlainRequest(Request["SaslPlainResponse"]):
    """A listener's check of a SASL/PLAIN user and password (``kip98 serve``)."""

    username: str
    password: str


@dataclass(frozen=True)
class SaslPlainResponse:
    """NO_ERROR with the user's principal, or SASL_AUTHENTICATION_FAILED."""

    error_code: int
    principal: str | None = None


@dataclass(frozen=True)
class SaslScramRequest(Request["SaslScramResponse"]):
    """A listener's lookup of a SCRAM user's credential, for the exchange it runs with the
    client (``kip98 serve``)."""

    username: str
    mechanism: str


@dataclass(frozen=True)
class ScramCredential:
    """What a SCRAM server keeps of a user (RFC 5802 §2.2): enough to check a proof and
    sign the answer, never enough to log in."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


@dataclass(frozen=True)
class SaslScramResponse:
    """NO_ERROR with the user's principal and credential, or SASL_AUTHENTICATION_FAILED
    when there is no such user of that mechanism."""

    error_code: int
    principal: str | None = None
    credential: ScramCredential | None = None


# Kafka's ScramMechanism codes, as the SCRAM credential APIs name mechanisms.
SCRAM_MECHANISM_CODES = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}


@dataclass(frozen=True)
class DescribeUserScramCredentialsRequest(Request["DescribeUserScramCredentialsResponse"]):
    """The SCRAM credentials of ``users`` (None: of every user that has one)."""

    users: list[str] | None = None


@dataclass(frozen=True)
class UserScramCredentials:
    """A user's SCRAM credentials: (mechanism, iterations) each, never a key."""

    user: str
    error_code: int
    error_message: str | None = None
    credentials: list[tuple[str, int]] = field(default_factory=list)


@dataclass(frozen=True)
class DescribeUserScramCredentialsResponse:
    error_code: int
    error_message: str | None = None
    results: list[UserScramCredentials] = field(default_factory=list)


@dataclass(frozen=True)
class ScramUpsertion:
    """A SCRAM credential to set: what a SCRAM server keeps is derived from the salted
    password (RFC 5802's SaltedPassword, computed by the client from the password)."""

    user: str
    mechanism: str
    iterations: int
    salt: bytes
    salted_password: bytes


@dataclass(frozen=True)
class AlterUserScramCredentialsRequest(Request["AlterUserScramCredentialsResponse"]):
    """Kafka's AlterUserScramCredentials: each user's deletions ((user, mechanism)) and
    upsertions done together or not at all."""

    deletions: list[tuple[str, str]] = field(default_factory=list)
    upsertions: list[ScramUpsertion] = field(default_factory=list)


@dataclass(frozen=True)
class AlteredUser:
    user: str
    error_code: int
    error_message: str | None = None


@dataclass(frozen=True)
class AlterUserScramCredentialsResponse:
    results: list[AlteredUser]


@dataclass(frozen=True)
class CreateAclsRequest(Request["CreateAclsResponse"]):
    """All or nothing: every ACL is checked before any is stored, and a refusal is every
    creation's answer."""

    creations: list[AclBinding]


@dataclass(frozen=True)
class AclCreationResult:
    error_code: int
    error_message: str | None = None


@dataclass(frozen=True)
class CreateAclsResponse:
    results: list[AclCreationResult]


@dataclass(frozen=True)
class DescribeAclsRequest(Request["DescribeAclsResponse"]):
    acl_filter: AclBindingFilter


@dataclass(frozen=True)
class DescribeAclsResponse:
    error_code: int
    error_message: str | None = None
    acls: list[AclBinding] = field(default_factory=list)


@dataclass(frozen=True)
class DeleteAclsRequest(Request["DeleteAclsResponse"]):
    """Each filter deletes on its own (one DB transaction each)."""

    filters: list[AclBindingFilter]


@dataclass(frozen=True)
class DeleteAclsFilterResult:
    error_code: int
    error_message: str | None = None
    matching_acls: list[AclBinding] = field(default_factory=list)


@dataclass(frozen=True)
class DeleteAclsResponse:
    filter_results: list[DeleteAclsFilterResult]


# -------------------------------- transactions (KIP-664)

# Kafka's names (its TransactionState) for the coordinator's transaction states, the one
# mapping: the wire (ListTransactions, DescribeTransactions) and the CLI's tables show
# these, as kafka-transactions.sh does; the SQL views and the CLI's JSON keep the KIP's
# (app/coordinator/machines.py). Kafka's PrepareEpochFence has no state here: a fenced
# transaction goes to PREPARE_ABORT.
KAFKA_STATES = {
    "EMPTY": "Empty",
    "BEGIN": "Ongoing",
    "PREPARE_COMMIT": "PrepareCommit",
    "PREPARE_ABORT": "PrepareAbort",
    "COMPLETE_COMMIT": "CompleteCommit",
    "COMPLETE_ABORT": "CompleteAbort",
    "DEAD": "Dead",
}
STATES_BY_KAFKA_NAME = {kafka: name for name, kafka in KAFKA_STATES.items()}


@dataclass(frozen=True)
class TransactionDescription:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str
    partitions: tuple[tuple[str, int], ...]
    timeout_ms: int
    txn_start_ms: int
    updated_ms: int
    coordinator_epoch: int


@dataclass(frozen=True)
class ListTransactionsRequest(Request["ListTransactionsResponse"]):
    """``state_filters``: the coordinator's state names (None for every state).
    ``producer_id_filters``: empty for every producer. ``duration_filter_ms``: when not
    negative, only transactions open longer than that."""

    state_filters: list[str] | None = None
    producer_id_filters: list[int] = field(default_factory=list)
    duration_filter_ms: int = -1


@dataclass(frozen=True)
class TransactionListing:
    transactional_id: str
    producer_id: int
    state: str


@dataclass(frozen=True)
class ListTransactionsResponse:
    error_code: int
    transaction_states: list[TransactionListing] = field(default_factory=list)
    # The state filters that name no state.
    unknown_state_filters: list[str] = field(default_factory=list)
    error_message: str | None = None


@dataclass(frozen=True)
class DescribeTransactionsRequest(Request["DescribeTransactionsResponse"]):
    transactional_ids: list[str]


@dataclass(frozen=True)
class TransactionStateResult:
    """One transactional id's answer: its description, or TRANSACTIONAL_ID_NOT_FOUND."""

    transactional_id: str
    error_code: int
    description: TransactionDescription | None = None
    error_message: str | None = None


@dataclass(frozen=True)
class DescribeTransactionsResponse:
    transaction_states: list[TransactionStateResult]


@dataclass(frozen=True)
class ProducerDescription:
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_transaction_start_offset: int


@dataclass(frozen=True)
class DescribeProducersRequest(Request["DescribeProducersResponse"]):
    partitions: list[TopicPartitionKey]


@dataclass(frozen=True)
class PartitionProducers:
    topic: str
    partition: int
    error_code: int
    error_message: str | None = None
    active_producers: list[ProducerDescription] = field(default_factory=list)


@dataclass(frozen=True)
class DescribeProducersResponse:
    partitions: list[PartitionProducers]


@dataclass(frozen=True)
class HangingTransaction:
    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    start_offset: int
    started_at: datetime | None


@dataclass(frozen=True)
class FindHangingTransactionsRequest(Request["FindHangingTransactionsResponse"]):
    """kafka-transactions.sh find-hanging, as one request: transactions open on a partition
    that no live coordinator transaction covers, or (``max_transaction_timeout_ms`` given)
    open longer than that."""

    max_transaction_timeout_ms: int | None = None


@dataclass(frozen=True)
class FindHangingTransactionsResponse:
    transactions: list[HangingTransaction]


@dataclass(frozen=True)
class AbortTransactionRequest(Request["AbortTransactionResponse"]):
    """Kafka's Admin.abortTransaction, by where the transaction starts on the partition: an
    ABORT marker with the producer's own epochs."""

    topic: str
    partition: int
    start_offset: int


@dataclass(frozen=True)
class AbortTransactionResponse:
    error_code: int
    error_message: str | None = None
    # False when the transaction was already closed by the time the marker was to be written.
    written: bool = False
