"""The authorizer: one query per request, then the pure rules of ``rules``.

Handlers call it first thing inside their DB transaction, so a refused request writes
nothing. With authorization off it is a no-op that does not touch the database, which
keeps the hot paths (Produce, Fetch) exactly as cheap as before; super users are also
decided without a query.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import Connection

from app.errors import KafkaException
from app.security import sql
from app.security.rules import (
    ANY_PRINCIPAL,
    TOPIC,
    AclBinding,
    Check,
    denied,
    principal_of,
    refusal,
)
from app.storage.context import BrokerContext


def denied_checks(conn: Connection, broker: BrokerContext, checks: Sequence[Check]) -> list[Check]:
    """The checks this request fails, in order (empty when authorization is off)."""
    if not broker.settings.authorization or not checks:
        return []
    principal = principal_of(broker.principal)
    super_users = broker.settings.super_user_set
    if principal in super_users:
        return []
    rows = conn.execute(
        sql.ACLS_FOR_REQUEST,
        {
            "principals": [principal, ANY_PRINCIPAL],
            "resource_types": sorted({c.resource_type for c in checks}),
        },
    )
    acls = [AclBinding(r.principal, r.resource_type, r.resource_name, r.operation,
                       r.permission, r.pattern_type) for r in rows]  # fmt: skip
    return denied(acls, principal, super_users, list(checks))


def refusal_for(
    conn: Connection, broker: BrokerContext, checks: Sequence[Check]
) -> KafkaException | None:
    """The error of the first failed check, or None: for handlers that answer, not raise."""
    failed = denied_checks(conn, broker, checks)
    return refusal_of(broker, failed[0]) if failed else None


def refusal_of(broker: BrokerContext, check: Check) -> KafkaException:
    return refusal(principal_of(broker.principal), check)


def authorize_all(conn: Connection, broker: BrokerContext, checks: Sequence[Check]) -> None:
    """Raise the error of the first failed check (the request's order decides which)."""
    error = refusal_for(conn, broker, checks)
    if error is not None:
        raise error


def authorize(
    conn: Connection, broker: BrokerContext, operation: str, resource_type: str, name: object
) -> None:
    authorize_all(conn, broker, [Check(operation, resource_type, str(name))])


def topic_checks(operation: str, topics: Iterable[object]) -> list[Check]:
    """One check per distinct topic, in name order (so an error names the same one each time)."""
    return [Check(operation, TOPIC, name) for name in sorted({str(t) for t in topics})]


def authorize_any(conn: Connection, broker: BrokerContext, alternatives: Sequence[Check]) -> None:
    """Pass if any one check passes (Create on the cluster or on the topic); otherwise
    raise the last one's error, the most specific."""
    failed = denied_checks(conn, broker, alternatives)
    if alternatives and len(failed) == len(alternatives):
        raise refusal_of(broker, failed[-1])
