"""Every SQL statement of the partition-log family (topics, partitions, records, producer
state, aborted index), in one place so the locking story can be read at a glance.

Locking: an append or a marker takes its partition row ``FOR UPDATE`` first and holds it
to COMMIT (docs/design.md §3.1), so offsets are gapless and commit in order; producer_states and
aborted_txns rows of a partition are only written under that lock, and what decides a
write is read as it is once the lock is held (see LOCK_PARTITIONS).

Convention: statements run through SQLAlchemy are ``text()`` with ``:name`` parameters;
the hot path's, run on the psycopg connection under the caller's transaction
(``storage.driver.driver_connection``), are plain strings with psycopg's ``%(name)s``.
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

# The Produce handler's lock and advance, below, run on the psycopg connection directly
# (``app.log.partition_lock``), with psycopg's placeholders: they run once per batch on the
# produce path, where SQLAlchemy's per-statement work shows.

# A producer's state on a partition, in ``partition_lock.PartitionRow``'s order.
_PRODUCER_STATE_COLUMNS = """
    s.producer_id, s.producer_epoch, s.last_sequence, s.last_offset, s.last_timestamp,
    s.batches, s.coordinator_epoch, s.txn_first_offset
"""

# The producer-state upsert's tail, shared by appends and markers.
_UPSERT_PRODUCER_STATE = """
ON CONFLICT (topic, partition, producer_id) DO UPDATE SET
    producer_epoch = EXCLUDED.producer_epoch,
    last_sequence = EXCLUDED.last_sequence,
    last_offset = EXCLUDED.last_offset,
    last_timestamp = EXCLUDED.last_timestamp,
    batches = EXCLUDED.batches,
    coordinator_epoch = EXCLUDED.coordinator_epoch,
    txn_first_offset = EXCLUDED.txn_first_offset
"""

# A batch already appended, found again by its producer, epoch and base sequence: the
# answer to a retried request that committed (its offsets; searched from the log end, where
# a retried batch is), with the partition's log start.
RECORDED_BATCH = """
    SELECT r.batch_base_offset, p.log_start_offset FROM partitions p
    LEFT JOIN LATERAL (
        SELECT batch_base_offset FROM records
        WHERE topic = p.topic AND partition = p.partition AND producer_id = %(producer_id)s
          AND producer_epoch = %(producer_epoch)s AND sequence = %(base_sequence)s
          AND NOT is_control
        ORDER BY "offset" DESC LIMIT 1
    ) r ON true
    WHERE p.topic = %(topic)s AND p.partition = %(partition)s
"""

# The partition rows a request appends to (or marks) locked in one statement, in the order
# a Python sort of (topic, partition) gives (COLLATE "C", docs/design.md §3.3), each with
# the state of the producer named for it read alongside, and whether that read can be
# trusted (``unmoved``). At READ COMMITTED a statement that waited for a row lock re-reads
# only the row it locked: the state joined to it is the one of the statement's snapshot,
# from before the wait, and misses what the lock's holder wrote (a batch whose first
# attempt was finishing its COMMIT would be taken for a new one). Every transaction that
# writes a partition's producer states under its lock also updates the partition row
# (appends and markers move next_offset, the cleaner's eviction log_start_offset, a rebuild
# rewrites every row), and the lock is granted on the row's newest version; so when that
# version is the snapshot's (``unmoved``: the subquery reads with the snapshot, ``p`` is
# the version locked), no such write committed since the snapshot and the joined state is
# current. When it is not, PRODUCER_STATES reads the states again, a statement of its own
# started with the lock held: a second round trip only after a lock was waited for.
# (Always reading them that way, pipelined, made a one-batch produce ~15% slower on a local
# server; this check ~1%.)
LOCK_PARTITIONS = f"""
    SELECT p.topic, p.partition, p.next_offset, p.log_start_offset, p.last_stable_offset,
           p.max_message_bytes, p.log_append_time,
           {_PRODUCER_STATE_COLUMNS},
           p.ctid = (SELECT v.ctid FROM partitions v
                     WHERE v.topic = p.topic AND v.partition = p.partition) AS unmoved
    FROM unnest(CAST(%(topics)s AS text[]), CAST(%(partitions)s AS int[]),
                CAST(%(producer_ids)s AS bigint[])) AS u(topic, partition, producer_id)
    JOIN partitions p ON p.topic = u.topic AND p.partition = u.partition
    LEFT JOIN producer_states s
      ON s.topic = p.topic AND s.partition = p.partition AND s.producer_id = u.producer_id
    ORDER BY p.topic COLLATE "C", p.partition
    FOR UPDATE OF p
"""

# The one-query commit's lock (docs/design.md §3.11): the rows LOCK_PARTITIONS would lock,
# in the same order, with the versions (``xmin``, next_offset) of the rows locked (after a
# wait, the newest), for the caller to compare with the rows it decided on.
LOCK_PARTITION_VERSIONS = """
    SELECT p.topic, p.partition, CAST(p.xmin AS text), p.next_offset
    FROM unnest(CAST(%(topics)s AS text[]), CAST(%(partitions)s AS int[])) AS u(topic, partition)
    JOIN partitions p ON p.topic = u.topic AND p.partition = u.partition
    ORDER BY p.topic COLLATE "C", p.partition
    FOR UPDATE OF p
"""

# The partition rows' versions as the DB transaction's queued writes leave them, read
# after them in the same round trip (``broker.write``), for the process to remember once
# it commits (rule 32).
PARTITION_VERSIONS = """
    SELECT p.topic, p.partition, CAST(p.xmin AS text)
    FROM unnest(CAST(%(topics)s AS text[]), CAST(%(partitions)s AS int[])) AS u(topic, partition)
    JOIN partitions p ON p.topic = u.topic AND p.partition = u.partition
"""

# The state of the producer named for each partition, read once their locks are held.
PRODUCER_STATES = f"""
    SELECT s.topic, s.partition, {_PRODUCER_STATE_COLUMNS}
    FROM unnest(CAST(%(topics)s AS text[]), CAST(%(partitions)s AS int[]),
                CAST(%(producer_ids)s AS bigint[])) AS u(topic, partition, producer_id)
    JOIN producer_states s
      ON s.topic = u.topic AND s.partition = u.partition AND s.producer_id = u.producer_id
"""

# The producer states of appended batches (possibly none), as the parallel arrays ``s_*``
# give them; in the advances below, written only for partitions that advanced.
_WRITE_PRODUCER_STATES = f"""
    INSERT INTO producer_states AS s
        (topic, partition, producer_id, producer_epoch, last_sequence, last_offset,
         last_timestamp, batches, coordinator_epoch, txn_first_offset)
    SELECT topic, partition, producer_id, producer_epoch, last_sequence, last_offset,
           last_timestamp, CAST(batches AS jsonb), coordinator_epoch, txn_first_offset
    FROM unnest(CAST(%(s_topics)s AS text[]), CAST(%(s_partitions)s AS int[]),
                CAST(%(s_producer_ids)s AS bigint[]), CAST(%(s_producer_epochs)s AS int[]),
                CAST(%(s_last_sequences)s AS int[]), CAST(%(s_last_offsets)s AS bigint[]),
                CAST(%(s_last_timestamps)s AS bigint[]), CAST(%(s_batches)s AS text[]),
                CAST(%(s_coordinator_epochs)s AS int[]), CAST(%(s_txn_first_offsets)s AS bigint[]))
         AS u(topic, partition, producer_id, producer_epoch, last_sequence, last_offset,
              last_timestamp, batches, coordinator_epoch, txn_first_offset)
    WHERE EXISTS (SELECT FROM advanced a WHERE a.topic = u.topic AND a.partition = u.partition)
    {_UPSERT_PRODUCER_STATE}
"""

# The advance of several partitions after one COPY of all their batches: next offsets and
# LSOs, and the producer states of the idempotent batches, in one statement, returning each
# partition row's new version (``xmin``: the writing transaction's id), which the process
# remembers (rule 32).
ADVANCE_PARTITIONS = f"""
    WITH advanced AS (
        UPDATE partitions p SET next_offset = u.next_offset, last_stable_offset = u.lso
        FROM unnest(CAST(%(topics)s AS text[]), CAST(%(partitions)s AS int[]),
                    CAST(%(next_offsets)s AS bigint[]), CAST(%(lsos)s AS bigint[]))
             AS u(topic, partition, next_offset, lso)
        WHERE p.topic = u.topic AND p.partition = u.partition
        RETURNING p.topic, p.partition, CAST(p.xmin AS text) AS xmin
    ), states AS ({_WRITE_PRODUCER_STATES})
    SELECT topic, partition, xmin FROM advanced
"""

# The advance of one partition whose batch was decided on the row as this process last
# wrote it (rule 32), before its COPY: it advances, and the producer's state is written,
# only if the row is still that version (``xmin``, with the next offset it held: an
# earlier step of the same DB transaction may have written the row too); no row returned
# if not. At READ COMMITTED, an UPDATE that waited for the row's lock checks the version
# it locked. One producer's state, so its fields go as scalars: adapting the one-element
# arrays of ``_WRITE_PRODUCER_STATES`` cost the client more than the statement's round trip.
ADVANCE_REMEMBERED = f"""
    WITH advanced AS (
        UPDATE partitions SET next_offset = %(next_offset)s, last_stable_offset = %(lso)s
        WHERE topic = %(topic)s AND partition = %(partition)s
          AND xmin = CAST(%(xmin)s AS xid) AND next_offset = %(expected)s
        RETURNING topic, partition, CAST(xmin AS text) AS xmin
    ), states AS (
    INSERT INTO producer_states AS s
        (topic, partition, producer_id, producer_epoch, last_sequence, last_offset,
         last_timestamp, batches, coordinator_epoch, txn_first_offset)
    SELECT topic, partition, CAST(%(producer_id)s AS bigint), CAST(%(producer_epoch)s AS int),
           CAST(%(last_sequence)s AS int), CAST(%(last_offset)s AS bigint),
           CAST(%(last_timestamp)s AS bigint), CAST(%(batches)s AS jsonb),
           CAST(%(coordinator_epoch)s AS int), CAST(%(txn_first_offset)s AS bigint)
    FROM advanced
    {_UPSERT_PRODUCER_STATE})
    SELECT topic, partition, xmin FROM advanced
"""

# ADVANCE_REMEMBERED prepared once per session, for the lone batch sent with its COPY in
# one query string (docs/design.md §3.9): its values go as literals of an EXECUTE, in this
# order.
ADVANCE_REMEMBERED_NAME = "kip98_advance_remembered"
ADVANCE_REMEMBERED_PARAMS = (
    "topic", "partition", "next_offset", "lso", "xmin", "expected", "producer_id",
    "producer_epoch", "last_sequence", "last_offset", "last_timestamp", "batches",
    "coordinator_epoch", "txn_first_offset",
)  # fmt: skip

# Markers, set-based: all partitions of a transaction in three statements whatever their
# number (LOCK_PARTITIONS, the two below; PRODUCER_STATES too after a wait), run on the
# psycopg connection (``app.log.markers``).
# Per partition, the first offset of the earliest transaction still open other than one
# producer's (the one whose markers are being written). A statement of its own, run after
# the partition locks are held (pipelined behind LOCK_PARTITIONS: PostgreSQL starts it, and
# takes its snapshot, only once the locks are granted), so it sees every transaction
# opened before them; none can open on those partitions while they are held.
FIRST_OPEN_TXN_OFFSETS = """
    SELECT topic, partition, min(txn_first_offset) AS first_offset FROM producer_states
    WHERE (topic, partition) IN
          (SELECT * FROM unnest(CAST(%(topics)s AS text[]), CAST(%(partitions)s AS int[])))
      AND producer_id <> %(producer_id)s AND txn_first_offset IS NOT NULL
    GROUP BY topic, partition
"""

# One statement writes all markers of a transaction: the control records, the aborted-index
# entries (ABORT only), each partition's next offset and LSO, and the producer's state per
# partition (as producer_state.apply_marker computed it). One row per marked partition in
# the parallel arrays; offsets and LSOs were decided under the locks above.
WRITE_MARKERS = f"""
    WITH m AS (
        SELECT * FROM unnest(
            CAST(%(topics)s AS text[]), CAST(%(partitions)s AS int[]),
            CAST(%(offsets)s AS bigint[]),
            CAST(%(lsos)s AS bigint[]), CAST(%(closed_first_offsets)s AS bigint[]),
            CAST(%(s_producer_epochs)s AS int[]), CAST(%(s_last_sequences)s AS int[]),
            CAST(%(s_last_offsets)s AS bigint[]), CAST(%(s_last_timestamps)s AS bigint[]),
            CAST(%(s_batches)s AS text[]), CAST(%(s_coordinator_epochs)s AS int[]),
            CAST(%(s_txn_first_offsets)s AS bigint[]))
          AS m(topic, partition, "offset", lso, closed_first_offset, s_producer_epoch,
               s_last_sequence, s_last_offset, s_last_timestamp, s_batches,
               s_coordinator_epoch, s_txn_first_offset)
    ),
    marked AS (
        INSERT INTO records (topic, partition, "offset", "timestamp", key, value, headers,
            producer_id, producer_epoch, sequence, batch_base_offset, is_transactional,
            is_control, control_type, coordinator_epoch)
        SELECT topic, partition, "offset", %(timestamp)s, NULL, NULL, NULL, %(producer_id)s,
            %(producer_epoch)s, -1, "offset", true, true, %(control_type)s,
            %(coordinator_epoch)s
        FROM m
    ),
    aborted AS (
        INSERT INTO aborted_txns (topic, partition, producer_id, first_offset, last_offset,
            last_stable_offset)
        SELECT topic, partition, %(producer_id)s, closed_first_offset, "offset", lso FROM m
        WHERE %(is_abort)s
    ),
    advanced AS (
        UPDATE partitions p SET next_offset = m."offset" + 1, last_stable_offset = m.lso
        FROM m WHERE p.topic = m.topic AND p.partition = m.partition
    )
    INSERT INTO producer_states AS s
        (topic, partition, producer_id, producer_epoch, last_sequence, last_offset,
         last_timestamp, batches, coordinator_epoch, txn_first_offset)
    SELECT topic, partition, %(producer_id)s, s_producer_epoch, s_last_sequence,
           s_last_offset, s_last_timestamp, CAST(s_batches AS jsonb), s_coordinator_epoch,
           s_txn_first_offset
    FROM m
    {_UPSERT_PRODUCER_STATE}
"""

# Whether a topic of this name exists (a CreateTopics that only validates).
TOPIC_EXISTS = text("SELECT 1 FROM topics WHERE topic = :topic")
# Topic names that differ only in '.' against '_' collide (Kafka's metrics names cannot
# tell them apart): a creation holds this lock on the unified name for its DB transaction,
# so two colliding creations at once are decided one after the other.
LOCK_TOPIC_NAME = text(
    "SELECT pg_advisory_xact_lock(hashtext('kip98.topic_name'), hashtext(:unified))"
)
COLLIDING_TOPIC = text(
    "SELECT topic FROM topics WHERE replace(topic, '.', '_') = :unified AND topic <> :topic "
    "ORDER BY topic LIMIT 1"
)

PARTITION_OFFSETS = text(
    """
    SELECT next_offset, log_start_offset, last_stable_offset, leader_epoch FROM partitions
    WHERE topic = :topic AND partition = :partition
    """
)

# The fetch statements run on the DBAPI cursor (psycopg's placeholders, not SQLAlchemy's):
# their rows are the hot path of every consumer, and psycopg builds plain tuples in C where
# SQLAlchemy would wrap each in a Row. Columns come in RecordOut's order; headers stay JSON
# text (decoded by the client only when asked), so no JSON is parsed per row here.
#
# Both cut the read at max_bytes in SQL (Kafka's max.partition.fetch.bytes, or what is left
# of fetch.max.bytes): a running sum of record sizes, as ``copy_records.record_size_bytes``
# counts them (the overhead, key, value and headers' JSON text), over the records in offset
# order. octet_length of a bytea reads the length from the TOAST pointer, so a record past
# the limit costs its small row in the table, never its value: values are read from the
# TOAST table only as the kept rows are sent. The first record is kept even over the limit
# when min_one_record (Kafka returns at least one batch, here a record, so a consumer never
# stalls on a large one). After the kept records comes at most one more row, with only its
# offset (its other columns NULL, timestamp too, which no record has): the first record the
# limit left out, where the next fetch starts. Without it the whole window was read.
_FETCH_WITHIN_BYTES = """
    SELECT "offset", {columns}
    FROM (
        SELECT *, running <= %(max_bytes)s OR (rn = 1 AND %(min_one_record)s) AS kept,
               running - size <= %(max_bytes)s OR rn = 1 OR (rn = 2 AND %(min_one_record)s)
                 AS shown
        FROM (
            SELECT w.*, sum(size) OVER running_sum AS running, row_number() OVER running_sum AS rn
            FROM ({rows}) w
            WINDOW running_sum AS (ORDER BY "offset" ROWS UNBOUNDED PRECEDING)
            ORDER BY "offset" LIMIT %(max_records)s
        ) summed
    ) marked
    WHERE shown
    ORDER BY "offset"
    """


def _within_bytes(columns: tuple[str, ...], rows: str) -> str:
    """A fetch statement over ``rows`` returning ``columns`` after the offset, cut at
    max_bytes (the row past the cut has only its offset)."""
    kept = ", ".join(f"CASE WHEN kept THEN {column} END" for column in columns)
    return _FETCH_WITHIN_BYTES.format(columns=kept, rows=rows)


def _whole(columns: tuple[str, ...], rows: str) -> str:
    """A fetch statement over ``rows`` returning ``columns`` after the offset, for a window
    known to fit max_bytes (every row kept, none past a cut)."""
    return f'SELECT "offset", {", ".join(columns)} FROM ({rows}) w ORDER BY "offset"'


# RecordOut's columns after the offset.
_RECORD_COLUMNS = ('"timestamp"', "key", "value", "headers", "producer_id")

_RECORD_SIZE = """%(record_overhead)s + coalesce(octet_length(r.key), 0)
        + coalesce(octet_length(r.value), 0) + coalesce(octet_length(CAST(r.headers AS text)), 0)"""

# read_uncommitted: every data record in range. Markers are filtered here, in SQL.
_DATA_RECORDS = f"""
    SELECT r."offset", r."timestamp", r.key, r.value, CAST(r.headers AS text) AS headers,
           r.producer_id, {_RECORD_SIZE} AS size
    FROM records r
    WHERE r.topic = %(topic)s AND r.partition = %(partition)s
      AND r."offset" >= %(from_offset)s AND r."offset" < %(to_offset)s AND NOT r.is_control
"""
FETCH_UNCOMMITTED = _within_bytes(_RECORD_COLUMNS, _DATA_RECORDS)

# read_committed: below the LSO, without markers and without records of the aborted
# transactions overlapping the range. Those few ranges are read first (PARTITION_FOR_FETCH)
# and passed in as arrays, so the filter is a tiny anti-join rather than an index probe
# per record; with none in range, FETCH_UNCOMMITTED bounded by the LSO does the job. Their
# offset spans, merged once into a multirange (PostgreSQL 14+), let every record outside
# them skip the anti-join: most records, and the anti-join per record cost ~2x the scan.
# Records filtered out count no bytes: the running sum is over the records returned.
#
# ``NOT_ABORTED`` is that filter alone, over a query's records ``r`` (Spark's kip98 source
# reads its ranges with it).
NOT_ABORTED = """
      AND NOT (r.is_transactional
        AND r."offset" <@ (
          SELECT range_agg(int8range(first_offset, last_offset, '[]'))
          FROM unnest(CAST(%(aborted_firsts)s AS bigint[]), CAST(%(aborted_lasts)s AS bigint[]))
            AS s(first_offset, last_offset))
        AND EXISTS (
          SELECT 1 FROM unnest(CAST(%(aborted_pids)s AS bigint[]), CAST(%(aborted_firsts)s AS bigint[]),
                               CAST(%(aborted_lasts)s AS bigint[])) AS a(producer_id, first_offset, last_offset)
          WHERE a.producer_id = r.producer_id AND r."offset" BETWEEN a.first_offset AND a.last_offset))
    """
_COMMITTED_RECORDS = _DATA_RECORDS + NOT_ABORTED
FETCH_COMMITTED = _within_bytes(_RECORD_COLUMNS, _COMMITTED_RECORDS)

# The same reads for a window PARTITION_FOR_FETCH found to fit max_bytes whole (the
# common case: a consumer's window of ``fetch_max_records`` small records): no running
# sum, which over the wide rows cost as much as reading them (a 2000-record window read
# ~1.9x as long with it).
FETCH_UNCOMMITTED_WHOLE = _whole(_RECORD_COLUMNS, _DATA_RECORDS)
FETCH_COMMITTED_WHOLE = _whole(_RECORD_COLUMNS, _COMMITTED_RECORDS)

# The log as Kafka's fetch gives it (``FetchRequest.batches``, the wire protocol's): every
# record of the window, markers and aborted ones included, as ``protocol.LogRecord``. The
# window ends where PARTITION_FOR_BATCHES_FETCH's ``cut`` says max_bytes does, so no running sum
# is needed here: over the wide rows, one cost as much as reading the rows themselves. A
# batch's fields come once, in one array, on the record a run of it starts with in the
# window: its base or the window's first offset. Sent on every record they cost a quarter
# of the read. Where the cleaner removed a batch's first records, its run starts
# elsewhere: FETCH_LOG_EVERY_BATCH gives the fields on every record.
_LOG = """
    SELECT r."offset", r."timestamp", r.key, r.value, CAST(r.headers AS text) AS headers,
           r.batch_base_offset, {batch}
    FROM records r
    WHERE r.topic = %(topic)s AND r.partition = %(partition)s
      AND r."offset" >= %(from_offset)s AND r."offset" < %(to_offset)s
    ORDER BY r."offset"
"""
_BATCH = """ARRAY[r.producer_id, r.producer_epoch, r.sequence, CAST(r.is_transactional AS int),
                 CAST(r.is_control AS int), r.control_type, r.coordinator_epoch]"""
FETCH_LOG = _LOG.format(
    batch=f"""CASE WHEN r."offset" = r.batch_base_offset OR r."offset" = %(from_offset)s
                  THEN {_BATCH} END"""
)
FETCH_LOG_EVERY_BATCH = _LOG.format(batch=_BATCH)

_WINDOW_END = """least(CASE WHEN :read_committed THEN p.last_stable_offset ELSE p.next_offset END,
                  CAST(:from_offset AS bigint) + :max_records)"""
_SIZE = _RECORD_SIZE.replace("%(record_overhead)s", ":record_overhead")

# A fetch's one look at the partition: its offsets and, in read_committed, the aborted
# transactions that may overlap the window (as KIP-98's FetchResponse lists them), read in
# one round trip and one snapshot. The window's end depends on the LSO read here, so the
# ranges are bounded by the largest window and the caller drops those past the real end.
# ``window_bytes`` is the plain sum of the window's record sizes, markers and aborted
# records counted as stored: over narrow rows (a value's length comes from its row or
# TOAST pointer), and at least what the records a fetch returns count, so a window it
# does not exceed fits whole and is read without a running sum. Records can only leave
# the window (cleaning) before the read, never grow, so what fits here fits then.
_PARTITION_LOOK = """
    SELECT p.next_offset, p.log_start_offset, p.last_stable_offset,
           a.producer_ids, a.first_offsets, a.last_offsets, w.window_bytes,
           p.log_append_time, p.compression_type, p.leader_epoch,
           e.epochs, e.epoch_starts{cut_column}
    FROM partitions p
    LEFT JOIN LATERAL (
        SELECT array_agg(producer_id ORDER BY first_offset) AS producer_ids,
               array_agg(first_offset ORDER BY first_offset) AS first_offsets,
               array_agg(last_offset ORDER BY first_offset) AS last_offsets
        FROM aborted_txns
        WHERE :read_committed AND topic = p.topic AND partition = p.partition
          AND last_offset >= :from_offset
          AND first_offset < CAST(:from_offset AS bigint) + :max_records
    ) a ON true
    LEFT JOIN LATERAL (
        SELECT sum({size}) AS window_bytes
        FROM records r
        WHERE r.topic = p.topic AND r.partition = p.partition
          AND r."offset" >= :from_offset AND r."offset" < {window_end}
    ) w ON true
    LEFT JOIN LATERAL (
        SELECT array_agg(leader_epoch ORDER BY leader_epoch) AS epochs,
               array_agg(start_offset ORDER BY leader_epoch) AS epoch_starts
        FROM partition_leader_epochs
        WHERE p.leader_epoch > 0 AND topic = p.topic AND partition = p.partition
    ) e ON true{cut_join}
    WHERE p.topic = :topic AND p.partition = :partition
"""
PARTITION_FOR_FETCH = text(
    _PARTITION_LOOK.format(size=_SIZE, window_end=_WINDOW_END, cut_column="", cut_join="")
)

# The same look for a fetch of the log's batches (FETCH_LOG), with where max_bytes cuts
# the window (up to the LSO or high watermark read here): the first record left out, as
# _FETCH_WITHIN_BYTES would leave it out, or NULL when the whole window fits. The running
# sum, over narrow rows, runs only when the window's plain sum is over (and only up to
# the cut): most windows of a fetch filling max_bytes fit whole.
PARTITION_FOR_BATCHES_FETCH = text(
    _PARTITION_LOOK.format(
        size=_SIZE,
        window_end=_WINDOW_END,
        cut_column=", c.cut",
        cut_join=f"""
    LEFT JOIN LATERAL (
        SELECT s."offset" AS cut
        FROM (
            SELECT r."offset",
                   sum({_SIZE}) OVER running_sum AS running,
                   row_number() OVER running_sum AS rn
            FROM records r
            WHERE w.window_bytes > :max_bytes
              AND r.topic = p.topic AND r.partition = p.partition
              AND r."offset" >= :from_offset AND r."offset" < {_WINDOW_END}
            WINDOW running_sum AS (ORDER BY r."offset" ROWS UNBOUNDED PRECEDING)
        ) s
        WHERE s.running > :max_bytes AND NOT (s.rn = 1 AND :min_one_record)
        ORDER BY s."offset" LIMIT 1
    ) c ON true""",
    )
)

# A marker is found by its timestamp like any record, as Kafka's time index holds
# control batches too.
OFFSET_FOR_TIMESTAMP = text(
    """
    SELECT "offset", "timestamp" FROM records
    WHERE topic = :topic AND partition = :partition
      AND "timestamp" >= :timestamp AND "offset" >= :log_start AND "offset" < :upper
    ORDER BY "offset" LIMIT 1
    """
)

# The first record holding the partition's largest timestamp, markers included.
MAX_TIMESTAMP_RECORD = text(
    """
    SELECT "offset", "timestamp" FROM records
    WHERE topic = :topic AND partition = :partition AND "offset" >= :log_start
    ORDER BY "timestamp" DESC, "offset" LIMIT 1
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

# The highest epoch allowed for each allocated producer id among :producer_ids (an id
# not returned was never allocated). An idempotent producer's id is its holder's alone and
# the holder may raise its epoch itself, restarting its sequences at 0 after a failure whose
# outcome it cannot know (librdkafka does; Kafka allows it), so any epoch up to the int16
# maximum; a transactional id's current and previous identities are in its
# ``transactions`` row, and only the coordinator bumps them; -1 for an id its
# transactional id holds no more (rotated away, or the id expired).
ISSUED_PRODUCER_EPOCHS = text(
    """
    SELECT a.producer_id,
           CASE WHEN a.transactional_id IS NULL THEN 32767
                WHEN t.producer_id = a.producer_id THEN t.producer_epoch
                WHEN t.last_producer_id = a.producer_id THEN t.last_producer_epoch
                ELSE -1 END AS issued_epoch
    FROM producer_ids a
    LEFT JOIN transactions t ON t.transactional_id = a.transactional_id
    WHERE a.producer_id = ANY(:producer_ids)
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


# ---------------------------------------------------------------- rebuild (``app.log.rebuild``)

# The partition-log projections as they are, in the fold's row order (for comparing).
LIVE_PARTITIONS = text("SELECT topic, partition, next_offset, last_stable_offset FROM partitions")
LIVE_PRODUCER_STATES = text(
    "SELECT topic, partition, producer_id, producer_epoch, last_sequence, last_offset, "
    "last_timestamp, batches, coordinator_epoch, txn_first_offset FROM producer_states"
)
LIVE_ABORTED_TXNS = text(
    "SELECT topic, partition, producer_id, first_offset, last_offset, last_stable_offset "
    "FROM aborted_txns"
)

# Every partition row locked, in order, so no append interleaves with a rebuild.
LOCK_ALL_PARTITIONS = text("SELECT 1 FROM partitions ORDER BY topic, partition FOR UPDATE")
CLEAR_PRODUCER_STATES = text("DELETE FROM producer_states")
CLEAR_ABORTED_TXNS = text("DELETE FROM aborted_txns")
INSERT_ABORTED_TXN = text(
    "INSERT INTO aborted_txns (topic, partition, producer_id, first_offset, last_offset, "
    "last_stable_offset) VALUES (:t, :p, :pid, :f, :l, :lso)"
)
SET_PARTITION_OFFSETS = text(
    "UPDATE partitions SET next_offset = :n, last_stable_offset = :lso "
    "WHERE topic = :t AND partition = :p"
)


# ---------------------------------------------------------------- topics (``app.log.topics``)

INSERT_TOPIC = text(
    "INSERT INTO topics (topic, num_partitions, config, created_ms) "
    "VALUES (:topic, :n, CAST(:config AS jsonb), :now)"
)
# Partitions ``first`` to ``n - 1`` of a topic (all of a new one, or those added to it),
# with the topic's configs they obey, each leading in epoch 0 from offset 0.
INSERT_PARTITIONS = text(
    """
    WITH made AS (
        INSERT INTO partitions (topic, partition, max_message_bytes, log_append_time,
                                compression_type)
        SELECT :topic, g, :max_message_bytes, :log_append_time, :compression_type
        FROM generate_series(:first, :n - 1) g
        RETURNING topic, partition
    )
    INSERT INTO partition_leader_epochs (topic, partition, leader_epoch, start_offset)
    SELECT topic, partition, 0, 0 FROM made
    """
)
# The topic's configs its partitions obey, set on each row where they change (a row's new
# version makes an append decided on the old one go the lock's way: rule 32).
SET_PARTITION_CONFIGS = text(
    """
    UPDATE partitions SET max_message_bytes = :max_message_bytes,
                          log_append_time = :log_append_time,
                          compression_type = :compression_type
    WHERE topic = :t
      AND (max_message_bytes IS DISTINCT FROM :max_message_bytes
           OR log_append_time <> :log_append_time OR compression_type <> :compression_type)
    """
)
# A deletion takes the topic's partition locks first, in order, as appends do.
LOCK_TOPIC_PARTITIONS = text(
    "SELECT partition FROM partitions WHERE topic = :t ORDER BY partition FOR UPDATE"
)
# The topic's rows, then the topic (its partitions go with it, ON DELETE CASCADE).
DELETE_TOPIC = tuple(
    text(f"DELETE FROM {table} WHERE topic = :t")
    for table in ("records", "producer_states", "producer_snapshots", "aborted_txns", "topics")
)
# The topics whose min.insync.replicas is set (acks=all reads them, app.log.insync).
# Every topic's configs, for which are compacted (``log.compacted``).
TOPIC_CONFIGS = text("SELECT topic, config FROM topics")
MIN_INSYNC_OVERRIDES = text("SELECT topic, config FROM topics WHERE config ? 'min.insync.replicas'")
TOPIC_CONFIG_FOR_UPDATE = text("SELECT config FROM topics WHERE topic = :t FOR UPDATE")
# A topic about to grow: its row locked (a config change or another growth waits; appends
# and readers of its partitions do not), with its partition count and configs.
TOPIC_FOR_GROWTH = text("SELECT num_partitions, config FROM topics WHERE topic = :t FOR UPDATE")
SET_NUM_PARTITIONS = text("UPDATE topics SET num_partitions = :n WHERE topic = :t")
SET_TOPIC_CONFIG = text("UPDATE topics SET config = CAST(:config AS jsonb) WHERE topic = :t")
LIST_TOPICS = text(
    "SELECT t.topic, t.num_partitions, t.config, p.partition, p.log_start_offset, "
    "p.next_offset, p.last_stable_offset FROM topics t "
    "JOIN partitions p ON p.topic = t.topic ORDER BY t.topic, p.partition"
)
# Metadata: each topic with its id and its partitions' leader epochs, in partition order.
_TOPIC_METADATA = """
    SELECT t.topic, t.num_partitions, t.topic_id,
           array_agg(p.leader_epoch ORDER BY p.partition) AS leader_epochs
    FROM topics t JOIN partitions p ON p.topic = t.topic
    {where}
    GROUP BY t.topic
"""
ALL_TOPIC_IDS = text(_TOPIC_METADATA.format(where=""))
TOPIC_IDS = text(_TOPIC_METADATA.format(where="WHERE t.topic = ANY(:topics)"))


# ---------------------------------------------------------------- the fold (``app.log.projection``)

# One row per batch (records sharing batch_base_offset and producer), in log order.
_BATCH_COLUMNS = """
    r.topic, r.partition, r.batch_base_offset, r.producer_id,
    min(r.producer_epoch) AS producer_epoch, max(r."offset") AS last_offset,
    (array_agg(r.sequence ORDER BY r."offset"))[1] AS first_seq,
    (array_agg(r.sequence ORDER BY r."offset" DESC))[1] AS last_seq,
    max(r."timestamp") AS max_timestamp, bool_or(r.is_transactional) AS is_transactional,
    bool_or(r.is_control) AS is_control, min(r.control_type) AS control_type,
    min(r.coordinator_epoch) AS coordinator_epoch
"""
_GROUP = "GROUP BY r.topic, r.partition, r.batch_base_offset, r.producer_id"

# Every partition, from its snapshot offset to the end.
BATCHES_SINCE_SNAPSHOTS = text(
    f"""
    SELECT {_BATCH_COLUMNS}
    FROM records r
    LEFT JOIN log_cleaner_checkpoints c ON c.topic = r.topic AND c.partition = r.partition
    WHERE r."offset" >= coalesce(c.snapshot_offset, 0)
    {_GROUP}
    ORDER BY r.topic, r.partition, r.batch_base_offset
    """
)

# One partition, between two batch boundaries.
BATCHES_IN_RANGE = text(
    f"""
    SELECT {_BATCH_COLUMNS}
    FROM records r
    WHERE r.topic = :topic AND r.partition = :partition
      AND r."offset" >= :from_offset AND r."offset" < :to_offset
    {_GROUP}
    ORDER BY r.batch_base_offset
    """
)

PARTITION_STARTS = text(
    """
    SELECT p.topic, p.partition, p.log_start_offset, coalesce(c.snapshot_offset, 0) AS snapshot_offset
    FROM partitions p
    LEFT JOIN log_cleaner_checkpoints c ON c.topic = p.topic AND c.partition = p.partition
    """
)

ENTRY_COLUMNS = (
    "topic, partition, producer_id, producer_epoch, last_sequence, last_offset, "
    "last_timestamp, batches, coordinator_epoch, txn_first_offset"
)
ALL_SNAPSHOTS = text(f"SELECT {ENTRY_COLUMNS} FROM producer_snapshots")
PARTITION_SNAPSHOT = text(
    f"SELECT {ENTRY_COLUMNS} FROM producer_snapshots WHERE topic = :topic AND partition = :partition"
)
# aborted_txns rows ending below the snapshot offset are part of the snapshot.
SNAPSHOT_ABORTED = text(
    """
    SELECT a.topic, a.partition, a.producer_id, a.first_offset, a.last_offset, a.last_stable_offset
    FROM aborted_txns a
    JOIN log_cleaner_checkpoints c ON c.topic = a.topic AND c.partition = a.partition
    WHERE a.last_offset < c.snapshot_offset
    """
)


# Fold values written back, into producer_states (rebuild) or producer_snapshots (cleaner).
INSERT_ENTRIES = {
    table: text(
        f"INSERT INTO {table} ({ENTRY_COLUMNS}) VALUES "
        "(:t, :p, :pid, :ep, :seq, :lo, :ts, CAST(:b AS jsonb), :ce, :tfo)"
    )
    for table in ("producer_states", "producer_snapshots")
}


# ---------------------------------------------------------------- leader epochs (``app.log.leader_epoch``)

LEADER_EPOCHS = text(
    """
    SELECT leader_epoch, start_offset FROM partition_leader_epochs
    WHERE topic = :topic AND partition = :partition ORDER BY leader_epoch
    """
)
# A new leadership: the epoch one higher, begun at the log end, noted in the history. The
# UPDATE takes the partition lock, so no append is half-way through.
# New leaderships of several partitions at once (:topics and :partitions, arrays of the
# same length), their rows locked in one order so two bumps never deadlock each other.
BUMP_LEADER_EPOCHS = text(
    """
    WITH asked AS (
        SELECT p.topic, p.partition FROM partitions p
        JOIN unnest(CAST(:topics AS text[]), CAST(:partitions AS int[])) AS a(topic, partition)
          ON p.topic = a.topic AND p.partition = a.partition
        ORDER BY p.topic, p.partition
        FOR UPDATE OF p
    ), bumped AS (
        UPDATE partitions p SET leader_epoch = p.leader_epoch + 1
        FROM asked a WHERE p.topic = a.topic AND p.partition = a.partition
        RETURNING p.topic, p.partition, p.leader_epoch, p.next_offset
    ), noted AS (
        INSERT INTO partition_leader_epochs (topic, partition, leader_epoch, start_offset)
        SELECT topic, partition, leader_epoch, next_offset FROM bumped
    )
    SELECT topic, partition, leader_epoch FROM bumped
    """
)
BUMP_LEADER_EPOCH = text(
    """
    WITH bumped AS (
        UPDATE partitions SET leader_epoch = leader_epoch + 1
        WHERE topic = :topic AND partition = :partition
        RETURNING topic, partition, leader_epoch, next_offset
    ), noted AS (
        INSERT INTO partition_leader_epochs (topic, partition, leader_epoch, start_offset)
        SELECT topic, partition, leader_epoch, next_offset FROM bumped
    )
    SELECT leader_epoch FROM bumped
    """
)
