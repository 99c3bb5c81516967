"""The SQL the materialisation runs on the driver and pushes to Spark's JDBC reads.

Kept apart from the pipeline so the consistency argument can be read in one place: every
statement is bounded by the offsets captured at the start of a run, and only rows below
a captured LSO are read, which no later transaction can change.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from sqlalchemy import text

from app.log import sql as log_sql

PARENT = "read_committed_records"
RUN_PREFIX = "rc_run_"
COMPACT_PREFIX = "rc_compact_"
# A run's own partitioned table, and the table a compaction merges into: top-level tables
# of these names are a live or a killed run's (see LEFTOVER_TABLES).
_WORK_NAME = re.compile(r"rc_(run|compact)_[0-9a-f]{32}")
# A run's tables for one partition's range: partitions of its run table until they are
# attached to read_committed_records.
_CHILD_NAME = re.compile(r"rc_run_[0-9a-f]{32}_[0-9]+|rc_compact_[0-9a-f]{32}|rc_migrated_[0-9]+")

# Advisory-lock namespace ("kip9"): a run holds (NAMESPACE, hashtext(its table)) for its
# whole life, so cleanup can tell a live run's tables from a killed run's.
LOCK_NAMESPACE = 1802072121
# (NAMESPACE, 0) serialises what changes read_committed_records' partitions: the
# attaching transactions of runs, and compactions for their whole length.
MOVE_LOCK = 0
# The application_name of kip98's own materialisation and compaction sessions, which
# never read read_committed_records with an old snapshot (see OPEN_SNAPSHOTS).
APPLICATION_NAME = "kip98-spark"

# Each partition's bounds in one statement, so all partitions are captured at one instant.
CAPTURE = text(
    """
    SELECT p.topic, p.partition, p.log_start_offset, p.last_stable_offset, m.up_to_offset,
           CAST(t.topic_id AS text) AS topic_id
    FROM partitions p
    JOIN topics t ON t.topic = p.topic
    LEFT JOIN materialization_progress m ON m.topic = p.topic AND m.partition = p.partition
    WHERE CAST(:topics AS text[]) IS NULL OR p.topic = ANY(CAST(:topics AS text[]))
    ORDER BY p.topic, p.partition
    """
)

# The captured topics as they are now, held until the move commits: a topic deleted (and
# perhaps created again) since the capture has another id, or none.
CURRENT_TOPIC_IDS = text(
    """
    SELECT topic, CAST(topic_id AS text) FROM topics
    WHERE topic = ANY(CAST(:topics AS text[]))
    ORDER BY topic
    FOR SHARE
    """
)

# Run and compaction tables that are not partitions of anything: a run's table until its
# commit drops it, a compaction's merged table until its swap attaches it.
LEFTOVER_TABLES = text(
    """
    SELECT c.relname FROM pg_class c
    WHERE c.relnamespace = CAST(current_schema() AS regnamespace)
      AND c.relkind IN ('r', 'p') AND NOT c.relispartition
      AND c.relname ~ '^rc_(run|compact)_[0-9a-f]{32}$'
    ORDER BY c.relname
    """
)

LOCK_TABLE = text("SELECT pg_advisory_lock(:ns, hashtext(:name))")
TRY_LOCK_TABLE = text("SELECT pg_try_advisory_lock(:ns, hashtext(:name))")
UNLOCK_TABLE = text("SELECT pg_advisory_unlock(:ns, hashtext(:name))")
LOCK_MOVE = text("SELECT pg_advisory_xact_lock(:ns, :key)")
LOCK_MOVE_SESSION = text("SELECT pg_advisory_lock(:ns, :key)")
UNLOCK_MOVE_SESSION = text("SELECT pg_advisory_unlock(:ns, :key)")

# Sessions of this database that hold a snapshot now, other than kip98's own: a
# REPEATABLE READ or SERIALIZABLE transaction among them may have taken its snapshot
# while a run's rows were being written, and would see part of them once attached, so
# attaching waits for each of their transactions to end (as CREATE INDEX CONCURRENTLY
# waits for older snapshots).
OPEN_SNAPSHOTS = text(
    """
    SELECT pid, xact_start FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid()
      AND backend_type = 'client backend' AND backend_xmin IS NOT NULL
      AND application_name IS DISTINCT FROM :ours
    """
)
TRANSACTION_STARTS = text(
    """
    SELECT pid, xact_start FROM pg_stat_activity
    WHERE pid = ANY(CAST(:pids AS integer[])) AND backend_xmin IS NOT NULL
    """
)

# The captured partitions, as a relation the move statements join against.
_CAPTURED = """
    unnest(CAST(:topics AS text[]), CAST(:partitions AS integer[]),
           CAST(:log_starts AS bigint[]), CAST(:lsos AS bigint[]))
        AS c(topic, partition, log_start, lso)
"""

# Registered partitions of the captured partitions that hold nothing a consumer returns:
# every partition of a topic partition without a progress row (first run, or the topic was
# deleted and created again: the rows belong to a log that no longer exists), and those
# wholly below the log start (retention removed those records). Dropped, not emptied, so
# their offset ranges are free for the new log's rows.
OBSOLETE_PARTITIONS = text(
    f"""
    SELECT r.table_name FROM read_committed_partitions r JOIN {_CAPTURED}
      ON r.topic = c.topic AND r.partition = c.partition
    WHERE r.to_offset <= c.log_start
       OR NOT EXISTS (SELECT 1 FROM materialization_progress m
                      WHERE m.topic = c.topic AND m.partition = c.partition)
    ORDER BY r.table_name
    """
)

# Retention moved the log start into a partition's range: the consumer no longer returns
# the rows below it.
PRUNE_BELOW_LOG_START = text(
    f"""
    DELETE FROM read_committed_records r USING {_CAPTURED}
    WHERE r.topic = c.topic AND r.partition = c.partition AND r."offset" < c.log_start
    """
)

# Progress as it is at the commit (the move lock held): a run attaches a partition's rows
# only if no other run has advanced that partition since this run's capture.
PROGRESS_NOW = text(
    """
    SELECT topic, partition, up_to_offset FROM materialization_progress
    WHERE topic = ANY(CAST(:topics AS text[]))
    FOR UPDATE
    """
)

REGISTER = text(
    """
    INSERT INTO read_committed_partitions
        (table_name, topic, partition, from_offset, to_offset, row_count)
    VALUES (:table_name, :topic, :partition, :from_offset, :to_offset, :row_count)
    """
)
UNREGISTER = text(
    "DELETE FROM read_committed_partitions WHERE table_name = ANY(CAST(:names AS text[]))"
)
REGISTERED = text(
    """
    SELECT table_name, topic, partition, from_offset, to_offset, row_count
    FROM read_committed_partitions ORDER BY topic, partition, from_offset
    """
)

ADVANCE_PROGRESS = text(
    f"""
    INSERT INTO materialization_progress (topic, partition, up_to_offset)
    SELECT c.topic, c.partition, c.lso FROM {_CAPTURED}
    JOIN partitions p ON p.topic = c.topic AND p.partition = c.partition
    ON CONFLICT (topic, partition) DO UPDATE
    SET up_to_offset = greatest(materialization_progress.up_to_offset, EXCLUDED.up_to_offset)
    """
)


def check_work_name(name: str) -> str:
    """Names are interpolated into DDL, so only the generated shapes are accepted."""
    if not _WORK_NAME.fullmatch(name):
        raise ValueError(f"not a run or compaction table name: {name!r}")
    return name


def check_child_name(name: str) -> str:
    if not _CHILD_NAME.fullmatch(name):
        raise ValueError(f"not a read_committed_records partition name: {name!r}")
    return name


# read_committed_records' columns and key; each partition has them, with its own copy of
# the primary key's index.
_COLUMNS = """
    topic text NOT NULL, partition integer NOT NULL, "offset" bigint NOT NULL,
    key bytea, value bytea, headers jsonb, "timestamp" bigint NOT NULL,
    producer_id bigint NOT NULL
"""


def bound(topic: str, partition: int, start: int, end: int) -> str:
    """The partition bound of one topic partition's offsets ``[start, end)``."""
    t, p = literal(topic), int(partition)
    return f"FROM ({t}, {p}, {int(start)}) TO ({t}, {p}, {int(end)})"


def bound_check(topic: str, partition: int, start: int, end: int) -> str:
    """A CHECK constraint equal to ``bound``'s partition constraint: a table created with it
    is attached without PostgreSQL scanning it to validate the bound, and it is checked on
    every insert, when a violation would only fail the run's own write."""
    return (
        f"CHECK (topic = {literal(topic)} AND partition = {int(partition)} "
        f'AND "offset" >= {int(start)} AND "offset" < {int(end)})'
    )


def create_run_table(name: str) -> str:
    """The table a run's Spark job appends to: partitioned like read_committed_records, so
    one write lands each topic partition's rows in its own partition, ready to attach.

    Logged, as everything read_committed_records will hold: once attached, the rows are
    the very ones Spark wrote, so a server crash must lose none of them.
    """
    return f"""
        CREATE TABLE {check_work_name(name)} ({_COLUMNS}, PRIMARY KEY (topic, partition, "offset"))
        PARTITION BY RANGE (topic, partition, "offset")
    """


def create_run_child(run: str, child: str, topic: str, partition: int, start: int, end: int) -> str:
    return f"""
        CREATE TABLE {check_child_name(child)} PARTITION OF {check_work_name(run)}
            (CONSTRAINT {child}_bound {bound_check(topic, partition, start, end)})
        FOR VALUES {bound(topic, partition, start, end)}
    """


def create_merged(name: str, topic: str, partition: int, start: int, end: int) -> str:
    """The table a compaction merges one topic partition's ``[start, end)`` into."""
    return f"""
        CREATE TABLE {check_work_name(name)} ({_COLUMNS}, PRIMARY KEY (topic, partition, "offset"),
            CONSTRAINT {name}_bound {bound_check(topic, partition, start, end)})
    """


def fill_merged(name: str, topic: str, partition: int, start: int, end: int) -> str:
    """The rows read_committed_records holds in that range, in offset order."""
    return f"""
        INSERT INTO {check_work_name(name)}
        SELECT topic, partition, "offset", key, value, headers, "timestamp", producer_id
        FROM read_committed_records
        WHERE topic = {literal(topic)} AND partition = {int(partition)}
          AND "offset" >= {int(start)} AND "offset" < {int(end)}
        ORDER BY "offset"
    """


def count_run(name: str) -> str:
    """The rows the run's Spark job wrote, per topic partition."""
    return f"SELECT topic, partition, count(*) FROM {check_work_name(name)} GROUP BY 1, 2"


def detach(run: str, child: str) -> str:
    return f"ALTER TABLE {check_work_name(run)} DETACH PARTITION {check_child_name(child)}"


def attach(child: str, topic: str, partition: int, start: int, end: int) -> str:
    return (
        f"ALTER TABLE {PARENT} ATTACH PARTITION {check_child_name(child)} "
        f"FOR VALUES {bound(topic, partition, start, end)}"
    )


def drop_work(name: str) -> str:
    """A run's table with the partitions it still has, or a compaction's merged table."""
    return f"DROP TABLE IF EXISTS {check_work_name(name)}"


def drop_child(name: str) -> str:
    return f"DROP TABLE IF EXISTS {check_child_name(name)}"


def count_rows(name: str) -> str:
    return f"SELECT count(*) FROM {check_work_name(name)}"


def literal(value: str) -> str:
    """A SQL string literal (Spark's JDBC predicates and subqueries take no parameters)."""
    return "'" + value.replace("'", "''") + "'"


def records_table() -> str:
    """What Spark reads for records: the columns it needs, headers as text (Spark has no
    jsonb). Predicates apply to this subquery and PostgreSQL pushes them into it."""
    return """(
        SELECT topic, partition, "offset", key, value, CAST(headers AS text) AS headers,
               "timestamp", producer_id, is_transactional, is_control
        FROM records
    ) AS r"""


def range_predicate(topic: str, partition: int, start: int, end: int) -> str:
    """One Spark task's slice: a PK range scan on records."""
    return (
        f'topic = {literal(topic)} AND partition = {int(partition)} AND "offset" >= {int(start)} '
        f'AND "offset" < {int(end)}'
    )


def aborted_query(ranges: Iterable[tuple[str, int, int, int]]) -> str:
    """The aborted index entries that overlap the captured ranges ``(topic, partition,
    start, lso)``.

    An entry whose first offset is below the captured LSO belongs to a transaction that had
    ended when the LSO was captured, and its entry was written with the abort marker: so a
    later snapshot sees every entry that can touch a record below the LSO.
    """
    values = ", ".join(
        f"({literal(t)}, {int(p)}, CAST({int(s)} AS bigint), CAST({int(e)} AS bigint))"
        for t, p, s, e in ranges
    )
    return f"""
        SELECT a.topic, a.partition, a.producer_id, a.first_offset, a.last_offset
        FROM aborted_txns a
        JOIN (VALUES {values}) AS c(topic, partition, start_offset, end_offset)
          ON a.topic = c.topic AND a.partition = c.partition
         AND a.first_offset < c.end_offset AND a.last_offset >= c.start_offset
    """


def aborted_table(query: str) -> str:
    return f"({query}) AS aborted"


def count_of(query: str) -> str:
    return f"SELECT count(*) FROM ({query}) AS q"


# ---------------------------------------------------------------- the kip98 data source
#
# Run with psycopg, on the driver (planning) and in Spark's Python workers (reading): plain
# strings with psycopg's ``%(name)s``. What the source reads is bounded by offsets the
# driver captured: below a partition's captured LSO (read_committed) or high watermark
# (read_uncommitted) nothing changes any more, save what the cleaner removes.

# Every partition's bounds, read together at one instant.
SOURCE_PARTITIONS = """
    SELECT topic, partition, log_start_offset, next_offset, last_stable_offset
    FROM partitions ORDER BY topic, partition
"""

EXISTING_TOPICS = "SELECT topic FROM topics WHERE topic = ANY(%(topics)s) ORDER BY topic"

# The first offset of a partition whose record's timestamp is at or after the given one
# (Kafka's ListOffsets by timestamp), below the bound the query reads up to. No index on
# timestamps: a scan of the partition's range, once, when a query starts.
OFFSET_FOR_TIMESTAMP = """
    SELECT min("offset") FROM records
    WHERE topic = %(topic)s AND partition = %(partition)s
      AND "offset" >= %(from_offset)s AND "offset" < %(to_offset)s
      AND "timestamp" >= %(timestamp)s AND NOT is_control
"""

# One partition as a worker finds it when it starts reading (the log start may have moved).
PARTITION_NOW = """
    SELECT log_start_offset, next_offset FROM partitions
    WHERE topic = %(topic)s AND partition = %(partition)s
"""

# The aborted transactions that overlap a range: few, read first and passed to the range's
# read as arrays, as the Fetch handler does (``app.log.sql``). An entry whose first offset
# is below the captured LSO was written with its abort marker, before the capture: every
# entry that can hide a record of the range is seen.
ABORTED_IN_RANGE = """
    SELECT array_agg(producer_id), array_agg(first_offset), array_agg(last_offset)
    FROM aborted_txns
    WHERE topic = %(topic)s AND partition = %(partition)s
      AND first_offset < %(to_offset)s AND last_offset >= %(from_offset)s
"""

# A range's data records in Spark's Kafka columns (headers as their JSON text), in offset
# order; read_committed also drops those of the aborted transactions passed in, with the
# Fetch handler's own filter (``app.log.sql.NOT_ABORTED``: their offset spans, merged
# into one multirange, let every record outside them skip the anti-join).
_RANGE_RECORDS = """
    SELECT r.key, r.value, r."offset", r."timestamp", CAST(r.headers AS text)
    FROM records r
    WHERE r.topic = %(topic)s AND r.partition = %(partition)s
      AND r."offset" >= %(from_offset)s AND r."offset" < %(to_offset)s AND NOT r.is_control
"""
READ_RANGE_UNCOMMITTED = _RANGE_RECORDS + ' ORDER BY r."offset"'
READ_RANGE_COMMITTED = _RANGE_RECORDS + log_sql.NOT_ABORTED + ' ORDER BY r."offset"'

# The sink's batches: one row per (query, micro-batch) committed, written in the DB
# transaction that commits the batch's transactions (``app.broker.prepared``). A replayed
# batch finds its row.
SINK_BATCH_COMMITTED = """
    SELECT 1 FROM spark_sink_commits WHERE query_id = %(query_id)s AND batch_id = %(batch_id)s
"""
CLAIM_SINK_BATCH = text(
    """
    INSERT INTO spark_sink_commits (query_id, batch_id, row_count)
    VALUES (:query_id, :batch_id, :rows)
    ON CONFLICT (query_id, batch_id) DO NOTHING
    RETURNING 1
    """
)
