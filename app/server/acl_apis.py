"""The Kafka ACL APIs: CreateAcls, DescribeAcls, DeleteAcls, onto the broker's requests.

The wire names an ACL's parts by Kafka's enumeration codes; the broker's ACLs by name.
A code kip98 has no name for (a delegation token, IdempotentWrite) becomes a name the
broker refuses as a bad request. kip98's ACLs hold for every host (Kafka's ``*``): an ACL
for one host is refused rather than stored wider than asked, and a filter on one host
matches none.
"""

from __future__ import annotations

from typing import Any

from app.broker import Broker
from app.errors import KafkaError
from app.protocol import (
    AclBinding,
    AclBindingFilter,
    CreateAclsRequest,
    DeleteAclsRequest,
    DescribeAclsRequest,
)
from app.server.node import Node

# Kafka's ResourceType, PatternType, AclOperation and AclPermissionType codes.
_ANY = 1
_RESOURCE_TYPES = {2: "topic", 3: "group", 4: "cluster", 5: "transactional_id",
                   6: "delegation_token", 7: "user"}  # fmt: skip
_PATTERN_TYPES = {2: "match", 3: "literal", 4: "prefixed"}
_OPERATIONS = {2: "all", 3: "read", 4: "write", 5: "create", 6: "delete", 7: "alter",
               8: "describe", 9: "cluster_action", 10: "describe_configs",
               11: "alter_configs", 12: "idempotent_write", 13: "create_tokens",
               14: "describe_tokens"}  # fmt: skip
_PERMISSIONS = {2: "deny", 3: "allow"}
_CODES = {
    field: {name: code for code, name in table.items()}
    for field, table in (("resource_type", _RESOURCE_TYPES), ("pattern_type", _PATTERN_TYPES),
                         ("operation", _OPERATIONS), ("permission", _PERMISSIONS))
}  # fmt: skip
ANY_HOST = "*"


def _name(table: dict[int, str], code: int) -> str:
    return table.get(code, f"unknown ({code})")


def _filter_name(table: dict[int, str], code: int) -> str | None:
    return None if code == _ANY else _name(table, code)


def _codes(acl: AclBinding) -> dict[str, Any]:
    return {
        "resource_type": _CODES["resource_type"][acl.resource_type],
        "resource_name": acl.resource_name,
        "pattern_type": _CODES["pattern_type"][acl.pattern_type],
        "principal": acl.principal,
        "host": ANY_HOST,
        "operation": _CODES["operation"][acl.operation],
        "permission_type": _CODES["permission"][acl.permission],
    }


def _acl_filter(f: Any) -> AclBindingFilter:
    return AclBindingFilter(
        principal=f.principal_filter,
        resource_type=_filter_name(_RESOURCE_TYPES, f.resource_type_filter),
        resource_name=f.resource_name_filter,
        operation=_filter_name(_OPERATIONS, f.operation),
        permission=_filter_name(_PERMISSIONS, f.permission_type),
        pattern_type=_filter_name(_PATTERN_TYPES, f.pattern_type_filter),
    )


def _any_host(host: str | None) -> bool:
    return host is None or host == ANY_HOST


def create_acls(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    """All the creations stored together or none, as the broker's CreateAcls does."""
    bindings = [
        AclBinding(
            c.principal, _name(_RESOURCE_TYPES, c.resource_type), c.resource_name,
            _name(_OPERATIONS, c.operation), _name(_PERMISSIONS, c.permission_type),
            _name(_PATTERN_TYPES, c.resource_pattern_type),
        )
        for c in request.creations
    ]  # fmt: skip
    if not all(_any_host(c.host) for c in request.creations):
        return {"results": [_refused_for_host(c.host) for c in request.creations]}
    answers = broker.handle(CreateAclsRequest(bindings)).results
    return {
        "results": [{"error_code": a.error_code, "error_message": a.error_message} for a in answers]
    }


def _refused_for_host(host: str | None) -> dict[str, Any]:
    """A creation of a request that names a host: each result says its own reason only
    (one that listed every refused host made an answer quadratic in the request)."""
    if _any_host(host):
        message = "not created: another ACL of the request names a host"
    else:
        message = f"ACLs hold for every host ({ANY_HOST}), not for host {host!r}"
    return {"error_code": KafkaError.INVALID_REQUEST, "error_message": message}


def describe_acls(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    """The ACLs found, grouped by resource as Kafka's answer is."""
    if not _any_host(request.host_filter):
        return {"error_code": 0, "resources": []}
    a = broker.handle(DescribeAclsRequest(_acl_filter(request)))
    resources: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for acl in a.acls:
        codes = _codes(acl)
        key = (acl.resource_type, acl.resource_name, acl.pattern_type)
        resources.setdefault(key, []).append(
            {"principal": acl.principal, "host": ANY_HOST, "operation": codes["operation"],
             "permission_type": codes["permission_type"]}
        )  # fmt: skip
    return {
        "error_code": a.error_code, "error_message": a.error_message,
        "resources": [
            {"resource_type": _CODES["resource_type"][t], "resource_name": n,
             "pattern_type": _CODES["pattern_type"][p], "acls": acls}
            for (t, n, p), acls in resources.items()
        ],
    }  # fmt: skip


def delete_acls(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    """Each filter on its own; one on a single host deletes nothing."""
    filters = [f for f in request.filters if _any_host(f.host_filter)]
    answers = iter(
        broker.handle(DeleteAclsRequest([_acl_filter(f)])).filter_results[0] for f in filters
    )
    results = []
    for f in request.filters:
        if not _any_host(f.host_filter):
            results.append({"error_code": 0, "matching_acls": []})
            continue
        a = next(answers)
        matching = [{"error_code": 0, **_codes(acl)} for acl in a.matching_acls]
        results.append(
            {
                "error_code": a.error_code,
                "error_message": a.error_message,
                "matching_acls": matching,
            }
        )
    return {"filter_results": results}
