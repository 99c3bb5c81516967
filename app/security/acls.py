"""ACL management: CreateAcls, DescribeAcls, DeleteAcls.

Changing ACLs needs Alter on the cluster and reading them Describe on the cluster, as in
Kafka; with authorization off anyone who reaches the database may manage them (the
database role is then the only gate, docs/security.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from app.errors import KafkaError, fail
from app.security import needs, sql
from app.security.authorizer import authorize_all
from app.security.rules import (
    OPERATIONS,
    PATTERN_TYPES,
    PERMISSIONS,
    RESOURCE_TYPES,
    AclBinding,
    check_text,
    validate_binding,
)
from app.storage.context import BrokerContext
from app.storage.engine import retry_conflicts


@dataclass(frozen=True)
class AclBindingFilter:
    """Selects ACLs for describe/delete: None matches any value of that field."""

    principal: str | None = None
    resource_type: str | None = None
    resource_name: str | None = None
    operation: str | None = None
    permission: str | None = None
    pattern_type: str | None = None


def validate_filter(acl_filter: object) -> AclBindingFilter:
    if not isinstance(acl_filter, AclBindingFilter):
        raise fail(
            KafkaError._INVALID_ARG, f"expected AclBindingFilter, got {type(acl_filter).__name__}"
        )
    for value, allowed, what in (
        (acl_filter.resource_type, RESOURCE_TYPES, "resource type"),
        (acl_filter.pattern_type, PATTERN_TYPES, "pattern type"),
        (acl_filter.operation, OPERATIONS, "operation"),
        (acl_filter.permission, PERMISSIONS, "permission"),
    ):
        if value is not None and value not in allowed:
            raise fail(KafkaError.INVALID_REQUEST, f"unknown {what} {value!r}")
    for value, what in (
        (acl_filter.principal, "principal"),
        (acl_filter.resource_name, "resource name"),
    ):
        if value is not None and not isinstance(value, str):
            raise fail(KafkaError.INVALID_REQUEST, f"{what} must be a string")
        if value is not None:
            check_text(value, what)
    return acl_filter


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


def describe_acls(broker: BrokerContext, acl_filter: AclBindingFilter) -> list[AclBinding]:
    params = asdict(validate_filter(acl_filter))
    with broker.engine.connect() as conn:
        authorize_all(conn, broker, needs.describe_acls())
        return [_binding(r) for r in conn.execute(sql.SELECT_ACLS, params)]


@retry_conflicts
def delete_acls(broker: BrokerContext, acl_filter: AclBindingFilter) -> list[AclBinding]:
    """Delete the ACLs the filter selects; answers with what was deleted."""
    params = asdict(validate_filter(acl_filter))
    with broker.engine.begin() as conn:
        authorize_all(conn, broker, needs.alter_acls())
        return sorted(
            (_binding(r) for r in conn.execute(sql.DELETE_ACLS, params)),
            key=lambda a: (a.resource_type, a.resource_name, a.principal, a.operation),
        )
