"""The console's own statements: only what no library already has a statement for.

Everything else is read with the admin SQL views (docs/sql.md) and the libraries' own
statements (``app.log.sql``, ``app.coordinator``, ``app.groups.sql``). Every value comes in
as a bound parameter.
"""

from __future__ import annotations

from sqlalchemy import text

TOPICS = text("SELECT topic FROM topics ORDER BY topic")
TOPIC_CONFIG = text("SELECT config FROM topics WHERE topic = :topic")
PARTITION_STATUS = text(
    "SELECT topic, partition, log_start_offset, high_watermark, last_stable_offset, "
    "open_transactions FROM partition_status WHERE topic = ANY(:topics) "
    "ORDER BY topic, partition"
)
OPEN_TRANSACTIONS = text(
    "SELECT transactional_id, state, started_at, "
    "(EXTRACT(EPOCH FROM started_at) * 1000)::bigint AS started_ms "
    "FROM open_transactions ORDER BY started_at"
)
CLUSTER_NODES = text(
    "SELECT node_id, host, pid, registered_at, last_heartbeat_at, lease_expires_at "
    "FROM cluster_nodes ORDER BY node_id"
)
COORDINATOR_LEASES = text(
    "SELECT owner, count(*) AS leases, max(expires_ms) AS expires_ms "
    "FROM coordinator_leases WHERE owner IS NOT NULL GROUP BY owner ORDER BY owner"
)
# The standbys as the primary sees them (empty on a standalone database).
STANDBYS = text(
    "SELECT application_name, client_addr, state, "
    "COALESCE(EXTRACT(EPOCH FROM replay_lag) * 1000, 0) AS replay_lag_ms "
    "FROM pg_stat_replication ORDER BY application_name"
)
IN_RECOVERY = text("SELECT pg_is_in_recovery()")
# The log's size on disk (the records table with its index and TOAST: a lookup of its
# files' sizes, no scan) and the offsets all partitions span, which share it out: a topic's
# or a partition's size is estimated as the log's size times its share of those offsets
# (``data.estimated_bytes``). kip98 keeps no byte count per topic or partition (records is
# one table, and a batch keeps no length), and an exact figure would read every record.
LOG_SIZE = text(
    "SELECT pg_total_relation_size('records'::regclass) AS bytes, "
    "(SELECT COALESCE(sum(next_offset - log_start_offset), 0) FROM partitions) AS offsets"
)
# A transactional id's history: the coordinator's events, oldest first (the index on
# transactional_id serves it).
TXN_EVENTS = text(
    "SELECT event_id, producer_id, producer_epoch, state, partitions, txn_start_ms, "
    "updated_ms, coordinator_epoch, reason FROM transaction_log "
    "WHERE transactional_id = :tid ORDER BY event_id LIMIT :limit"
)
# The transactional ids producer ids were allocated to (``producer_ids``' primary key).
TRANSACTIONAL_IDS_OF = text(
    "SELECT producer_id, transactional_id FROM producer_ids "
    "WHERE producer_id = ANY(:pids) AND transactional_id IS NOT NULL"
)
# The markers written on partitions by a producer id: the log's control records.
MARKERS_OF = text(
    'SELECT topic, partition, "offset", control_type, "timestamp", producer_epoch '
    "FROM records WHERE is_control AND producer_id = ANY(:pids) "
    'AND topic = ANY(:topics) ORDER BY "timestamp", topic, partition LIMIT :limit'
)
GROUP_LAG = text(
    "SELECT group_id, topic, partition, committed_offset, high_watermark, "
    "last_stable_offset, lag FROM consumer_group_lag WHERE group_id = :group_id "
    "ORDER BY topic, partition"
)
# The overview's series (``series``), read from the tables for the window shown.
# Each partition with a record in the window: the records at high watermark - d for d =
# 1, √2, 2, … and at its log start, by primary key (at most 82 point reads a partition;
# the EXISTS one more).
OFFSET_PROBES = text(
    """
    SELECT p.topic, p.partition, p.next_offset, p.last_stable_offset, r."offset", r."timestamp"
    FROM partitions p
    CROSS JOIN LATERAL (
        SELECT p.next_offset - floor(power(2, k / 2.0))::bigint AS at
        FROM generate_series(0, 80) AS k
        UNION SELECT p.log_start_offset
    ) d
    JOIN records r ON r.topic = p.topic AND r.partition = p.partition AND r."offset" = d.at
    WHERE d.at >= p.log_start_offset
      AND EXISTS (SELECT 1 FROM records l WHERE l.topic = p.topic
                  AND l.partition = p.partition AND l."offset" = p.next_offset - 1
                  AND l."timestamp" >= :since)
    """
)
# The coordinator's last events, newest first, by primary key.
RECENT_EVENTS = text(
    "SELECT event_id, transactional_id, state, partitions, txn_start_ms, updated_ms "
    "FROM transaction_log ORDER BY event_id DESC LIMIT :limit"
)
OPEN_TRANSACTION_SPANS = text(
    "SELECT transactional_id, txn_start_ms, partitions FROM transactions "
    "WHERE state IN ('BEGIN', 'PREPARE_COMMIT', 'PREPARE_ABORT')"
)
