"""Every SQL statement of the partition-log family (topics, partitions, records, producer
state, aborted index), in one place so the locking story can be read at a glance.

Locking: an append or a marker takes its partition row ``FOR UPDATE`` first and holds it
to COMMIT (DESIGN §3.1), so offsets are gapless and commit in order; producer_states and
aborted_txns rows of a partition are only written under that lock.
"""

from __future__ import annotations

from sqlalchemy import text

# The columns of a produce's binary COPY, in the order ``app.log.copy_records`` writes
# them: first the fields that are the same for the whole batch (and headers, NULL in most
# batches), then a record's integers side by side, so one struct call packs them, then key
# and value.
COPY_RECORD_COLUMNS = (
    "topic",
    "partition",
    "producer_id",
    "producer_epoch",
    "batch_base_offset",
    "is_transactional",
    "is_control",
    "control_type",
    "coordinator_epoch",
    "headers",
    "offset",
    "timestamp",
    "sequence",
    "key",
    "value",
)
COPY_RECORDS = "COPY records ({}) FROM STDIN (FORMAT BINARY)".format(
    ", ".join(f'"{c}"' for c in COPY_RECORD_COLUMNS)
)

# The statements below run on the psycopg connection directly (``app.log.partition_lock``),
# with psycopg's placeholders: they run once per batch on the produce path, where
# SQLAlchemy's per-statement work shows.

# The partition row lock, and the producer's state read in the same round trip.
LOCK_PARTITION = """
    SELECT p.next_offset, p.log_start_offset, p.last_stable_offset,
           s.producer_id AS s_producer_id, s.producer_epoch AS s_producer_epoch,
           s.last_sequence AS s_last_sequence, s.last_offset AS s_last_offset,
           s.last_timestamp AS s_last_timestamp, s.batches AS s_batches,
           s.coordinator_epoch AS s_coordinator_epoch, s.txn_first_offset AS s_txn_first_offset
    FROM partitions p
    LEFT JOIN producer_states s
      ON s.topic = p.topic AND s.partition = p.partition AND s.producer_id = %(producer_id)s
    WHERE p.topic = %(topic)s AND p.partition = %(partition)s
    FOR UPDATE OF p
"""

ADVANCE_PARTITION = """
    UPDATE partitions SET next_offset = %(next_offset)s, last_stable_offset = %(last_stable_offset)s
    WHERE topic = %(topic)s AND partition = %(partition)s
"""

ADVANCE_PARTITION_AND_UPSERT_PRODUCER = """
    WITH advanced AS (
        UPDATE partitions SET next_offset = %(next_offset)s, last_stable_offset = %(last_stable_offset)s
        WHERE topic = %(topic)s AND partition = %(partition)s
    )
    INSERT INTO producer_states AS s
        (topic, partition, producer_id, producer_epoch, last_sequence, last_offset,
         last_timestamp, batches, coordinator_epoch, txn_first_offset)
    VALUES (%(topic)s, %(partition)s, %(producer_id)s, %(producer_epoch)s, %(last_sequence)s,
            %(last_offset)s, %(last_timestamp)s, CAST(%(batches)s AS jsonb), %(coordinator_epoch)s,
            %(txn_first_offset)s)
    ON CONFLICT (topic, partition, producer_id) DO UPDATE SET
        producer_epoch = EXCLUDED.producer_epoch,
        last_sequence = EXCLUDED.last_sequence,
        last_offset = EXCLUDED.last_offset,
        last_timestamp = EXCLUDED.last_timestamp,
        batches = EXCLUDED.batches,
        coordinator_epoch = EXCLUDED.coordinator_epoch,
        txn_first_offset = EXCLUDED.txn_first_offset
"""

# The first offset of the earliest transaction still open on a partition, other than one
# producer's (the one whose marker is being written).
FIRST_OPEN_TXN_OFFSET = text(
    """
    SELECT min(txn_first_offset) FROM producer_states
    WHERE topic = :topic AND partition = :partition AND producer_id <> :producer_id
      AND txn_first_offset IS NOT NULL
    """
)

INSERT_ABORTED_TXN = text(
    """
    INSERT INTO aborted_txns (topic, partition, producer_id, first_offset, last_offset, last_stable_offset)
    VALUES (:topic, :partition, :producer_id, :first_offset, :last_offset, :last_stable_offset)
    """
)

PARTITION_OFFSETS = text(
    """
    SELECT next_offset, log_start_offset, last_stable_offset FROM partitions
    WHERE topic = :topic AND partition = :partition
    """
)

# read_uncommitted: every data record in range. Markers are filtered here, in SQL.
FETCH_UNCOMMITTED = text(
    """
    SELECT "offset", "timestamp", key, value, headers, producer_id FROM records
    WHERE topic = :topic AND partition = :partition
      AND "offset" >= :from_offset AND "offset" < :to_offset AND NOT is_control
    ORDER BY "offset" LIMIT :max_records
    """
)

# read_committed: below the LSO, without markers and without records of the aborted
# transactions overlapping the range. Those few ranges are read first (ABORTED_IN_RANGE)
# and passed in as arrays, so the filter is a tiny anti-join rather than an index probe
# per record; with none in range, FETCH_UNCOMMITTED bounded by the LSO does the job.
FETCH_COMMITTED = text(
    """
    SELECT r."offset", r."timestamp", r.key, r.value, r.headers, r.producer_id FROM records r
    WHERE r.topic = :topic AND r.partition = :partition
      AND r."offset" >= :from_offset AND r."offset" < :to_offset AND NOT r.is_control
      AND NOT (r.is_transactional AND EXISTS (
          SELECT 1 FROM unnest(CAST(:aborted_pids AS bigint[]), CAST(:aborted_firsts AS bigint[]),
                               CAST(:aborted_lasts AS bigint[])) AS a(producer_id, first_offset, last_offset)
          WHERE a.producer_id = r.producer_id AND r."offset" BETWEEN a.first_offset AND a.last_offset))
    ORDER BY r."offset" LIMIT :max_records
    """
)

# The aborted transactions overlapping a fetched range, as KIP-98's FetchResponse lists them.
ABORTED_IN_RANGE = text(
    """
    SELECT producer_id, first_offset, last_offset FROM aborted_txns
    WHERE topic = :topic AND partition = :partition
      AND last_offset >= :from_offset AND first_offset < :to_offset
    ORDER BY first_offset
    """
)

OFFSET_FOR_TIMESTAMP = text(
    """
    SELECT "offset", "timestamp" FROM records
    WHERE topic = :topic AND partition = :partition AND NOT is_control
      AND "timestamp" >= :timestamp AND "offset" >= :log_start AND "offset" < :upper
    ORDER BY "offset" LIMIT 1
    """
)

EXPIRE_PRODUCERS = text(
    """
    DELETE FROM producer_states
    WHERE last_timestamp <= :cutoff AND txn_first_offset IS NULL
    """
)

ALLOCATE_PRODUCER_ID = text(
    """
    INSERT INTO producer_ids (transactional_id, allocated_ms) VALUES (:transactional_id, :now)
    RETURNING producer_id
    """
)

# ---------------------------------------------------------------- admin inspection

DESCRIBE_PRODUCERS = text(
    """
    SELECT s.producer_id, s.producer_epoch, s.last_sequence, s.last_timestamp,
           s.coordinator_epoch, s.txn_first_offset
    FROM producer_states s WHERE s.topic = :topic AND s.partition = :partition
    ORDER BY s.producer_id
    """
)
HANGING = text(
    "SELECT topic, partition, producer_id, producer_epoch, start_offset, started_at FROM hanging_transactions "
    "ORDER BY topic, partition, start_offset"
)
OPEN_TXN_AT = text(
    """
    SELECT producer_id, producer_epoch, coordinator_epoch FROM producer_states
    WHERE topic = :topic AND partition = :partition AND txn_first_offset = :start_offset
    """
)
OPEN_ON_PARTITIONS = text(
    """
    SELECT s.topic, s.partition, s.producer_id, s.producer_epoch, s.txn_first_offset AS start_offset,
           to_timestamp(r."timestamp" / 1000.0) AS started_at, r."timestamp" AS started_ms
    FROM producer_states s
    JOIN records r ON r.topic = s.topic AND r.partition = s.partition AND r."offset" = s.txn_first_offset
    WHERE s.txn_first_offset IS NOT NULL
    """
)
