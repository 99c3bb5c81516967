"""The SQL the materialisation runs on the driver and pushes to Spark's JDBC reads.

Kept apart from the pipeline so the consistency argument can be read in one place: every
statement is bounded by the offsets captured at the start of a run, and only rows below
a captured LSO are read, which no later transaction can change.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from sqlalchemy import text

STAGING_PREFIX = "rc_staging_"
_STAGING_NAME = re.compile(r"rc_staging_[0-9a-f]{32}")

# Advisory-lock namespace ("kip9"): a run holds (NAMESPACE, hashtext(staging table)) for its
# whole life, so cleanup can tell a live run's staging table from a killed run's.
LOCK_NAMESPACE = 1802072121
# (NAMESPACE, 0) serialises the final move transactions of concurrent runs.
MOVE_LOCK = 0

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

LEFTOVER_STAGING = text(
    """
    SELECT tablename FROM pg_tables
    WHERE schemaname = current_schema() AND tablename LIKE 'rc\\_staging\\_%'
    """
)

LOCK_STAGING = text("SELECT pg_advisory_lock(:ns, hashtext(:name))")
TRY_LOCK_STAGING = text("SELECT pg_try_advisory_lock(:ns, hashtext(:name))")
UNLOCK_STAGING = text("SELECT pg_advisory_unlock(:ns, hashtext(:name))")
LOCK_MOVE = text("SELECT pg_advisory_xact_lock(:ns, :key)")

# The captured partitions, as a relation the move statements join against.
_CAPTURED = """
    unnest(CAST(:topics AS text[]), CAST(:partitions AS integer[]),
           CAST(:log_starts AS bigint[]), CAST(:lsos AS bigint[]))
        AS c(topic, partition, log_start, lso)
"""

# Retention moved the log start: the consumer no longer returns those rows.
PRUNE_BELOW_LOG_START = text(
    f"""
    DELETE FROM read_committed_records r USING {_CAPTURED}
    WHERE r.topic = c.topic AND r.partition = c.partition AND r."offset" < c.log_start
    """
)

# No progress row (first run, or the topic was deleted and created again): whatever rows
# the table still holds for the partition belong to a log that no longer exists.
FORGET_UNTRACKED = text(
    f"""
    DELETE FROM read_committed_records r USING {_CAPTURED}
    WHERE r.topic = c.topic AND r.partition = c.partition
      AND NOT EXISTS (SELECT 1 FROM materialization_progress m
                      WHERE m.topic = c.topic AND m.partition = c.partition)
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


def check_staging_name(name: str) -> str:
    """Staging names are interpolated into DDL, so only the generated shape is accepted."""
    if not _STAGING_NAME.fullmatch(name):
        raise ValueError(f"not a staging table name: {name!r}")
    return name


def create_staging(name: str) -> str:
    # Unlogged: it lives for one run and a server crash simply makes that run fail.
    # No indexes, and no autovacuum: the move reads it whole, once, so an index or an
    # ANALYZE triggered by the bulk insert would only take CPU from the run itself.
    # headers is text because Spark writes strings; the move casts it back to jsonb.
    return f"""
        CREATE UNLOGGED TABLE {check_staging_name(name)} (
            topic text NOT NULL, partition integer NOT NULL, "offset" bigint NOT NULL,
            key bytea, value bytea, headers text, "timestamp" bigint NOT NULL,
            producer_id bigint NOT NULL
        ) WITH (autovacuum_enabled = false)
    """


def drop_staging(name: str) -> str:
    return f"DROP TABLE IF EXISTS {check_staging_name(name)}"


def drop_staged_except(name: str) -> str:
    """Staged rows of topics that are gone since the capture: they belong to a log that
    no longer exists, so they are not moved."""
    return f"DELETE FROM {check_staging_name(name)} WHERE NOT topic = ANY(CAST(:topics AS text[]))"


def count_staging(name: str) -> str:
    return f"SELECT count(*) FROM {check_staging_name(name)}"


def count_staged(name: str) -> str:
    """Staged rows per partition: the run's counts once ``insert_staged`` has succeeded
    (every staged row was then new), at the price of one scan of an unlogged table, which
    is cheaper than returning and grouping every inserted row."""
    return f"""
        SELECT topic, partition, count(*) FROM {check_staging_name(name)}
        GROUP BY topic, partition
    """


def insert_staged(name: str) -> str:
    """The move as a plain INSERT: the common case, where every staged row is new.

    No ``ON CONFLICT``: its speculative insertion roughly doubles the cost of the move. A
    staged row that is already in the table (a concurrent run moved it) or staged twice
    (a re-executed Spark task) makes this fail with a unique violation instead, and the
    caller then falls back to ``merge_staged``. No ``ORDER BY`` either: each Spark task
    appends its slice in offset order, so the primary key already grows at a few right
    edges, and sorting the rows costs more than it saves.
    """
    return f"""
        INSERT INTO read_committed_records
            (topic, partition, "offset", key, value, headers, "timestamp", producer_id)
        SELECT topic, partition, "offset", key, value, CAST(headers AS jsonb),
               "timestamp", producer_id
        FROM {check_staging_name(name)}
    """


def merge_staged(name: str) -> str:
    """The move when ``insert_staged`` met a row that is already there: insert the new
    rows only, answering how many there were per partition.

    ON CONFLICT DO NOTHING absorbs rows a retried Spark task staged twice and rows a
    concurrent run already moved; those are not counted.
    """
    return f"""
        WITH moved AS (
            INSERT INTO read_committed_records
                (topic, partition, "offset", key, value, headers, "timestamp", producer_id)
            SELECT topic, partition, "offset", key, value, CAST(headers AS jsonb),
                   "timestamp", producer_id
            FROM {check_staging_name(name)}
            ON CONFLICT (topic, partition, "offset") DO NOTHING
            RETURNING topic, partition
        )
        SELECT topic, partition, count(*) FROM moved GROUP BY topic, partition
    """


# The benchmark's floor: the same rows written into read_committed_records by PostgreSQL
# alone, straight from records (no Spark, no staging), aborted transactions aside.
COPY_INSIDE_POSTGRES = """
    INSERT INTO read_committed_records
        (topic, partition, "offset", key, value, headers, "timestamp", producer_id)
    SELECT topic, partition, "offset", key, value, headers, "timestamp", producer_id
    FROM records WHERE topic = :t AND NOT is_control
"""


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
