"""The ACL model as pure rules: when an ACL applies, and the decision (what an ACL is, its
values and their checks, is ``app.protocol``'s: requests carry them).

The semantics are Kafka's (its AclAuthorizer), so ACLs written for a Kafka cluster mean
the same here:

- a matching ``deny`` beats any ``allow``;
- the principal ``User:*`` and the literal resource name ``*`` match everyone/everything;
- a ``prefixed`` ACL matches every resource whose name starts with its name;
- ``all`` matches any operation;
- ``describe`` is allowed by an allow of ``read``, ``write``, ``delete`` or ``alter`` (you may
  see what you may use), but only a deny of ``describe`` itself (or ``all``) denies it;
- with no matching ACL the answer is no (Kafka's allow.everyone.if.no.acl.found=false).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from app.errors import KafkaError, KafkaException, fail

# The model's values are the protocol's (requests carry them), named here as well.
from app.protocol import (
    ALL,
    ALLOW,
    ALTER,
    ANY_NAME,
    CLUSTER,
    CLUSTER_ACTION,
    CLUSTER_NAME,
    CREATE,
    DELETE,
    DENY,
    DESCRIBE,
    GROUP,
    LITERAL,
    MATCH,
    OPERATIONS,
    PATTERN_TYPES,
    PERMISSIONS,
    PREFIXED,
    READ,
    RESOURCE_TYPES,
    TOPIC,
    TRANSACTIONAL_ID,
    WRITE,
    AclBinding,
    AclBindingFilter,
    check_text,
    validate_binding,
)

__all__ = [
    "ALL", "ALLOW", "ALTER", "ANONYMOUS", "ANY_NAME", "ANY_PRINCIPAL", "CLUSTER",
    "CLUSTER_ACTION", "CLUSTER_NAME", "CREATE", "DELETE", "DENY", "DESCRIBE", "GROUP",
    "LITERAL", "MATCH", "OPERATIONS", "PATTERN_TYPES", "PERMISSIONS", "PREFIXED", "READ",
    "RESOURCE_TYPES", "TOPIC", "TRANSACTIONAL_ID", "WRITE", "AclBinding", "Check",
    "applies_to", "check_text", "cluster_check", "denied", "filter_matches", "is_allowed",
    "names_resource", "principal_of", "refusal", "validate_binding",
]  # fmt: skip

ANONYMOUS = "User:ANONYMOUS"
ANY_PRINCIPAL = "User:*"

# Operations whose allow also grants describe.
_GRANTS_DESCRIBE = frozenset({DESCRIBE, READ, WRITE, DELETE, ALTER})

_DENIED_CODE = {
    TOPIC: KafkaError.TOPIC_AUTHORIZATION_FAILED,
    GROUP: KafkaError.GROUP_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID: KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    CLUSTER: KafkaError.CLUSTER_AUTHORIZATION_FAILED,
}


@dataclass(frozen=True)
class Check:
    """One thing a request needs: ``operation`` on the named resource."""

    operation: str
    resource_type: str
    name: str


def principal_of(principal: str | None) -> str:
    return principal or ANONYMOUS


def names_resource(acl: AclBinding, resource_type: str, name: str) -> bool:
    if acl.resource_type != resource_type:
        return False
    if acl.pattern_type == PREFIXED:
        return name.startswith(acl.resource_name)
    return acl.resource_name in (ANY_NAME, name)


def filter_matches(f: AclBindingFilter, acl: AclBinding) -> bool:
    """Whether DescribeAcls/DeleteAcls' filter ``f`` selects ``acl``, as Kafka's
    ResourcePatternFilter and AccessControlEntryFilter decide: a field left None matches
    any value, a field given matches only its own value, except the pattern type MATCH,
    which selects the ACLs that would decide about the resource named: the literal ones
    of that name or of ``*``, and the prefixed ones whose name the named one starts with
    (with no name: every ACL). With no pattern type (Kafka's ANY) a name matches exactly,
    whatever the pattern (docs/security.md)."""
    for wanted, value in (
        (f.principal, acl.principal), (f.resource_type, acl.resource_type),
        (f.operation, acl.operation), (f.permission, acl.permission),
    ):  # fmt: skip
        if wanted is not None and wanted != value:
            return False
    if f.pattern_type not in (None, MATCH) and f.pattern_type != acl.pattern_type:
        return False
    if f.resource_name is None:
        return True
    if f.pattern_type != MATCH:
        return f.resource_name == acl.resource_name
    return names_resource(acl, acl.resource_type, f.resource_name)


def applies_to(acl: AclBinding, principal: str) -> bool:
    return acl.principal in (principal, ANY_PRINCIPAL)


def _denies(acl: AclBinding, operation: str) -> bool:
    return acl.permission == DENY and acl.operation in (operation, ALL)


def _allows(acl: AclBinding, operation: str) -> bool:
    if acl.permission != ALLOW:
        return False
    if acl.operation in (operation, ALL):
        return True
    return operation == DESCRIBE and acl.operation in _GRANTS_DESCRIBE


def is_allowed(acls: Iterable[AclBinding], principal: str, check: Check) -> bool:
    """Kafka's decision for one check, given (at least) every ACL that could match."""
    matching = [
        a
        for a in acls
        if applies_to(a, principal) and names_resource(a, check.resource_type, check.name)
    ]
    if any(_denies(a, check.operation) for a in matching):
        return False
    return any(_allows(a, check.operation) for a in matching)


def denied(
    acls: Iterable[AclBinding], principal: str, super_users: frozenset[str], checks: list[Check]
) -> list[Check]:
    """The checks that fail, in request order; super users fail none."""
    if principal in super_users:
        return []
    acls = list(acls)
    return [c for c in checks if not is_allowed(acls, principal, c)]


def refusal(principal: str, check: Check) -> KafkaException:
    """The error a request answers with when ``check`` fails (the code names the resource)."""
    what = (
        "the cluster" if check.resource_type == CLUSTER else f"{check.resource_type} {check.name!r}"
    )
    return fail(
        _DENIED_CODE[check.resource_type],
        f"{principal} is not authorized to {check.operation} {what}",
    )


def cluster_check(operation: str) -> Check:
    return Check(operation, CLUSTER, CLUSTER_NAME)
