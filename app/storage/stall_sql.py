"""The SQL of ending stalled sessions (docs/design.md rule 34): two functions kip98
installs (migration 0016), and the statements that call them.

A session counts as waiting on its client when PostgreSQL is reading from it inside a
transaction: ``active`` with the wait event ``ClientRead`` (a COPY's data, a pipeline
without its Sync yet) or ``idle in transaction``. How long: since its statement began
while active, since it went idle otherwise. Both functions are ``SECURITY DEFINER``, owned
by the schema's owner, so a client role can see and end a stalled session of another
login role when the owner may (a superuser, or a member of ``pg_signal_backend`` and
``pg_read_all_stats``), and can end nothing else: they act only on a session that waits on
its client past the bound and blocks another session.
"""

from __future__ import annotations

from sqlalchemy import Connection, text

# The age of a session's wait on its client, and whether it is one.
_SINCE = "CASE a.state WHEN 'active' THEN a.query_start ELSE a.state_change END"
_WAITS_ON_CLIENT = """(
    (a.state = 'active' AND a.wait_event_type = 'Client' AND a.wait_event = 'ClientRead')
    OR a.state IN ('idle in transaction', 'idle in transaction (aborted)'))"""

FUNCTIONS: dict[str, str] = {
    "kip98_stalled_blockers(integer[], bigint)": f"""
        CREATE OR REPLACE FUNCTION kip98_stalled_blockers(waiters integer[], stalled_ms bigint)
        RETURNS TABLE (pid integer, since timestamptz, copy_bytes bigint, state text,
                       application_name text, query text)
        LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
        AS $$
            SELECT a.pid, {_SINCE}, c.bytes_processed, a.state, a.application_name,
                   left(a.query, 200)
            FROM pg_stat_activity a
            LEFT JOIN pg_stat_progress_copy c ON c.pid = a.pid
            WHERE a.pid IN (SELECT unnest(pg_blocking_pids(w)) FROM unnest(waiters) AS w)
              AND a.datname = current_database()
              AND a.backend_type = 'client backend'
              AND {_WAITS_ON_CLIENT}
              AND {_SINCE} <= clock_timestamp() - make_interval(secs => stalled_ms / 1000.0)
        $$
    """,
    "kip98_end_stalled(integer, timestamptz, bigint, bigint)": f"""
        CREATE OR REPLACE FUNCTION kip98_end_stalled(
            stalled_pid integer, stalled_since timestamptz, stalled_copy_bytes bigint,
            stalled_ms bigint)
        RETURNS boolean
        LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
        AS $$
            SELECT coalesce(bool_or(pg_terminate_backend(a.pid)), false)
            FROM pg_stat_activity a
            LEFT JOIN pg_stat_progress_copy c ON c.pid = a.pid
            WHERE a.pid = stalled_pid
              AND a.datname = current_database()
              AND a.backend_type = 'client backend'
              AND {_WAITS_ON_CLIENT}
              AND {_SINCE} = stalled_since
              AND c.bytes_processed IS NOT DISTINCT FROM stalled_copy_bytes
              AND stalled_since <= clock_timestamp() - make_interval(secs => stalled_ms / 1000.0)
              AND EXISTS (SELECT 1 FROM pg_stat_activity w
                          WHERE a.pid = ANY (pg_blocking_pids(w.pid)))
        $$
    """,
}

# Sessions blocking any of ``waiters`` that wait on their client past ``stalled_ms``.
STALLED_BLOCKERS = (
    "SELECT pid, since, copy_bytes, state, application_name, query"
    " FROM kip98_stalled_blockers(%(waiters)s, %(stalled_ms)s)"
)
# End one, if it is still the same wait (same start, no COPY data since) and still blocks.
END_STALLED = "SELECT kip98_end_stalled(%(pid)s, %(since)s, %(copy_bytes)s, %(stalled_ms)s)"


def create_functions(conn: Connection) -> None:
    """Install the functions; only their owner's role and the roles granted it
    (``app.security.roles``) may run them."""
    for signature, ddl in FUNCTIONS.items():
        conn.execute(text(ddl))
        conn.execute(text(f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC"))


def drop_functions(conn: Connection) -> None:
    for signature in FUNCTIONS:
        conn.execute(text(f"DROP FUNCTION IF EXISTS {signature}"))
