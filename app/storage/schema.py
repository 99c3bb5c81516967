"""The whole schema as SQLAlchemy Core metadata: the single source Alembic migrations follow.

Each table family is an append-only log (the truth) plus projections of current state that
``kip98 db rebuild`` (each library's rebuild) can always recompute from the log. Keys lead with
(topic, partition) so the data can later be distributed by partition without redesign.
Integer widths follow Kafka's wire types (epoch int16, sequence int32, offsets int64).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.schema import SchemaItem

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
metadata = MetaData(naming_convention=NAMING)

# ---------------------------------------------------------------- partition log family

topics = Table(
    "topics",
    metadata,
    Column("topic", Text, primary_key=True),
    Column("num_partitions", Integer, nullable=False),
    Column("config", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("created_ms", BigInteger, nullable=False),
    # Which incarnation of the name this is (Kafka's topic id, KIP-516): a topic deleted
    # and created again gets a new one, so work captured against the old one is not
    # applied to the new one.
    Column(
        "topic_id", UUID(as_uuid=True), nullable=False, server_default=text("gen_random_uuid()")
    ),
    CheckConstraint("num_partitions >= 1", name="num_partitions_positive"),
    UniqueConstraint("topic_id"),
)

partitions = Table(
    "partitions",
    metadata,
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    # The row whose lock serialises appends (docs/design.md §3.1); next_offset: the high watermark.
    Column("next_offset", BigInteger, nullable=False, server_default=text("0")),
    Column("log_start_offset", BigInteger, nullable=False, server_default=text("0")),
    Column("last_stable_offset", BigInteger, nullable=False, server_default=text("0")),
    # The topic's configs an append or a fetch of this partition obeys, kept on the row
    # they lock or read (written with the topic's config, in its DB transaction): an
    # append decided on a remembered row (rule 32) then also sees a config changed since,
    # as a change of the row's version. max.message.bytes (NULL: the broker's
    # message.max.bytes), message.timestamp.type=LogAppendTime, compression.type.
    Column("max_message_bytes", Integer),
    Column("log_append_time", Boolean, nullable=False, server_default=text("false")),
    Column("compression_type", Text, nullable=False, server_default=text("'producer'")),
    # The partition's current leader epoch (Kafka's): the last row of
    # partition_leader_epochs, read here by every request that answers with it.
    Column("leader_epoch", Integer, nullable=False, server_default=text("0")),
    PrimaryKeyConstraint("topic", "partition"),
    ForeignKeyConstraint(["topic"], ["topics.topic"], ondelete="CASCADE"),
)

# Kafka's leader-epoch cache: each epoch of a partition and the offset its leader's first
# record took (the log end when it began), for OffsetForLeaderEpoch and the epoch each
# fetched batch carries. Epoch 0 begins at 0 when the partition is made.
partition_leader_epochs = Table(
    "partition_leader_epochs",
    metadata,
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("leader_epoch", Integer, nullable=False),
    Column("start_offset", BigInteger, nullable=False),
    PrimaryKeyConstraint("topic", "partition", "leader_epoch"),
    ForeignKeyConstraint(
        ["topic", "partition"],
        ["partitions.topic", "partitions.partition"],
        ondelete="CASCADE",
    ),
)

# One row per record, control records (transaction markers) included. Producer fields are
# -1 for records written without idempotence. batch_base_offset ties a record to its batch
# so producer state (last five batches) can be rebuilt from the log alone.
records = Table(
    "records",
    metadata,
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("offset", BigInteger, nullable=False),
    Column("timestamp", BigInteger, nullable=False),
    Column("key", LargeBinary),
    Column("value", LargeBinary),
    Column("headers", JSONB),
    Column("producer_id", BigInteger, nullable=False),
    Column("producer_epoch", SmallInteger, nullable=False),
    Column("sequence", Integer, nullable=False),
    Column("batch_base_offset", BigInteger, nullable=False),
    Column("is_transactional", Boolean, nullable=False),
    Column("is_control", Boolean, nullable=False),
    # Kafka's ControlRecordType: 0 = ABORT, 1 = COMMIT; NULL for data records.
    Column("control_type", SmallInteger),
    Column("coordinator_epoch", Integer),
    PrimaryKeyConstraint("topic", "partition", "offset"),
)
# No secondary index on records: every read is by (topic, partition, offset) range, and
# each index would tax every append.


def _producer_state_columns() -> list[SchemaItem]:
    return [
        Column("topic", Text, nullable=False),
        Column("partition", Integer, nullable=False),
        Column("producer_id", BigInteger, nullable=False),
        Column("producer_epoch", SmallInteger, nullable=False),
        Column("last_sequence", Integer, nullable=False),
        Column("last_offset", BigInteger, nullable=False),
        Column("last_timestamp", BigInteger, nullable=False),
        Column("batches", JSONB, nullable=False),
        Column("coordinator_epoch", Integer, nullable=False, server_default=text("-1")),
        Column("txn_first_offset", BigInteger),
        PrimaryKeyConstraint("topic", "partition", "producer_id"),
    ]


# Projection: per (partition, producer) the fold of its batches and markers.
# batches holds the last five data batches as [first_seq, last_seq, first_offset, last_offset].
producer_states = Table("producer_states", metadata, *_producer_state_columns())

# Projection: the aborted-transaction index (KIP-98 "Aborted Transaction Index").
aborted_txns = Table(
    "aborted_txns",
    metadata,
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("producer_id", BigInteger, nullable=False),
    Column("first_offset", BigInteger, nullable=False),
    Column("last_offset", BigInteger, nullable=False),
    Column("last_stable_offset", BigInteger, nullable=False),
    PrimaryKeyConstraint("topic", "partition", "last_offset"),
)

# Snapshots of producer_states (Kafka's producer-state snapshot files): the fold of a
# partition's records below log_cleaner_checkpoints.snapshot_offset, written by the cleaner
# before it removes any record below that offset. Rebuilds start from here and fold the
# records from snapshot_offset on; aborted_txns rows ending below it are kept as they are
# (Kafka keeps cleaned segments' transaction indexes the same way).
producer_snapshots = Table("producer_snapshots", metadata, *_producer_state_columns())

# Per partition: where the last snapshot was taken and what cleaning has removed so far
# (Kafka's cleaner-offset-checkpoint, plus the counters its metrics report).
log_cleaner_checkpoints = Table(
    "log_cleaner_checkpoints",
    metadata,
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("snapshot_offset", BigInteger, nullable=False, server_default=text("0")),
    Column("cleaned_ms", BigInteger, nullable=False, server_default=text("0")),
    Column("records_removed", BigInteger, nullable=False, server_default=text("0")),
    Column("bytes_removed", BigInteger, nullable=False, server_default=text("0")),
    PrimaryKeyConstraint("topic", "partition"),
    ForeignKeyConstraint(
        ["topic", "partition"],
        ["partitions.topic", "partitions.partition"],
        ondelete="CASCADE",
    ),
)

# Markers whose transaction has no record left, and since when (KIP-534's delete horizon):
# a marker and its aborted-index entry go only delete.retention.ms after that, so a reader
# that saw the transaction's records also sees the entry that hides them.
cleaner_marker_horizons = Table(
    "cleaner_marker_horizons",
    metadata,
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("offset", BigInteger, nullable=False),
    Column("empty_since_ms", BigInteger, nullable=False),
    PrimaryKeyConstraint("topic", "partition", "offset"),
    ForeignKeyConstraint(
        ["topic", "partition"],
        ["partitions.topic", "partitions.partition"],
        ondelete="CASCADE",
    ),
)

# Compaction passes within the last delete.retention.ms: each reached ``up_to_offset`` at
# ``passed_ms``. A tombstone is first passed by the first pass whose range holds it, and
# goes delete.retention.ms after that (Kafka's delete horizon, KIP-534), whatever its
# timestamp says.
cleaner_tombstone_passes = Table(
    "cleaner_tombstone_passes",
    metadata,
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("up_to_offset", BigInteger, nullable=False),
    Column("passed_ms", BigInteger, nullable=False),
    PrimaryKeyConstraint("topic", "partition", "up_to_offset"),
    ForeignKeyConstraint(
        ["topic", "partition"],
        ["partitions.topic", "partitions.partition"],
        ondelete="CASCADE",
    ),
)

# Producer ids handed out by InitProducerId: append-only, so an id is never reused, even
# across restarts and rebuilds (Kafka's ProducerIdManager block, as a table).
producer_ids = Table(
    "producer_ids",
    metadata,
    Column("producer_id", BigInteger, Identity(start=1000), primary_key=True),
    Column("transactional_id", Text),
    Column("allocated_ms", BigInteger, nullable=False),
)

# ---------------------------------------------------------------- transaction coordinator family

# One row per persisted transition of a transactional id (Kafka's __transaction_state).
transaction_log = Table(
    "transaction_log",
    metadata,
    Column("event_id", BigInteger, Identity(), primary_key=True),
    Column("transactional_id", Text, nullable=False),
    Column("producer_id", BigInteger, nullable=False),
    Column("producer_epoch", SmallInteger, nullable=False),
    Column("last_producer_id", BigInteger, nullable=False),
    Column("last_producer_epoch", SmallInteger, nullable=False),
    Column("state", Text, nullable=False),
    Column("partitions", JSONB, nullable=False),
    Column("has_offsets", Boolean, nullable=False, server_default=text("false")),
    Column("timeout_ms", Integer, nullable=False),
    Column("txn_start_ms", BigInteger, nullable=False),
    Column("updated_ms", BigInteger, nullable=False),
    Column("coordinator_epoch", Integer, nullable=False),
    Column("reason", Text),
)
Index(
    "ix_transaction_log_transactional_id",
    transaction_log.c.transactional_id,
    transaction_log.c.event_id,
)

# Projection: exactly the fold of transaction_log per transactional id.
transactions = Table(
    "transactions",
    metadata,
    Column("transactional_id", Text, primary_key=True),
    Column("producer_id", BigInteger, nullable=False),
    Column("producer_epoch", SmallInteger, nullable=False),
    Column("last_producer_id", BigInteger, nullable=False),
    Column("last_producer_epoch", SmallInteger, nullable=False),
    Column("state", Text, nullable=False),
    Column("partitions", JSONB, nullable=False),
    Column("has_offsets", Boolean, nullable=False),
    Column("timeout_ms", Integer, nullable=False),
    Column("txn_start_ms", BigInteger, nullable=False),
    Column("updated_ms", BigInteger, nullable=False),
    Column("coordinator_epoch", Integer, nullable=False),
    # The transaction-log partition (hash of the id) whose lease holder times it out.
    Column("txn_partition", Integer, nullable=False),
    Column("last_event_id", BigInteger, nullable=False),
)
Index("ix_transactions_txn_partition_state", transactions.c.txn_partition, transactions.c.state)

# Leases on transaction-log partitions: whoever holds one runs timeouts, expiry and
# roll-forward for the transactional ids hashed to it; each takeover bumps the epoch.
coordinator_leases = Table(
    "coordinator_leases",
    metadata,
    Column("txn_partition", Integer, primary_key=True, autoincrement=False),
    Column("owner", Text),
    Column("coordinator_epoch", Integer, nullable=False, server_default=text("0")),
    Column("expires_ms", BigInteger, nullable=False, server_default=text("0")),
)

# The coordinator loops at work, each renewed by its passes and lapsing as its leases do:
# how many share the leases, so that each takes its fair share of them (docs/design.md
# rule 59).
coordinator_loops = Table(
    "coordinator_loops",
    metadata,
    Column("owner", Text, primary_key=True),
    Column("expires_ms", BigInteger, nullable=False),
)

# Per kind of the coordinator loop's work, how many times one item of it failed (a marker
# refused, a database error); the loop logs each, backs off from the item and goes on
# with the others. Counted here, not in a process, so every reader of metrics sees them.
coordinator_item_failures = Table(
    "coordinator_item_failures",
    metadata,
    Column("work", Text, primary_key=True),
    Column("failures", BigInteger, nullable=False, server_default=text("0")),
    Column("last_failed_ms", BigInteger, nullable=False, server_default=text("0")),
)

# ---------------------------------------------------------------- group family

offset_commit_log = Table(
    "offset_commit_log",
    metadata,
    Column("event_id", BigInteger, Identity(), primary_key=True),
    Column("group_id", Text, nullable=False),
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    # 'commit' (plain OffsetCommit), 'txn_pending' (TxnOffsetCommit), 'txn_commit' and
    # 'txn_abort' (the marker's effect on pending offsets of producer_id), 'delete' (the
    # topic was deleted: its offset and pending ones are forgotten), 'offset_delete' (an
    # admin's OffsetDelete or DeleteGroups: the committed offset is forgotten).
    Column("kind", Text, nullable=False),
    Column("committed_offset", BigInteger),
    # An offset's metadata as the UTF-8 of the string committed: Kafka's strings may hold
    # NUL, which text cannot (the same in group_offsets and pending_txn_offsets).
    Column("metadata", LargeBinary),
    Column("producer_id", BigInteger),
    Column("producer_epoch", SmallInteger),
    Column("commit_ms", BigInteger, nullable=False),
    # KIP-320's leader epoch committed with the offset (-1: none; NULL on 'delete' events).
    Column("committed_leader_epoch", Integer),
)

group_offsets = Table(
    "group_offsets",
    metadata,
    Column("group_id", Text, nullable=False),
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("committed_offset", BigInteger, nullable=False),
    Column("metadata", LargeBinary),
    Column("commit_ms", BigInteger, nullable=False),
    Column("committed_leader_epoch", Integer, nullable=False, server_default=text("-1")),
    PrimaryKeyConstraint("group_id", "topic", "partition"),
)

pending_txn_offsets = Table(
    "pending_txn_offsets",
    metadata,
    Column("group_id", Text, nullable=False),
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("producer_id", BigInteger, nullable=False),
    Column("producer_epoch", SmallInteger, nullable=False),
    Column("committed_offset", BigInteger, nullable=False),
    Column("metadata", LargeBinary),
    Column("commit_ms", BigInteger, nullable=False),
    Column("committed_leader_epoch", Integer, nullable=False, server_default=text("-1")),
    PrimaryKeyConstraint("group_id", "topic", "partition", "producer_id"),
)

# Group membership (the group coordinator's current state; rebuilt by members re-joining,
# as Kafka's is after a coordinator failover). Assignments are computed here, server-side.
consumer_groups = Table(
    "consumer_groups",
    metadata,
    Column("group_id", Text, primary_key=True),
    Column("generation_id", Integer, nullable=False, server_default=text("0")),
    # Empty | PreparingRebalance | CompletingRebalance | Stable, Kafka's group states.
    # CompletingRebalance (waiting for the leader's assignment) only in classic groups.
    Column("state", Text, nullable=False, server_default=text("'Empty'")),
    # The assignment protocol in use: 'range' computed by the coordinator when
    # protocol_type is NULL (native clients), else the one the classic group chose.
    Column("protocol", Text, nullable=False, server_default=text("'range'")),
    # Kafka's classic protocol (wire clients): the members' protocol type (e.g. 'consumer')
    # and the member that assigns partitions for the current generation.
    Column("protocol_type", Text),
    Column("leader_id", Text),
    Column("rebalance_started_ms", BigInteger, nullable=False, server_default=text("0")),
    # While the first rebalance of an empty group waits for more members
    # (group.initial.rebalance.delay.ms, KIP-134): when its join phase may end at the
    # earliest; NULL otherwise.
    Column("join_deadline_ms", BigInteger),
    # KIP-848: 'classic', or 'consumer' (the consumer group protocol, app.groups.consumer),
    # whose group epoch is generation_id, whose target assignment's epoch is
    # assignment_epoch, and whose subscribed topics' partition counts the target was
    # computed for are subscription_metadata.
    Column("group_type", Text, nullable=False, server_default=text("'classic'")),
    Column("assignment_epoch", Integer, nullable=False, server_default=text("0")),
    Column("subscription_metadata", JSONB),
)

group_members = Table(
    "group_members",
    metadata,
    Column("group_id", Text, nullable=False),
    Column("member_id", Text, nullable=False),
    # Static membership (KIP-345): a restarted instance replaces its old member at once.
    Column("group_instance_id", Text),
    Column("client_id", Text, nullable=False, server_default=text("''")),
    # Where a wire member connects from, as Kafka shows it ("/127.0.0.1"); empty in process.
    Column("client_host", Text, nullable=False, server_default=text("''")),
    # The generation this member has joined; behind the group's while a rebalance runs.
    Column("generation_id", Integer, nullable=False),
    Column("topics", JSONB, nullable=False),
    Column("assignment", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    # Classic groups: the protocols the member supports, in its order of preference, with
    # its metadata for each; the leader's assignment for it, as opaque bytes.
    Column("protocol_names", ARRAY(Text)),
    Column("protocol_metadata", ARRAY(LargeBinary)),
    Column("member_assignment", LargeBinary),
    Column("session_timeout_ms", Integer, nullable=False),
    # How long the member has to rejoin once a rebalance starts; NULL: no limit but the
    # session timeout.
    Column("rebalance_timeout_ms", Integer),
    Column("last_heartbeat_ms", BigInteger, nullable=False),
    Column("joined_ms", BigInteger, nullable=False),
    PrimaryKeyConstraint("group_id", "member_id"),
    ForeignKeyConstraint(["group_id"], ["consumer_groups.group_id"], ondelete="CASCADE"),
)

# KIP-394: the member ids a classic group handed out with MEMBER_ID_REQUIRED, until their
# member joins with one (a member then) or its session timeout passes (forgotten).
group_pending_members = Table(
    "group_pending_members",
    metadata,
    Column("group_id", Text, nullable=False),
    Column("member_id", Text, nullable=False),
    Column("expires_ms", BigInteger, nullable=False),
    PrimaryKeyConstraint("group_id", "member_id"),
    ForeignKeyConstraint(["group_id"], ["consumer_groups.group_id"], ondelete="CASCADE"),
)

# KIP-848's consumer group members (the projection of consumer_group_events): epochs,
# subscription, and the partitions assigned, pending revocation and targeted, each a
# JSON object of topic -> partitions.
consumer_group_members = Table(
    "consumer_group_members",
    metadata,
    Column("group_id", Text, nullable=False),
    Column("member_id", Text, nullable=False),
    Column("instance_id", Text),
    Column("rack_id", Text),
    Column("client_id", Text, nullable=False, server_default=text("''")),
    Column("client_host", Text, nullable=False, server_default=text("''")),
    Column("subscribed_topic_names", JSONB, nullable=False),
    Column("subscribed_topic_regex", Text),
    Column("server_assignor", Text),
    Column("rebalance_timeout_ms", Integer, nullable=False),
    Column("member_epoch", Integer, nullable=False),
    Column("previous_member_epoch", Integer, nullable=False),
    Column("state", Text, nullable=False),
    Column("assigned", JSONB, nullable=False),
    Column("pending_revocation", JSONB, nullable=False),
    Column("target", JSONB, nullable=False),
    # Per partition it owns, the member epoch it was assigned at: a commit of an earlier
    # epoch passes for a partition it owned then (KIP-1251).
    Column("assignment_epochs", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("last_heartbeat_ms", BigInteger, nullable=False),
    # While it holds partitions it was asked to revoke: when its rebalance timeout ends.
    Column("revocation_deadline_ms", BigInteger),
    Column("joined_ms", BigInteger, nullable=False),
    # NULL: a member of the consumer protocol; else a classic member of a consumer group
    # (KIP-848's online conversion): its session timeout and the protocols its JoinGroup
    # carried.
    Column("classic_member", JSONB),
    PrimaryKeyConstraint("group_id", "member_id"),
    ForeignKeyConstraint(["group_id"], ["consumer_groups.group_id"], ondelete="CASCADE"),
)

# Every group epoch, target assignment and member epoch change of a consumer group.
consumer_group_events = Table(
    "consumer_group_events",
    metadata,
    Column("event_id", BigInteger, Identity(), primary_key=True),
    Column("group_id", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("member_id", Text),
    Column("group_epoch", Integer, nullable=False),
    Column("member_epoch", Integer),
    Column("detail", JSONB),
    Column("event_ms", BigInteger, nullable=False),
)
Index("ix_consumer_group_events_group_id", consumer_group_events.c.group_id)

# ---------------------------------------------------------------- read_committed materialisation
# Maintained by app.spark.materialize; the column list of read_committed_records is part
# of the public contract (docs/design.md, the Spark materialisation). Rows only ever arrive
# together with the progress row that covers them (one PostgreSQL transaction), so
# up_to_offset is the exclusive bound below which the table is complete. The table is
# partitioned by range of (topic, partition, offset): a run's rows arrive as partitions
# Spark wrote, attached in that transaction, each registered in read_committed_partitions.

read_committed_records = Table(
    "read_committed_records",
    metadata,
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("offset", BigInteger, nullable=False),
    Column("key", LargeBinary),
    Column("value", LargeBinary),
    Column("headers", JSONB),
    Column("timestamp", BigInteger, nullable=False),
    Column("producer_id", BigInteger, nullable=False),
    PrimaryKeyConstraint("topic", "partition", "offset"),
    postgresql_partition_by='RANGE (topic, partition, "offset")',
)

# One row per partition of read_committed_records: the table holding one topic
# partition's offsets [from_offset, to_offset), and the rows it had when attached (a
# compaction's measure of small). Written by the transaction that attaches or drops it.
read_committed_partitions = Table(
    "read_committed_partitions",
    metadata,
    Column("table_name", Text, nullable=False),
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("from_offset", BigInteger, nullable=False),
    Column("to_offset", BigInteger, nullable=False),
    Column("row_count", BigInteger, nullable=False),
    PrimaryKeyConstraint("table_name"),
)

# Deleting a topic deletes its progress, so a topic created again under the same name is
# materialised from scratch rather than trusted to an offset of its predecessor.
materialization_progress = Table(
    "materialization_progress",
    metadata,
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("up_to_offset", BigInteger, nullable=False),
    PrimaryKeyConstraint("topic", "partition"),
    ForeignKeyConstraint(
        ["topic", "partition"],
        ["partitions.topic", "partitions.partition"],
        ondelete="CASCADE",
    ),
)

# ---------------------------------------------------------------- the Spark sink
# One row per micro-batch a streaming query's kip98 sink committed, written in the DB
# transaction that commits the batch's transactions (app.broker.prepared): a batch Spark
# replays finds its row and is not written again.
spark_sink_commits = Table(
    "spark_sink_commits",
    metadata,
    Column("query_id", Text, nullable=False),
    Column("batch_id", BigInteger, nullable=False),
    Column("row_count", BigInteger, nullable=False),
    Column(
        "committed_ms",
        BigInteger,
        nullable=False,
        server_default=text("(extract(epoch FROM now()) * 1000)::bigint"),
    ),
    PrimaryKeyConstraint("query_id", "batch_id"),
)

# ---------------------------------------------------------------- authorization
# Kafka's ACLs (app.security): who may do what to which resource. The whole row is the key,
# so creating an ACL twice is a no-op, as with Kafka's kafka-acls.sh. The key leads with
# (principal, resource_type): a request reads the caller's and User:*'s rows for the
# resource types it touches.

acls = Table(
    "acls",
    metadata,
    Column("principal", Text, nullable=False),
    Column("resource_type", Text, nullable=False),
    Column("resource_name", Text, nullable=False),
    Column("pattern_type", Text, nullable=False),
    Column("operation", Text, nullable=False),
    Column("permission", Text, nullable=False),
    PrimaryKeyConstraint(
        "principal", "resource_type", "resource_name", "pattern_type", "operation", "permission"
    ),
    CheckConstraint(
        "resource_type IN ('topic', 'group', 'transactional_id', 'cluster')", name="resource_type"
    ),
    CheckConstraint("pattern_type IN ('literal', 'prefixed')", name="pattern_type"),
    CheckConstraint(
        "operation IN ('read', 'write', 'create', 'delete', 'describe', 'alter', "
        "'cluster_action', 'all')",
        name="operation",
    ),
    CheckConstraint("permission IN ('allow', 'deny')", name="permission"),
)

# SASL users of ``kip98 serve``, kept as SCRAM keeps a credential (RFC 5802; SHA-512 keys
# for SCRAM-SHA-512 users, SHA-256 for the others): the salt, the iteration count,
# StoredKey and ServerKey, never the password nor anything a client could log in with.
sasl_users = Table(
    "sasl_users",
    metadata,
    # A user has a credential per mechanism, as Kafka's SCRAM users do (both SCRAM ones
    # at once, say); it logs in by any of them.
    Column("name", Text, primary_key=True),
    Column("mechanism", Text, primary_key=True),
    Column("salt", LargeBinary, nullable=False),
    Column("iterations", Integer, nullable=False),
    Column("stored_key", LargeBinary, nullable=False),
    Column("server_key", LargeBinary, nullable=False),
    Column("created_ms", BigInteger, nullable=False),
    CheckConstraint("mechanism IN ('PLAIN', 'SCRAM-SHA-256', 'SCRAM-SHA-512')", name="mechanism"),
)

# ---------------------------------------------------------------- cluster of kip98 serve nodes

# The ``kip98 serve`` nodes sharing this database (Kafka's broker registrations): each
# keeps its row alive with a lease it renews (a heartbeat), and the rows whose lease has
# not lapsed are the live nodes Metadata lists and leadership is spread over. A row is
# removed when its node stops, or by any node once its lease has lapsed; its node id is
# then free again. ``incarnation`` tells a node its own row from a later holder of its id.
broker_registrations = Table(
    "broker_registrations",
    metadata,
    Column("node_id", Integer, primary_key=True, autoincrement=False),
    Column("incarnation", UUID(as_uuid=True), nullable=False),
    Column("rack", Text),
    # The advertised address of each listener, by security protocol:
    # {"PLAINTEXT": {"host": ..., "port": ...}, ...}.
    Column("listeners", JSONB, nullable=False),
    Column("host", Text, nullable=False),  # the machine it runs on, and its process id
    Column("pid", Integer, nullable=False),
    Column("registered_ms", BigInteger, nullable=False),
    Column("heartbeat_ms", BigInteger, nullable=False),
    Column("expires_ms", BigInteger, nullable=False),
    # Requests the node had answered at its last heartbeat.
    Column("requests", BigInteger, nullable=False, server_default=text("0")),
    CheckConstraint("node_id >= 0", name="node_id_not_negative"),
)
