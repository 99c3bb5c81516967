"""PostgreSQL roles: the protection that holds even against a client with SQL access.

ACLs are checked by the handlers, which run inside the client's own process; whoever holds
the database credentials can skip the handlers and write SQL. What such a client can do is
decided by PostgreSQL's privileges alone, so clients should log in as members of
``kip98_client``, which may do exactly what the client-side handlers do (append records,
move offsets, run the coordinator) and nothing else: no DELETE or TRUNCATE on the event
tables, no changes to ACLs or topics, no DDL. ``kip98_admin`` may change any row (topic
creation and deletion, ACL management, rebuilds, Spark materialisation); DDL stays with the
owner that runs the migrations.

The grants are listed per table below and rendered as one idempotent SQL script; run it
again after each migration, since new tables start without grants.
"""

from __future__ import annotations

from sqlalchemy import Connection

from app.storage.stall_sql import FUNCTIONS

ADMIN_ROLE = "kip98_admin"
CLIENT_ROLE = "kip98_client"

# What the client-side handlers (Producer, Consumer, their coordinator loop) write, per
# table. Every table and view may be read but those in CLIENT_HIDDEN. SELECT … FOR UPDATE/SHARE needs UPDATE, and an
# upsert needs INSERT and UPDATE.
CLIENT_WRITES: dict[str, tuple[str, ...]] = {
    "records": ("INSERT",),  # appends only: a record is never changed or removed by a client
    "partitions": ("UPDATE",),
    "producer_states": ("INSERT", "UPDATE", "DELETE"),  # DELETE: producer-id expiry
    "aborted_txns": ("INSERT",),
    "producer_ids": ("INSERT",),
    "transaction_log": ("INSERT",),
    "transactions": ("INSERT", "UPDATE", "DELETE"),  # DELETE: transactional-id expiry
    "coordinator_leases": ("INSERT", "UPDATE"),
    "coordinator_loops": ("INSERT", "UPDATE", "DELETE"),
    "coordinator_item_failures": ("INSERT", "UPDATE"),
    "offset_commit_log": ("INSERT",),
    "group_offsets": ("INSERT", "UPDATE"),
    "pending_txn_offsets": ("INSERT", "UPDATE", "DELETE"),
    "consumer_groups": ("INSERT", "UPDATE"),
    "group_members": ("INSERT", "UPDATE", "DELETE"),
    "group_pending_members": ("INSERT", "DELETE"),
    "spark_sink_commits": ("INSERT",),  # a Spark sink's batches, committed with them
}


# Tables a client may not even read: the SASL users' password hashes (an offline guess
# needs no server). ``kip98 serve`` runs as an admin.
CLIENT_HIDDEN = ("sasl_users",)


def _create_role(name: str) -> str:
    # CREATE ROLE has no IF NOT EXISTS; a concurrent run may also win the race.
    return (
        "DO $$ BEGIN\n"
        f"  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{name}') THEN\n"
        f"    CREATE ROLE {name} NOLOGIN;\n"
        "  END IF;\n"
        "EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;\n"
        "END $$;"
    )


def roles_sql(schema: str = "public") -> str:
    """The script creating both roles and their grants in the current database."""
    lines = [
        f"-- kip98 database roles. Log in as a member: CREATE ROLE app LOGIN IN ROLE {CLIENT_ROLE};",
        _create_role(ADMIN_ROLE),
        _create_role(CLIENT_ROLE),
        "DO $$ BEGIN EXECUTE format('GRANT CONNECT ON DATABASE %I TO "
        f"{ADMIN_ROLE}, {CLIENT_ROLE}', current_database()); END $$;",
        f"GRANT USAGE ON SCHEMA {schema} TO {ADMIN_ROLE}, {CLIENT_ROLE};",
        f"GRANT ALL PRIVILEGES ON ALL TABLES IN SCHEMA {schema} TO {ADMIN_ROLE};",
        f"GRANT ALL PRIVILEGES ON ALL SEQUENCES IN SCHEMA {schema} TO {ADMIN_ROLE};",
        "-- Start the client from nothing, so a script run again also takes grants away.",
        f"REVOKE ALL PRIVILEGES ON ALL TABLES IN SCHEMA {schema} FROM {CLIENT_ROLE};",
        f"REVOKE CREATE ON SCHEMA {schema} FROM {CLIENT_ROLE};",
        f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {CLIENT_ROLE};",
        f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO {CLIENT_ROLE};",
    ]
    for table, privileges in CLIENT_WRITES.items():
        lines.append(f"GRANT {', '.join(privileges)} ON {schema}.{table} TO {CLIENT_ROLE};")
    for table in CLIENT_HIDDEN:
        lines.append(f"REVOKE SELECT ON {schema}.{table} FROM {CLIENT_ROLE};")
    # Every process ends the sessions that stall its waits (docs/design.md rule 34).
    for signature in FUNCTIONS:
        lines.append(
            f"GRANT EXECUTE ON FUNCTION {schema}.{signature} TO {ADMIN_ROLE}, {CLIENT_ROLE};"
        )
    return "\n".join(lines) + "\n"


def apply_roles(conn: Connection) -> None:
    """Run the script in ``conn``'s transaction (needs CREATEROLE and the tables' owner)."""
    raw = conn.connection.driver_connection
    assert raw is not None
    with raw.cursor() as cur:
        cur.execute(roles_sql())  # no parameters: several statements in one simple query
