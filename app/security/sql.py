"""Every SQL statement of authorization and ACL management."""

from __future__ import annotations

from sqlalchemy import text

_COLUMNS = "principal, resource_type, resource_name, pattern_type, operation, permission"

# The ACLs that can decide a request: the caller's and everyone's, for the resource types
# it touches. Served by the primary key, which leads with (principal, resource_type).
ACLS_FOR_REQUEST = text(
    f"SELECT {_COLUMNS} FROM acls "
    "WHERE principal = ANY(CAST(:principals AS text[])) "
    "AND resource_type = ANY(CAST(:resource_types AS text[]))"
)

INSERT_ACL = text(
    f"INSERT INTO acls ({_COLUMNS}) VALUES (:principal, :resource_type, :resource_name, "
    ":pattern_type, :operation, :permission) ON CONFLICT DO NOTHING"
)

# A filter's candidates: a NULL parameter matches any value of its column. The name and
# pattern type are left to ``rules.filter_matches`` (passed as NULL) for a MATCH filter.
_FILTER = (
    "(CAST(:principal AS text) IS NULL OR principal = :principal) "
    "AND (CAST(:resource_type AS text) IS NULL OR resource_type = :resource_type) "
    "AND (CAST(:resource_name AS text) IS NULL OR resource_name = :resource_name) "
    "AND (CAST(:pattern_type AS text) IS NULL OR pattern_type = :pattern_type) "
    "AND (CAST(:operation AS text) IS NULL OR operation = :operation) "
    "AND (CAST(:permission AS text) IS NULL OR permission = :permission)"
)

SELECT_ACLS = text(
    f"SELECT {_COLUMNS} FROM acls WHERE {_FILTER} "
    "ORDER BY resource_type, resource_name, pattern_type, principal, operation, permission"
)

# The candidates of a deletion, locked until the chosen ones are deleted.
LOCK_ACLS = text(f"SELECT {_COLUMNS} FROM acls WHERE {_FILTER} FOR UPDATE")

DELETE_ACL = text(
    "DELETE FROM acls WHERE principal = :principal AND resource_type = :resource_type "
    "AND resource_name = :resource_name AND pattern_type = :pattern_type "
    "AND operation = :operation AND permission = :permission"
)


# ---------------------------------------------------------------- SASL users (``users``)

UPSERT_SASL_USER = text(
    "INSERT INTO sasl_users (name, mechanism, salt, iterations, stored_key, server_key, "
    "created_ms) VALUES (:name, :mechanism, :salt, :iterations, :stored_key, :server_key, :now) "
    "ON CONFLICT (name, mechanism) DO UPDATE SET salt = EXCLUDED.salt, "
    "iterations = EXCLUDED.iterations, stored_key = EXCLUDED.stored_key, "
    "server_key = EXCLUDED.server_key, created_ms = EXCLUDED.created_ms"
)
DELETE_SASL_USER = text("DELETE FROM sasl_users WHERE name = :name RETURNING name")
DELETE_SASL_CREDENTIAL = text(
    "DELETE FROM sasl_users WHERE name = :name AND mechanism = :mechanism RETURNING name"
)
SASL_USERS = text("SELECT name, mechanism, created_ms FROM sasl_users ORDER BY name, mechanism")
SASL_USER = text(
    "SELECT salt, iterations, stored_key, server_key FROM sasl_users "
    "WHERE name = :name AND mechanism = :mechanism"
)
# Users' SCRAM credentials (mechanism and iterations, never a key), of the names given or
# (NULL) of everyone; a user's rows locked while its alterations are applied.
SCRAM_CREDENTIALS = text(
    """
    SELECT name, mechanism, iterations FROM sasl_users
    WHERE mechanism LIKE 'SCRAM-%' AND (CAST(:names AS text[]) IS NULL OR name = ANY(:names))
    ORDER BY name, mechanism
    """
)
LOCK_SASL_USER = text(
    "SELECT mechanism FROM sasl_users WHERE name = :name ORDER BY mechanism FOR UPDATE"
)
