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
# The group's committed offsets (the view also lists partitions assigned, not committed).
GROUP_LAG = text(
    "SELECT group_id, topic, partition, committed_offset, high_watermark, "
    "last_stable_offset, lag FROM consumer_group_lag WHERE group_id = :group_id "
    "AND committed_offset IS NOT NULL ORDER BY topic, partition"
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
# The commits among the coordinator's last :limit events (by primary key) that fall after
# :since, with their latency (COMPLETE_COMMIT less the PREPARE_COMMIT before it), and the
# oldest of those events' time and their count (so the caller knows where they stop).
RECENT_COMMITS = text(
    """
    SELECT updated_ms, latency_ms, oldest_ms, events FROM (
        SELECT state, updated_ms,
               CASE WHEN lag(state) OVER w = 'PREPARE_COMMIT'
                    THEN updated_ms - lag(updated_ms) OVER w END AS latency_ms,
               min(updated_ms) OVER () AS oldest_ms, count(*) OVER () AS events
        FROM (SELECT event_id, transactional_id, state, updated_ms FROM transaction_log
              ORDER BY event_id DESC LIMIT :limit) e
        WINDOW w AS (PARTITION BY transactional_id ORDER BY event_id)
    ) c
    WHERE state = 'COMPLETE_COMMIT' AND updated_ms > :since
    """
)
# For each of the given partitions and moments (:ends), when the oldest transaction open
# on it then was added to it: from the spans of the transactions in the coordinator's last
# :limit events (added at the first event naming the partition, ended at their COMPLETE_*)
# and of those still open; a transaction the coordinator holds open on a partition with
# nothing open now ends at :closed_ms, the partition's last record (KIP-664's abort).
OLDEST_OPEN_AT = text(
    """
    WITH e AS (
        SELECT transactional_id, txn_start_ms, state, partitions, updated_ms
        FROM transaction_log ORDER BY event_id DESC LIMIT :limit
    ),
    still_open AS (
        SELECT transactional_id, txn_start_ms, partitions FROM transactions
        WHERE state IN ('BEGIN', 'PREPARE_COMMIT', 'PREPARE_ABORT')
    ),
    ended AS (
        SELECT transactional_id, txn_start_ms, max(updated_ms) AS end_ms FROM e
        WHERE state IN ('COMPLETE_COMMIT', 'COMPLETE_ABORT') GROUP BY 1, 2
    ),
    asked AS (
        SELECT * FROM unnest(CAST(:topics AS text[]), CAST(:partitions AS int[]),
                             CAST(:closed_ms AS bigint[])) AS a(topic, partition, closed_ms)
    ),
    added AS (
        SELECT e.transactional_id, e.txn_start_ms, tp->>0 AS topic,
               (tp->>1)::int AS partition, e.updated_ms AS start_ms
        FROM e CROSS JOIN LATERAL jsonb_array_elements(e.partitions) AS tp
        UNION ALL
        SELECT o.transactional_id, o.txn_start_ms, tp->>0, (tp->>1)::int, o.txn_start_ms
        FROM still_open o CROSS JOIN LATERAL jsonb_array_elements(o.partitions) AS tp
    ),
    spans AS (
        SELECT a.topic, a.partition, min(a.start_ms) AS start_ms,
               COALESCE(n.end_ms, asked.closed_ms) AS end_ms
        FROM added a
        JOIN asked ON asked.topic = a.topic AND asked.partition = a.partition
        LEFT JOIN ended n ON n.transactional_id = a.transactional_id
                         AND n.txn_start_ms = a.txn_start_ms
        WHERE n.end_ms IS NOT NULL
           OR a.transactional_id IN (SELECT transactional_id FROM still_open)
        GROUP BY a.transactional_id, a.txn_start_ms, a.topic, a.partition, n.end_ms,
                 asked.closed_ms
    )
    SELECT s.topic, s.partition, x.at, min(s.start_ms) AS oldest_ms
    FROM spans s JOIN unnest(CAST(:ends AS bigint[])) AS x(at)
      ON s.start_ms <= x.at AND (s.end_ms IS NULL OR s.end_ms > x.at)
    GROUP BY 1, 2, 3
    """
)
