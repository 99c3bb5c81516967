"""The ACL model as pure rules: what an ACL is, when it applies, and the decision.

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

TOPIC = "topic"
GROUP = "group"
TRANSACTIONAL_ID = "transactional_id"
CLUSTER = "cluster"
RESOURCE_TYPES = (TOPIC, GROUP, TRANSACTIONAL_ID, CLUSTER)

# Kafka's only cluster resource is named kafka-cluster.
CLUSTER_NAME = "kafka-cluster"

LITERAL = "literal"
PREFIXED = "prefixed"
PATTERN_TYPES = (LITERAL, PREFIXED)

READ = "read"
WRITE = "write"
CREATE = "create"
DELETE = "delete"
DESCRIBE = "describe"
ALTER = "alter"
CLUSTER_ACTION = "cluster_action"
ALL = "all"
OPERATIONS = (READ, WRITE, CREATE, DELETE, DESCRIBE, ALTER, CLUSTER_ACTION, ALL)

ALLOW = "allow"
DENY = "deny"
PERMISSIONS = (ALLOW, DENY)

ANONYMOUS = "User:ANONYMOUS"
ANY_PRINCIPAL = "User:*"
ANY_NAME = "*"

# Operations whose allow also grants describe.
_GRANTS_DESCRIBE = frozenset({DESCRIBE, READ, WRITE, DELETE, ALTER})

_DENIED_CODE = {
    TOPIC: KafkaError.TOPIC_AUTHORIZATION_FAILED,
    GROUP: KafkaError.GROUP_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID: KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    CLUSTER: KafkaError.CLUSTER_AUTHORIZATION_FAILED,
}


@dataclass(frozen=True)
class AclBinding:
    """One ACL: ``principal`` may (``allow``) or may not (``deny``) perform ``operation`` on
    the resources that ``resource_type``/``resource_name``/``pattern_type`` select."""

    principal: str
    resource_type: str
    resource_name: str
    operation: str
    permission: str = ALLOW
    pattern_type: str = LITERAL


@dataclass(frozen=True)
class Check:
    """One thing a request needs: ``operation`` on the named resource."""

    operation: str
    resource_type: str
    name: str


def principal_of(principal: str | None) -> str:
    return principal or ANONYMOUS


def check_text(value: str, what: str) -> None:
    """A name stored in a PostgreSQL text column: NUL cannot be stored, so it is refused
    as a bad request rather than failing in the database."""
    if "\x00" in value:
        raise fail(KafkaError.INVALID_REQUEST, f"{what} must not contain NUL")


def validate_binding(acl: object) -> AclBinding:
    """An ACL fit to store: known enumerations, a ``Type:name`` principal, a name."""
    if not isinstance(acl, AclBinding):
        raise fail(KafkaError._INVALID_ARG, f"expected AclBinding, got {type(acl).__name__}")
    for value, allowed, what in (
        (acl.resource_type, RESOURCE_TYPES, "resource type"),
        (acl.pattern_type, PATTERN_TYPES, "pattern type"),
        (acl.operation, OPERATIONS, "operation"),
        (acl.permission, PERMISSIONS, "permission"),
    ):
        if value not in allowed:
            raise fail(
                KafkaError.INVALID_REQUEST,
                f"unknown {what} {value!r}; expected one of {', '.join(allowed)}",
            )
    if not isinstance(acl.principal, str) or ":" not in acl.principal.strip(":"):
        raise fail(
            KafkaError.INVALID_REQUEST, f"principal {acl.principal!r} must look like User:name"
        )
    if not isinstance(acl.resource_name, str) or not acl.resource_name:
        raise fail(KafkaError.INVALID_REQUEST, "resource name must be a non-empty string")
    check_text(acl.principal, "principal")
    check_text(acl.resource_name, "resource name")
    if acl.resource_type == CLUSTER and acl.resource_name != CLUSTER_NAME:
        raise fail(KafkaError.INVALID_REQUEST, f"the cluster resource is named {CLUSTER_NAME}")
    if acl.pattern_type == PREFIXED and acl.resource_name == ANY_NAME:
        raise fail(KafkaError.INVALID_REQUEST, "a prefixed ACL cannot use the wildcard name")
    return acl


def names_resource(acl: AclBinding, resource_type: str, name: str) -> bool:
    if acl.resource_type != resource_type:
        return False
    if acl.pattern_type == PREFIXED:
        return name.startswith(acl.resource_name)
    return acl.resource_name in (ANY_NAME, name)


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
