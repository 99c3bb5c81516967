"""ACL management: CreateAcls, DescribeAcls, DeleteAcls.

Changing ACLs needs Alter on the cluster and reading them Describe on the cluster, as in
Kafka; with authorization off anyone who reaches the database may manage them (the
database role is then the only gate, docs/security.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

from app.protocol import AclBinding, AclBindingFilter, validate_binding, validate_filter
from app.security import needs, sql
from app.security.authorizer import authorize_all
from app.security.rules import MATCH, filter_matches
from app.storage.context import BrokerContext
from app.storage.engine import retry_conflicts

__all__ = ["AclBindingFilter", "create_acls", "delete_acls", "describe_acls", "validate_filter"]


def _binding(row: Any) -> AclBinding:
    return AclBinding(
        row.principal, row.resource_type, row.resource_name, row.operation,
        row.permission, row.pattern_type,
    )  # fmt: skip


@retry_conflicts
def create_acls(broker: BrokerContext, acls: Iterable[AclBinding]) -> None:
    """All or nothing: every ACL is checked before any is stored."""
    checked = [validate_binding(a) for a in acls]
    with broker.engine.begin() as conn:
        authorize_all(conn, broker, needs.alter_acls())
        for acl in checked:
            conn.execute(sql.INSERT_ACL, asdict(acl))


def _candidates(acl_filter: AclBindingFilter) -> dict[str, Any]:
    """The SQL filter's parameters: a MATCH filter's name and pattern type are decided by
    ``filter_matches`` on the rows, not in SQL."""
    params = asdict(validate_filter(acl_filter))
    if acl_filter.pattern_type == MATCH:
        params.update(resource_name=None, pattern_type=None)
    return params


def describe_acls(broker: BrokerContext, acl_filter: AclBindingFilter) -> list[AclBinding]:
    params = _candidates(acl_filter)
    with broker.engine.connect() as conn:
        authorize_all(conn, broker, needs.describe_acls())
        rows = conn.execute(sql.SELECT_ACLS, params)
        return [a for a in map(_binding, rows) if filter_matches(acl_filter, a)]


@retry_conflicts
def delete_acls(broker: BrokerContext, acl_filter: AclBindingFilter) -> list[AclBinding]:
    """Delete the ACLs the filter selects; answers with what was deleted."""
    params = _candidates(acl_filter)
    with broker.engine.begin() as conn:
        authorize_all(conn, broker, needs.alter_acls())
        rows = conn.execute(sql.LOCK_ACLS, params)
        chosen = [a for a in map(_binding, rows) if filter_matches(acl_filter, a)]
        for acl in chosen:
            conn.execute(sql.DELETE_ACL, asdict(acl))
        return sorted(
            chosen, key=lambda a: (a.resource_type, a.resource_name, a.principal, a.operation)
        )
