"""The admin SQL views (docs/sql.md): their names and columns are a contract; their SQL lives
here only. Migrations create them (``create_views``), each at the version of its time;
metadata does not describe them, so the migration/metadata drift check leaves them alone.

``committed_records`` applies exactly the read_committed rules of the Fetch handler:
below the LSO, at or above the log start, no markers, no records of aborted transactions.
"""

from __future__ import annotations

from sqlalchemy import Connection, text

VIEWS: dict[str, str] = {
    "partition_status": """
        SELECT p.topic, p.partition, p.log_start_offset, p.next_offset AS high_watermark,
               p.last_stable_offset,
               (SELECT count(*) FROM producer_states s
                WHERE s.topic = p.topic AND s.partition = p.partition
                  AND s.txn_first_offset IS NOT NULL) AS open_transactions
        FROM partitions p
    """,
    "committed_records": """
        SELECT r.topic, r.partition, r."offset", r.key, r.value, r.headers, r."timestamp",
               r.producer_id
        FROM records r
        JOIN partitions p ON p.topic = r.topic AND p.partition = r.partition
        WHERE r."offset" < p.last_stable_offset AND r."offset" >= p.log_start_offset
          AND NOT r.is_control
          AND NOT (r.is_transactional AND EXISTS (
              SELECT 1 FROM aborted_txns a
              WHERE a.topic = r.topic AND a.partition = r.partition
                AND a.producer_id = r.producer_id
                AND r."offset" BETWEEN a.first_offset AND a.last_offset))
    """,
    "open_transactions": """
        SELECT t.transactional_id, t.producer_id, t.producer_epoch, t.state,
               to_timestamp(t.txn_start_ms / 1000.0) AS started_at, t.timeout_ms, t.partitions
        FROM transactions t
        WHERE t.state IN ('BEGIN', 'PREPARE_COMMIT', 'PREPARE_ABORT')
    """,
    # Open on a partition while the coordinator has no live transaction covering it, or
    # open longer than its transaction's timeout (kafka-transactions.sh find-hanging).
    "hanging_transactions": """
        SELECT s.topic, s.partition, s.producer_id, s.producer_epoch,
               s.txn_first_offset AS start_offset,
               to_timestamp(first_record."timestamp" / 1000.0) AS started_at
        FROM producer_states s
        LEFT JOIN LATERAL (
            SELECT r."timestamp" FROM records r
            WHERE r.topic = s.topic AND r.partition = s.partition AND r."offset" = s.txn_first_offset
        ) first_record ON true
        LEFT JOIN LATERAL (
            SELECT t.txn_start_ms, t.timeout_ms FROM transactions t
            WHERE (t.producer_id = s.producer_id OR t.last_producer_id = s.producer_id)
              AND t.state IN ('BEGIN', 'PREPARE_COMMIT', 'PREPARE_ABORT')
              AND t.partitions @> jsonb_build_array(jsonb_build_array(s.topic, s.partition))
            LIMIT 1
        ) live ON true
        WHERE s.txn_first_offset IS NOT NULL
          AND (live.txn_start_ms IS NULL
               OR live.txn_start_ms + live.timeout_ms
                  < (extract(epoch FROM clock_timestamp()) * 1000)::bigint)
    """,
    "consumer_group_lag": """
        SELECT g.group_id, g.topic, g.partition, g.committed_offset,
               p.next_offset AS high_watermark, p.last_stable_offset,
               greatest(p.next_offset - g.committed_offset, 0) AS lag, g.metadata
        FROM group_offsets g
        JOIN partitions p ON p.topic = g.topic AND p.partition = g.partition
    """,
    # The live ``kip98 serve`` nodes: registrations whose lease has not lapsed by the
    # database's clock (a lapsed one is removed by the next live node's heartbeat).
    "cluster_nodes": """
        SELECT b.node_id, b.rack, b.listeners, b.host, b.pid,
               to_timestamp(b.registered_ms / 1000.0) AS registered_at,
               to_timestamp(b.heartbeat_ms / 1000.0) AS last_heartbeat_at,
               to_timestamp(b.expires_ms / 1000.0) AS lease_expires_at,
               b.requests
        FROM broker_registrations b
        WHERE b.expires_ms > (extract(epoch FROM clock_timestamp()) * 1000)::bigint
    """,
}

# The members a group's partition is assigned to: a classic member's synced assignment
# ([[topic, partition], ...]) or a consumer group member's (KIP-848: {topic: [partition,
# ...]}, owned, never two members at once); the member epoch is the consumer protocol's.
_OWNERS = """
    SELECT m.group_id, m.member_id, m.client_id, NULL::int AS member_epoch,
           a ->> 0 AS topic, (a ->> 1)::int AS partition
    FROM group_members m CROSS JOIN LATERAL jsonb_array_elements(m.assignment) a
    UNION ALL
    SELECT c.group_id, c.member_id, c.client_id, c.member_epoch, t.key AS topic,
           ps.value::int AS partition
    FROM consumer_group_members c
    CROSS JOIN LATERAL jsonb_each(c.assigned) t
    CROSS JOIN LATERAL jsonb_array_elements_text(t.value) ps
"""

# Later versions of a view, each created by the one migration that names it: an old
# migration creates the version of its time (``VIEWS``), whose tables it knows.
VERSIONS: dict[tuple[str, int], str] = {
    # Version 2 (migration 0028): the partitions a group has committed an offset for or a
    # live member is assigned (its offset and lag NULL until it commits), each once, with
    # the group's type and the member holding it, classic or consumer protocol alike, as
    # kafka-consumer-groups.sh --describe lists them.
    ("consumer_group_lag", 2): f"""
        SELECT g.group_id, g.topic, g.partition, g.committed_offset,
               p.next_offset AS high_watermark, p.last_stable_offset,
               greatest(p.next_offset - g.committed_offset, 0) AS lag, g.metadata,
               coalesce(cg.group_type, 'classic') AS group_type,
               o.member_id, o.client_id, o.member_epoch
        FROM group_offsets g
        JOIN partitions p ON p.topic = g.topic AND p.partition = g.partition
        LEFT JOIN consumer_groups cg ON cg.group_id = g.group_id
        LEFT JOIN LATERAL (
            SELECT o.member_id, o.client_id, o.member_epoch FROM ({_OWNERS}) o
            WHERE o.group_id = g.group_id AND o.topic = g.topic AND o.partition = g.partition
            ORDER BY o.member_id LIMIT 1
        ) o ON true
        UNION ALL
        SELECT * FROM (
            SELECT DISTINCT ON (o.group_id, o.topic, o.partition)
                   o.group_id, o.topic, o.partition, NULL::bigint AS committed_offset,
                   p.next_offset AS high_watermark, p.last_stable_offset,
                   NULL::bigint AS lag, NULL::bytea AS metadata,
                   coalesce(cg.group_type, 'classic') AS group_type,
                   o.member_id, o.client_id, o.member_epoch
            FROM ({_OWNERS}) o
            JOIN partitions p ON p.topic = o.topic AND p.partition = o.partition
            LEFT JOIN consumer_groups cg ON cg.group_id = o.group_id
            WHERE NOT EXISTS (
                SELECT 1 FROM group_offsets g
                WHERE g.group_id = o.group_id AND g.topic = o.topic AND g.partition = o.partition)
            ORDER BY o.group_id, o.topic, o.partition, o.member_id
        ) unread
    """,
}

VIEW_NAMES = frozenset(VIEWS)


def create_views(conn: Connection, names: list[str] | None = None, version: int = 1) -> None:
    """Create ``names`` (every view) at ``version``: 1 is ``VIEWS``', a later one
    ``VERSIONS``', dropped first, since its columns may differ."""
    for name in names or list(VIEWS):
        if version == 1:
            conn.execute(text(f"CREATE OR REPLACE VIEW {name} AS {VIEWS[name]}"))
        else:
            conn.execute(text(f"DROP VIEW IF EXISTS {name}"))
            conn.execute(text(f"CREATE VIEW {name} AS {VERSIONS[(name, version)]}"))


def drop_views(conn: Connection, names: list[str] | None = None) -> None:
    for name in reversed(names or list(VIEWS)):
        conn.execute(text(f"DROP VIEW IF EXISTS {name}"))
