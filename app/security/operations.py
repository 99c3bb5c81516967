"""KIP-430's authorized operations: which operations the request's principal may perform
on a resource, as the bit field Metadata, DescribeCluster and DescribeGroups carry when a
client asks for it.

As Kafka's broker works it out: each operation its resource type supports is checked as
a request of it would be, and the allowed ones are the bits set (1 << the operation's
code); with no authorizer configured every supported operation is. kip98's ACLs name the
operations of its model (``app.protocol.OPERATIONS``); the others (describe_configs,
alter_configs, idempotent_write) are granted by an ``all`` ACL, as in Kafka when no ACL
names them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import Connection

from app.protocol import CLUSTER, GROUP, TOPIC, TRANSACTIONAL_ID
from app.security.authorizer import denied_checks
from app.security.rules import Check
from app.storage.context import BrokerContext

# Kafka's AclOperation codes.
OPERATION_CODES = {
    "read": 3, "write": 4, "create": 5, "delete": 6, "alter": 7, "describe": 8,
    "cluster_action": 9, "describe_configs": 10, "alter_configs": 11, "idempotent_write": 12,
}  # fmt: skip

# The operations each resource type supports (Kafka's AclEntry.supportedOperations).
SUPPORTED: dict[str, tuple[str, ...]] = {
    TOPIC: ("read", "write", "create", "describe", "delete", "alter", "describe_configs",
            "alter_configs"),
    GROUP: ("read", "describe", "delete", "describe_configs", "alter_configs"),
    CLUSTER: ("create", "cluster_action", "describe_configs", "alter_configs",
              "idempotent_write", "alter", "describe"),
    TRANSACTIONAL_ID: ("describe", "write"),
}  # fmt: skip


def bit_field(operations: Iterable[str]) -> int:
    """The operations as Kafka's 32-bit field: bit ``code`` set for each."""
    return sum({1 << OPERATION_CODES[op] for op in operations})


def authorized_operations(
    conn: Connection, broker: BrokerContext, resource_type: str, names: Sequence[str]
) -> dict[str, int]:
    """Each resource's authorized operations, from one look at the ACLs."""
    supported = SUPPORTED[resource_type]
    checks = [Check(op, resource_type, name) for name in names for op in supported]
    denied = set(denied_checks(conn, broker, checks))
    return {
        name: bit_field(op for op in supported if Check(op, resource_type, name) not in denied)
        for name in names
    }
