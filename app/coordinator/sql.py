"""Every SQL statement of the transaction-coordinator family (transaction_log, the
transactions projection, coordinator leases), in one place.

Locking: a coordinator request serialises on its transactional id's row (FOR UPDATE);
a produce into the transaction takes the same row FOR SHARE (docs/design.md §3.4). Whoever holds
the row may then lock data partitions (sorted), never the other way round.
"""

from __future__ import annotations

from sqlalchemy import text

TXN_COLUMNS = (
    "transactional_id, producer_id, producer_epoch, last_producer_id, last_producer_epoch, "
    "state, partitions, has_offsets, timeout_ms, txn_start_ms, updated_ms, coordinator_epoch"
)

LOAD_FOR_UPDATE = text(
    f"SELECT {TXN_COLUMNS}, txn_partition FROM transactions WHERE transactional_id = :tid FOR UPDATE"
)
# The row FOR UPDATE and, in the same round trip, the coordinator epoch of its
# transaction-log partition, its lease row FOR SHARE (0 before any lease).
LOAD_FOR_UPDATE_WITH_LEASE = text(
    f"""
    SELECT {TXN_COLUMNS}, t.txn_partition,
           COALESCE((SELECT l.coordinator_epoch FROM coordinator_leases l
                     WHERE l.txn_partition = t.txn_partition FOR SHARE), 0) AS lease_epoch
    FROM transactions t WHERE t.transactional_id = :tid FOR UPDATE OF t
    """
)
# The one-query commit's first statement (docs/design.md §3.11): the row's version and its
# lease's epoch, both rows locked as LOAD_FOR_UPDATE_WITH_LEASE locks them; the caller
# compares them with what it decided on.
TXN_VERSION_WITH_LEASE = """
    SELECT CAST(t.xmin AS text),
           COALESCE((SELECT l.coordinator_epoch FROM coordinator_leases l
                     WHERE l.txn_partition = t.txn_partition FOR SHARE), 0)
    FROM transactions t WHERE t.transactional_id = %(tid)s FOR UPDATE OF t
"""
# The row's version as the DB transaction that has just written it leaves it (its own id).
TXN_VERSION = "SELECT CAST(xmin AS text) FROM transactions WHERE transactional_id = %(tid)s"
# A transactional produce's read (§3.4), with the row's version and its lease's epoch (read,
# not locked: a produce writes no marker) for the process to remember (§3.12).
LOAD_FOR_SHARE = text(
    f"""
    SELECT {TXN_COLUMNS}, t.txn_partition, CAST(t.xmin AS text) AS version,
           COALESCE((SELECT l.coordinator_epoch FROM coordinator_leases l
                     WHERE l.txn_partition = t.txn_partition), 0) AS lease_epoch
    FROM transactions t WHERE t.transactional_id = :tid FOR SHARE OF t
    """
)
# The same version and epoch, read by the DB transaction that has just written the row.
TXN_VERSION_AND_LEASE = text(
    """
    SELECT CAST(t.xmin AS text) AS version,
           COALESCE((SELECT l.coordinator_epoch FROM coordinator_leases l
                     WHERE l.txn_partition = t.txn_partition), 0) AS lease_epoch
    FROM transactions t WHERE t.transactional_id = :tid
    """
)
# A produce on the remembered row's first statement (§3.12): the row FOR SHARE, as
# LOAD_FOR_SHARE takes it, and its version for the caller to compare.
TXN_VERSION_FOR_SHARE = (
    "SELECT CAST(xmin AS text) FROM transactions WHERE transactional_id = %(tid)s FOR SHARE"
)

# The transition's event, inserted first in each statement that persists one.
_EVENT = f"""
WITH event AS (
    INSERT INTO transaction_log ({TXN_COLUMNS}, reason)
    VALUES (:transactional_id, :producer_id, :producer_epoch, :last_producer_id,
            :last_producer_epoch, :state, CAST(:partitions AS jsonb), :has_offsets,
            :timeout_ms, :txn_start_ms, :updated_ms, :coordinator_epoch, :reason)
    RETURNING event_id
)
"""

# Several transitions of one id at once: their events in order (identity values are drawn
# in the order of insertion, so event_id follows the arrays), the projection to the last.
_EVENTS = f"""
WITH event AS (
    INSERT INTO transaction_log ({TXN_COLUMNS}, reason)
    SELECT e.transactional_id, e.producer_id, e.producer_epoch, e.last_producer_id,
           e.last_producer_epoch, e.state, CAST(e.partitions AS jsonb), e.has_offsets,
           e.timeout_ms, e.txn_start_ms, e.updated_ms, e.coordinator_epoch, e.reason
    FROM unnest(
        CAST(:e_transactional_id AS text[]), CAST(:e_producer_id AS bigint[]),
        CAST(:e_producer_epoch AS smallint[]), CAST(:e_last_producer_id AS bigint[]),
        CAST(:e_last_producer_epoch AS smallint[]), CAST(:e_state AS text[]),
        CAST(:e_partitions AS text[]), CAST(:e_has_offsets AS boolean[]),
        CAST(:e_timeout_ms AS int[]), CAST(:e_txn_start_ms AS bigint[]),
        CAST(:e_updated_ms AS bigint[]), CAST(:e_coordinator_epoch AS int[]),
        CAST(:e_reason AS text[])
    ) WITH ORDINALITY AS e(transactional_id, producer_id, producer_epoch, last_producer_id,
                           last_producer_epoch, state, partitions, has_offsets, timeout_ms,
                           txn_start_ms, updated_ms, coordinator_epoch, reason, n)
    ORDER BY e.n
    RETURNING event_id
)
"""

# The projection brought to a transition (the parameters without prefix), after its
# event(s): ``last_event`` names the event id it now reflects.
_PROJECT = f"""
    INSERT INTO transactions ({TXN_COLUMNS}, txn_partition, last_event_id)
    SELECT :transactional_id, :producer_id, :producer_epoch, :last_producer_id,
           :last_producer_epoch, :state, CAST(:partitions AS jsonb), :has_offsets, :timeout_ms,
           :txn_start_ms, :updated_ms, :coordinator_epoch, :txn_partition, {{last_event}}
    FROM event
    ON CONFLICT (transactional_id) DO UPDATE SET
        producer_id = EXCLUDED.producer_id, producer_epoch = EXCLUDED.producer_epoch,
        last_producer_id = EXCLUDED.last_producer_id,
        last_producer_epoch = EXCLUDED.last_producer_epoch, state = EXCLUDED.state,
        partitions = EXCLUDED.partitions, has_offsets = EXCLUDED.has_offsets,
        timeout_ms = EXCLUDED.timeout_ms, txn_start_ms = EXCLUDED.txn_start_ms,
        updated_ms = EXCLUDED.updated_ms, coordinator_epoch = EXCLUDED.coordinator_epoch,
        txn_partition = EXCLUDED.txn_partition, last_event_id = EXCLUDED.last_event_id
"""

# Persist a transition: its event and the projection brought to it, in one statement.
APPEND_EVENT_AND_PROJECT = text(_EVENT + _PROJECT.format(last_event="event_id"))
# Persist several transitions of one id: their events and the projection, in one statement.
APPEND_EVENTS_AND_PROJECT = text(_EVENTS + _PROJECT.format(last_event="max(event_id)"))

# The first transition of a transactional id with no row (new, or DEAD and forgotten):
# its event and its projection row, only if the row is still absent. The row is claimed
# first (a concurrent creator's row makes it wait for that one's COMMIT, then do nothing),
# so the event is written only with the row it creates; the claim names the event id it
# draws. No row returned: another InitProducerId created the id first.
CLAIM_NEW_ID = text(
    f"""
    WITH claim AS (
        INSERT INTO transactions ({TXN_COLUMNS}, txn_partition, last_event_id)
        VALUES (:transactional_id, :producer_id, :producer_epoch, :last_producer_id,
                :last_producer_epoch, :state, CAST(:partitions AS jsonb), :has_offsets,
                :timeout_ms, :txn_start_ms, :updated_ms, :coordinator_epoch, :txn_partition,
                nextval(pg_get_serial_sequence('transaction_log', 'event_id')))
        ON CONFLICT (transactional_id) DO NOTHING
        RETURNING last_event_id
    )
    INSERT INTO transaction_log (event_id, {TXN_COLUMNS}, reason)
    SELECT last_event_id, :transactional_id, :producer_id, :producer_epoch, :last_producer_id,
           :last_producer_epoch, :state, CAST(:partitions AS jsonb), :has_offsets, :timeout_ms,
           :txn_start_ms, :updated_ms, :coordinator_epoch, :reason
    FROM claim
    RETURNING event_id
    """
)

# A DEAD transition: its event, and the id leaves the projection.
APPEND_EVENT_AND_FORGET = text(
    f"""
    {_EVENT}
    DELETE FROM transactions WHERE transactional_id = :transactional_id
    """
)

# Rebuild: the fold of the log is its last event per id, minus the DEAD ones.
LAST_EVENTS = text(
    f"""
    SELECT DISTINCT ON (transactional_id) {TXN_COLUMNS}, event_id
    FROM transaction_log ORDER BY transactional_id, event_id DESC
    """
)
ALL_EVENTS = text(
    f"SELECT {TXN_COLUMNS}, event_id FROM transaction_log ORDER BY transactional_id, event_id"
)
LIVE_PROJECTION = text(f"SELECT {TXN_COLUMNS}, txn_partition, last_event_id FROM transactions")

# ---------------------------------------------------------------- leases

ENSURE_LEASES = text(
    "INSERT INTO coordinator_leases (txn_partition) SELECT g FROM generate_series(0, :n - 1) g "
    "ON CONFLICT DO NOTHING"
)
# The loops at work: each pass renews its own row (the lapsed ones are removed), and
# counts the live ones to know its fair share of the leases (docs/design.md rule 59).
JOIN_LOOPS = text(
    "INSERT INTO coordinator_loops (owner, expires_ms) VALUES (:owner, :expires_ms) "
    "ON CONFLICT (owner) DO UPDATE SET expires_ms = EXCLUDED.expires_ms"
)
FORGET_LAPSED_LOOPS = text("DELETE FROM coordinator_loops WHERE expires_ms < :now")
LIVE_LOOPS = text("SELECT count(*) FROM coordinator_loops WHERE expires_ms >= :now")
LEAVE_LOOPS = text("DELETE FROM coordinator_loops WHERE owner = :owner")
# Give up the leases held beyond a fair share, the highest partitions first: left without
# an owner, the next to take one bumps its coordinator epoch, fencing this loop's work on it.
SHED_LEASES = text(
    """
    UPDATE coordinator_leases SET owner = NULL, expires_ms = 0
    WHERE txn_partition IN (
        SELECT txn_partition FROM coordinator_leases WHERE owner = :owner
        ORDER BY txn_partition OFFSET :share
    )
    """
)
# Take or renew up to a fair share of the leases, ours first, then free ones; a takeover
# (new owner) bumps the coordinator epoch. SKIP LOCKED: two loops never wait for each other.
ACQUIRE_LEASES = text(
    """
    WITH candidates AS (
        SELECT txn_partition FROM coordinator_leases
        WHERE owner = :owner OR expires_ms < :now
        ORDER BY owner IS NOT DISTINCT FROM :owner DESC, txn_partition
        LIMIT :share FOR UPDATE SKIP LOCKED
    )
    UPDATE coordinator_leases l SET
        coordinator_epoch = l.coordinator_epoch + CASE WHEN l.owner IS DISTINCT FROM :owner THEN 1 ELSE 0 END,
        owner = :owner, expires_ms = :expires_ms
    FROM candidates c WHERE l.txn_partition = c.txn_partition
    RETURNING l.txn_partition, l.coordinator_epoch
    """
)
RELEASE_LEASES = text("UPDATE coordinator_leases SET expires_ms = 0 WHERE owner = :owner")
LEASE_EPOCH_FOR_SHARE = text(
    "SELECT coordinator_epoch, owner FROM coordinator_leases WHERE txn_partition = :txn_partition FOR SHARE"
)

# ---------------------------------------------------------------- loop scans

# A pass's work on the transaction-log partitions it leases, in one query: per partition,
# transactions left PREPARE_* to roll forward, then BEGIN ones past their timeout, then ids
# idle past transactional.id.expiration.ms. Each is checked again under its row lock.
PASS_WORK = text(
    """
    SELECT txn_partition, transactional_id,
           CASE WHEN state IN ('PREPARE_COMMIT', 'PREPARE_ABORT') THEN 'prepared'
                WHEN state = 'BEGIN' THEN 'timed_out'
                ELSE 'expirable' END AS work
    FROM transactions
    WHERE txn_partition = ANY(:txn_partitions)
      AND (state IN ('PREPARE_COMMIT', 'PREPARE_ABORT')
           OR (state = 'BEGIN' AND txn_start_ms + timeout_ms < :now)
           OR (state IN ('EMPTY', 'COMPLETE_COMMIT', 'COMPLETE_ABORT')
               AND updated_ms + :expiration_ms < :now))
    ORDER BY txn_partition,
             CASE WHEN state IN ('PREPARE_COMMIT', 'PREPARE_ABORT') THEN 0
                  WHEN state = 'BEGIN' THEN 1 ELSE 2 END,
             transactional_id
    """
)

# One more failure of an item of ``work`` (the loop's metric; app.metrics reads it).
COUNT_ITEM_FAILURE = text(
    """
    INSERT INTO coordinator_item_failures AS f (work, failures, last_failed_ms)
    VALUES (:work, 1, :now)
    ON CONFLICT (work) DO UPDATE SET failures = f.failures + 1, last_failed_ms = EXCLUDED.last_failed_ms
    """
)


# ---------------------------------------------------------------- AddPartitionsToTxn

# Which of the partitions asked for exist.
EXISTING_PARTITIONS = text(
    "SELECT topic, partition FROM partitions WHERE (topic, partition) IN "
    "(SELECT * FROM unnest(CAST(:topics AS text[]), CAST(:partitions AS int[])))"
)

# ---------------------------------------------------------------- ListTransactions (``inspect``)

LIST_TRANSACTIONS = text(
    "SELECT transactional_id, producer_id, producer_epoch, state, partitions, timeout_ms, "
    "txn_start_ms, updated_ms, coordinator_epoch FROM transactions "
    "WHERE (CAST(:states AS text[]) IS NULL OR state = ANY(CAST(:states AS text[]))) "
    "AND (CAST(:ids AS text[]) IS NULL OR transactional_id = ANY(CAST(:ids AS text[]))) "
    "ORDER BY transactional_id"
)

# ---------------------------------------------------------------- rebuild (``rebuild``)

LOCK_TRANSACTIONS = text("LOCK TABLE transactions IN EXCLUSIVE MODE")
CLEAR_TRANSACTIONS = text("DELETE FROM transactions")
# A folded row, in ``rebuild.compute_transactions``' column order.
REBUILT_TXN_COLUMNS = [c.strip() for c in TXN_COLUMNS.split(",")] + [
    "txn_partition",
    "last_event_id",
]
INSERT_REBUILT_TRANSACTION = text(
    "INSERT INTO transactions ({}) VALUES ({})".format(
        ", ".join(REBUILT_TXN_COLUMNS),
        ", ".join(
            f"CAST(:{c} AS jsonb)" if c == "partitions" else f":{c}" for c in REBUILT_TXN_COLUMNS
        ),
    )
)

# Transactional ids under a prefix whose transaction is ongoing: what a Spark sink's
# query left open (its ids all start with the query's prefix).
OPEN_UNDER_PREFIX = text(
    """
    SELECT transactional_id FROM transactions
    WHERE starts_with(transactional_id, :prefix) AND state = 'BEGIN'
    ORDER BY transactional_id COLLATE "C"
    """
)
