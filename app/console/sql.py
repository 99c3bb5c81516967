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
    "SELECT transactional_id, state, started_at FROM open_transactions ORDER BY started_at"
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
# The log's size on disk: the records table with its index and TOAST, every topic's
# records together (a file-size lookup, no scan). kip98 keeps no per-topic or
# per-partition byte count (records is one table; a batch keeps no length), so a finer
# figure would mean reading every record (docs/console.md).
LOG_SIZE = text("SELECT pg_total_relation_size('records'::regclass)")
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
# The overview's samples (``samples``): the offsets summed over the partitions, and the
# coordinator's events since the last sample.
OFFSET_TOTALS = text(
    "SELECT sum(next_offset) AS records, sum(next_offset - last_stable_offset) AS lso_lag "
    "FROM partitions"
)
LAST_EVENT_ID = text("SELECT max(event_id) FROM transaction_log")
EVENTS_AFTER = text(
    "SELECT event_id, transactional_id, state, updated_ms FROM transaction_log "
    "WHERE event_id > :after ORDER BY event_id LIMIT :limit"
)
