"""Every SQL statement of the log cleaner (retention and compaction), in one place.

Locking: the cleaner only ever removes records below the partition's last stable offset,
which appends and markers never touch (they write at the high watermark), so removing needs
no partition lock. Only moving ``log_start_offset`` (and evicting producer state with it)
takes the partition row lock, for a few statements. Two cleaners never work one partition
at once: each holds a session advisory lock on it for the pass.
"""

from __future__ import annotations

from sqlalchemy import TextClause, text

# Bytes a record counts for in retention.bytes and the removed-bytes metric.
RECORD_SIZE = (
    "(24 + coalesce(octet_length(r.key), 0) + coalesce(octet_length(r.value), 0)"
    " + coalesce(octet_length(r.headers::text), 0))"
)


def removing(delete: str, first: str = "") -> TextClause:
    """A DELETE of records (aliased ``r``) as a statement answering (records removed,
    bytes removed), the sizes counted as retention.bytes counts them. ``first``: common
    table expressions the DELETE reads, ending with a comma."""
    return text(
        f"""
        WITH {first} gone AS (
            {delete}
            RETURNING {RECORD_SIZE} AS size
        )
        SELECT count(*), coalesce(sum(size), 0) FROM gone
        """
    )


TRY_LOCK = text("SELECT pg_try_advisory_lock(hashtext('kip98.cleaner'), hashtext(:key))")
UNLOCK = text("SELECT pg_advisory_unlock(hashtext('kip98.cleaner'), hashtext(:key))")

PARTITIONS = text(
    """
    SELECT p.topic, p.partition, t.config, p.log_start_offset, p.next_offset,
           p.last_stable_offset, coalesce(c.snapshot_offset, 0) AS snapshot_offset
    FROM partitions p
    JOIN topics t ON t.topic = p.topic
    LEFT JOIN log_cleaner_checkpoints c ON c.topic = p.topic AND c.partition = p.partition
    WHERE (CAST(:topic AS text) IS NULL OR p.topic = :topic)
    ORDER BY p.topic, p.partition
    """
)

PARTITION = text(
    """
    SELECT p.log_start_offset, p.next_offset, p.last_stable_offset,
           coalesce(c.snapshot_offset, 0) AS snapshot_offset
    FROM partitions p
    LEFT JOIN log_cleaner_checkpoints c ON c.topic = p.topic AND c.partition = p.partition
    WHERE p.topic = :topic AND p.partition = :partition
    """
)

LOCK_PARTITION = text(
    """
    SELECT log_start_offset, last_stable_offset FROM partitions
    WHERE topic = :topic AND partition = :partition FOR UPDATE
    """
)

# The batch holding an offset, or the next batch after a gap: its base is where a batch
# boundary at or below the offset lies.
BATCH_BASE_AT = text(
    """
    SELECT batch_base_offset FROM records
    WHERE topic = :topic AND partition = :partition AND "offset" >= :offset
    ORDER BY "offset" LIMIT 1
    """
)

# retention.ms: the first record young enough to keep; everything before it may go.
FIRST_YOUNG = text(
    """
    SELECT min("offset") FROM records
    WHERE topic = :topic AND partition = :partition
      AND "offset" >= :from_offset AND "offset" < :to_offset AND "timestamp" >= :cutoff
    """
)

# retention.bytes: the last offset whose suffix of the log is still over the limit.
LAST_OVER_SIZE = text(
    f"""
    SELECT "offset" FROM (
        SELECT "offset", sum({RECORD_SIZE}) OVER (ORDER BY "offset" DESC) AS tail
        FROM records r
        WHERE topic = :topic AND partition = :partition
          AND "offset" >= :from_offset AND "offset" < :to_offset
    ) s
    WHERE tail > :limit ORDER BY "offset" DESC LIMIT 1
    """
)

ADVANCE_LOG_START = text(
    """
    UPDATE partitions SET log_start_offset = :log_start
    WHERE topic = :topic AND partition = :partition AND log_start_offset < :log_start
    """
)

# Producer state wholly below the new log start goes with it (Kafka evicts it too); an
# open transaction's state never does (its first offset is at or above the LSO).
EVICT_PRODUCERS = text(
    """
    DELETE FROM producer_states
    WHERE topic = :topic AND partition = :partition
      AND last_offset < :log_start AND txn_first_offset IS NULL
    RETURNING producer_id
    """
)
EVICT_SNAPSHOT_PRODUCERS = text(
    """
    DELETE FROM producer_snapshots
    WHERE topic = :topic AND partition = :partition AND producer_id = ANY(:producer_ids)
    """
)
DROP_ABORTED_BELOW = text(
    """
    DELETE FROM aborted_txns
    WHERE topic = :topic AND partition = :partition AND last_offset < :log_start
    """
)

DROP_SNAPSHOT = text(
    "DELETE FROM producer_snapshots WHERE topic = :topic AND partition = :partition"
)

SET_SNAPSHOT_OFFSET = text(
    """
    INSERT INTO log_cleaner_checkpoints (topic, partition, snapshot_offset)
    VALUES (:topic, :partition, :snapshot_offset)
    ON CONFLICT (topic, partition) DO UPDATE SET snapshot_offset = EXCLUDED.snapshot_offset
    """
)

COUNT_REMOVED = text(
    """
    INSERT INTO log_cleaner_checkpoints AS c
        (topic, partition, cleaned_ms, records_removed, bytes_removed)
    VALUES (:topic, :partition, :now, :records, :bytes)
    ON CONFLICT (topic, partition) DO UPDATE SET
        cleaned_ms = EXCLUDED.cleaned_ms,
        records_removed = c.records_removed + EXCLUDED.records_removed,
        bytes_removed = c.bytes_removed + EXCLUDED.bytes_removed
    """
)

# Records below the log start, a slice at a time (each slice its own transaction).
DELETE_BELOW_LOG_START = removing(
    """
        DELETE FROM records r
        WHERE r.topic = :topic AND r.partition = :partition
          AND r."offset" >= :from_offset AND r."offset" < :to_offset
    """
)
FIRST_RECORD = text(
    """
    SELECT min("offset") FROM records WHERE topic = :topic AND partition = :partition
    """
)

# ---------------------------------------------------------------- compaction
# All of these work on [:log_start, :limit) of one partition, :limit being at or below the
# LSO. Each returns (records removed, bytes removed).

# Data of aborted transactions, found through the aborted index as a consumer would.
DELETE_ABORTED_DATA = removing(
    """
        DELETE FROM records r USING aborted_txns a
        WHERE r.topic = :topic AND r.partition = :partition
          AND a.topic = :topic AND a.partition = :partition
          AND a.last_offset >= :log_start AND a.first_offset < :limit
          AND r."offset" >= :log_start AND r."offset" < :limit
          AND r.producer_id = a.producer_id
          AND r."offset" BETWEEN a.first_offset AND a.last_offset
          AND r.is_transactional AND NOT r.is_control
    """
)

# A keyed record with a later record of the same key below the limit. The doomed rows are
# found once (an init plan: one sort over the range) and deleted by their row address (a
# TID scan), a plan that stays cheap whatever the statistics say; a join on the unindexed
# key, or on a subquery the planner thinks returns one row, can turn into a nested loop
# over the range. Records are never updated and one cleaner works a partition at a time,
# so the addresses hold for the statement.
DELETE_SUPERSEDED = removing(
    """
        DELETE FROM records r
        WHERE r.ctid = ANY(ARRAY(
            SELECT ctid FROM (
                SELECT ctid, "offset", max("offset") OVER (PARTITION BY key) AS latest
                FROM records
                WHERE topic = :topic AND partition = :partition
                  AND "offset" >= :log_start AND "offset" < :limit
                  AND NOT is_control AND key IS NOT NULL
            ) k
            WHERE "offset" < latest))
    """
)

# Tombstones the cleaner first passed more than delete.retention.ms ago (any older value
# of their key is gone by now): those below the furthest pass that old.
DELETE_TOMBSTONES = removing(
    """
        DELETE FROM records r
        WHERE r.topic = :topic AND r.partition = :partition
          AND r."offset" >= :log_start AND r."offset" < :limit
          AND NOT r.is_control AND r.key IS NOT NULL AND r.value IS NULL
          AND r."offset" < (
              SELECT coalesce(max(up_to_offset), 0) FROM cleaner_tombstone_passes
              WHERE topic = :topic AND partition = :partition AND passed_ms < :horizon)
    """
)

# This pass, if it reached further than any before: the records in between are passed
# for the first time now.
NOTE_PASS = text(
    """
    INSERT INTO cleaner_tombstone_passes (topic, partition, up_to_offset, passed_ms)
    SELECT :topic, :partition, :limit, :now
    WHERE NOT EXISTS (
        SELECT 1 FROM cleaner_tombstone_passes
        WHERE topic = :topic AND partition = :partition AND up_to_offset >= :limit)
    """
)

# Passes whose tombstones this pass has just removed are of no more use.
DROP_EXPIRED_PASSES = text(
    """
    DELETE FROM cleaner_tombstone_passes
    WHERE topic = :topic AND partition = :partition
      AND passed_ms < :horizon AND up_to_offset <= :limit
    """
)

# Markers whose transaction has no record left (its records lie between the producer's
# previous marker and this one) get their delete horizon: the time they were first seen
# empty (KIP-534).
MARK_EMPTY_MARKERS = text(
    """
    INSERT INTO cleaner_marker_horizons (topic, partition, "offset", empty_since_ms)
    SELECT :topic, :partition, m."offset", :now FROM (
        SELECT "offset", producer_id,
               lag("offset", 1, CAST(-1 AS bigint))
                   OVER (PARTITION BY producer_id ORDER BY "offset") AS previous
        FROM records
        WHERE topic = :topic AND partition = :partition AND is_control AND "offset" < :limit
    ) m
    WHERE m."offset" >= :log_start
      AND NOT EXISTS (
          SELECT 1 FROM records r
          WHERE r.topic = :topic AND r.partition = :partition
            AND r."offset" > m.previous AND r."offset" < m."offset"
            AND r.producer_id = m.producer_id AND NOT r.is_control)
    ON CONFLICT DO NOTHING
    """
)

# Markers empty for longer than delete.retention.ms go, with their aborted-index entries
# (an ABORT marker's) and their horizons, in one statement. This runs before the pass
# removes anything else, so a marker never goes in the pass that emptied its transaction.
DELETE_EXPIRED_MARKERS = removing(
    """
        DELETE FROM records r
        WHERE r.topic = :topic AND r.partition = :partition
          AND r."offset" = ANY(ARRAY(SELECT "offset" FROM expired)) AND r.is_control
    """,
    """
    expired AS MATERIALIZED (
        DELETE FROM cleaner_marker_horizons
        WHERE topic = :topic AND partition = :partition AND empty_since_ms < :horizon
        RETURNING "offset"
    ), unindexed AS (
        DELETE FROM aborted_txns a
        WHERE a.topic = :topic AND a.partition = :partition
          AND a.last_offset IN (SELECT "offset" FROM expired)
    ),
    """,
)

# Whether a marker or a tombstone has come due since the last pass.
EXPIRED_HORIZONS = text(
    """
    SELECT EXISTS (
        SELECT 1 FROM cleaner_marker_horizons
        WHERE topic = :topic AND partition = :partition AND empty_since_ms < :horizon)
    OR EXISTS (
        SELECT 1 FROM cleaner_tombstone_passes
        WHERE topic = :topic AND partition = :partition AND passed_ms < :horizon)
    """
)

DROP_HORIZONS_BELOW = text(
    """
    DELETE FROM cleaner_marker_horizons
    WHERE topic = :topic AND partition = :partition AND "offset" < :log_start
    """
)
DROP_PASSES_BELOW = text(
    """
    DELETE FROM cleaner_tombstone_passes
    WHERE topic = :topic AND partition = :partition AND up_to_offset <= :log_start
    """
)

# What a pass examined: the records below its limit.
COUNT_RANGE = text(
    """
    SELECT count(*) FROM records
    WHERE topic = :topic AND partition = :partition
      AND "offset" >= :log_start AND "offset" < :limit
    """
)

# ---------------------------------------------------------------- DeleteRecords

# The same lock as TRY_LOCK, waited for (within the session's lock_timeout): a DeleteRecords
# waits for a cleaning pass over the partition to end rather than failing.
LOCK = text("SELECT pg_advisory_lock(hashtext('kip98.cleaner'), hashtext(:key))")

# The first batch boundary at or after an offset: the offset itself when a batch starts
# there, else where the next batch starts (NULL: the batch holding it is the log's last).
BOUNDARY_FROM = text(
    """
    SELECT batch_base_offset FROM records
    WHERE topic = :topic AND partition = :partition AND "offset" >= :offset
      AND batch_base_offset >= :offset
    ORDER BY "offset" LIMIT 1
    """
)

TOPIC_CONFIG = text("SELECT config FROM topics WHERE topic = :topic")
