"""Every SQL statement of the node registrations (``broker_registrations``), in one place.

A change of who is in the cluster (a node registering or leaving, lapsed registrations
removed) holds the table in SHARE ROW EXCLUSIVE mode to its COMMIT: the changes are
serialised, each sees the rows the one before left, and two nodes registering at once
get different node ids. Reads are not blocked; a heartbeat waits for a change to end.
"""

from __future__ import annotations

from sqlalchemy import text

COLUMNS = (
    "node_id, incarnation, rack, listeners, host, pid, registered_ms, heartbeat_ms, "
    "expires_ms, requests"
)

# A change of who is in the cluster commits on the primary alone: a node must register,
# renew and leave whether the standbys answer or not, and one lost to a failover is made
# again, to the same effect, by the node's next heartbeat or its lease's lapse.
LOCAL_COMMIT = text("SET LOCAL synchronous_commit TO 'local'")
LOCK = text("LOCK TABLE broker_registrations IN SHARE ROW EXCLUSIVE MODE")
# No change of who is in the cluster (LOCK) until the end of the DB transaction; others
# reading it go on.
HOLD_STILL = text("LOCK TABLE broker_registrations IN SHARE MODE")
ALL = text(f"SELECT {COLUMNS} FROM broker_registrations ORDER BY node_id")
LIVE = text(f"SELECT {COLUMNS} FROM broker_registrations WHERE expires_ms > :now ORDER BY node_id")
DELETE_LAPSED = text("DELETE FROM broker_registrations WHERE expires_ms <= :now")
# A registration: a new row, or the node's own row again (a retried registration).
REGISTER = text(
    f"""
    INSERT INTO broker_registrations ({COLUMNS})
    VALUES (:node_id, :incarnation, :rack, CAST(:listeners AS jsonb), :host, :pid, :now, :now,
            :expires_ms, 0)
    ON CONFLICT (node_id) DO UPDATE SET
        rack = excluded.rack, listeners = excluded.listeners, host = excluded.host,
        pid = excluded.pid, heartbeat_ms = excluded.heartbeat_ms, expires_ms = excluded.expires_ms
    WHERE broker_registrations.incarnation = excluded.incarnation
    RETURNING node_id
    """
)
# A heartbeat renews only a lease that has not lapsed: a lapsed one counts as gone to every
# reader, so coming back is a registration (and a change of who is in the cluster). It
# also says whether another registration has lapsed, to be removed.
HEARTBEAT = text(
    """
    WITH renewed AS (
        UPDATE broker_registrations
        SET heartbeat_ms = :now, expires_ms = :expires_ms, requests = :requests
        WHERE node_id = :node_id AND incarnation = :incarnation AND expires_ms > :now
        RETURNING node_id
    )
    SELECT EXISTS (SELECT 1 FROM renewed) AS renewed,
           EXISTS (SELECT 1 FROM broker_registrations WHERE expires_ms <= :now) AS lapsed
    """
)
UNREGISTER = text(
    "DELETE FROM broker_registrations WHERE node_id = :node_id AND incarnation = :incarnation"
)
# Each topic's partition count: what leadership is placed over.
TOPIC_PARTITIONS = text("SELECT topic, num_partitions FROM topics ORDER BY topic")
