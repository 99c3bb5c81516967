"""ACL filters with the pattern type MATCH, as Kafka's ResourcePatternFilter matches them:
the pure rule (``rules.filter_matches``), and DescribeAcls/DeleteAcls over the wire with
confluent-kafka's AdminClient (librdkafka's suite 0081 filters with MATCH)."""

from __future__ import annotations

from typing import Any

from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from hypothesis import given
from hypothesis import strategies as st

from app.protocol import AclBinding as Acl
from app.protocol import AclBindingFilter as Filter
from app.security import rules

NAMES = ["t", "t1", "tx", "", "*", "u", "t*"]
ACLS = st.builds(
    Acl,
    principal=st.sampled_from(["User:a", "User:b", "User:*"]),
    resource_type=st.sampled_from([rules.TOPIC, rules.GROUP]),
    resource_name=st.sampled_from(NAMES),
    operation=st.sampled_from([rules.READ, rules.WRITE]),
    permission=st.sampled_from([rules.ALLOW, rules.DENY]),
    pattern_type=st.sampled_from([rules.LITERAL, rules.PREFIXED]),
)


def test_match_selects_the_acls_that_decide_about_the_name() -> None:
    t = Filter(resource_type=rules.TOPIC, resource_name="t1", pattern_type=rules.MATCH)
    chosen = {
        (name, pattern): rules.filter_matches(t, Acl("User:a", rules.TOPIC, name, "read", "allow", pattern))
        for name in ("t1", "*", "t", "t1x", "", "u")
        for pattern in (rules.LITERAL, rules.PREFIXED)
    }  # fmt: skip
    assert {k for k, v in chosen.items() if v} == {
        ("t1", rules.LITERAL), ("*", rules.LITERAL),
        ("t1", rules.PREFIXED), ("t", rules.PREFIXED), ("", rules.PREFIXED),
    }  # fmt: skip
    # Without a name, MATCH selects every pattern; without a pattern type (ANY) a name is
    # matched exactly, whatever the pattern.
    acl = Acl("User:a", rules.TOPIC, "x", "read", "allow", rules.PREFIXED)
    assert rules.filter_matches(Filter(pattern_type=rules.MATCH), acl)
    assert not rules.filter_matches(Filter(resource_name="xy"), acl)
    assert rules.filter_matches(Filter(resource_name="x"), acl)


@given(acl=ACLS, name=st.sampled_from([*NAMES, None]), other=st.sampled_from([None, "User:a"]))
def test_match_is_the_union_of_what_would_decide(acl: Acl, name: str | None, other: Any) -> None:
    """MATCH with a name selects exactly the ACLs the authorizer would consult for a
    resource of that name (``names_resource``); the other fields narrow it as usual."""
    f = Filter(principal=other, resource_name=name, pattern_type=rules.MATCH)
    expected = (other is None or acl.principal == other) and (
        name is None or rules.names_resource(acl, acl.resource_type, name)
    )
    assert rules.filter_matches(f, acl) == expected
    # A filter of the ACL's own pattern type, or of none, matches its name exactly.
    for pattern in (None, acl.pattern_type):
        exact = Filter(resource_name=name, pattern_type=pattern)
        assert rules.filter_matches(exact, acl) == (name is None or name == acl.resource_name)


def _acl(
    name: str, pattern: ResourcePatternType, op: AclOperation = AclOperation.READ
) -> AclBinding:
    return AclBinding(
        ResourceType.TOPIC, name, pattern, "User:alice", "*", op, AclPermissionType.ALLOW
    )


def _match(name: str | None) -> AclBindingFilter:
    return AclBindingFilter(
        ResourceType.TOPIC, name, ResourcePatternType.MATCH, None, None,
        AclOperation.ANY, AclPermissionType.ANY,
    )  # fmt: skip


def _names(bindings: Any) -> set[tuple[str, str]]:
    return {(b.name, b.resource_pattern_type.name) for b in bindings}


def test_describe_and_delete_acls_with_a_match_filter(server: str) -> None:
    admin = AdminClient({"bootstrap.servers": server})
    LITERAL, PREFIXED = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
    acls = [_acl("orders", LITERAL), _acl("*", LITERAL), _acl("ord", PREFIXED),
            _acl("orders-eu", LITERAL), _acl("x", PREFIXED), _acl("orders", PREFIXED)]  # fmt: skip
    for future in admin.create_acls(acls).values():
        future.result(30)
    described = admin.describe_acls(_match("orders")).result(30)
    assert _names(described) == {
        ("orders", "LITERAL"), ("*", "LITERAL"), ("ord", "PREFIXED"), ("orders", "PREFIXED"),
    }  # fmt: skip
    assert len(admin.describe_acls(_match(None)).result(30)) == len(acls)
    # ANY with a name: that exact name, either pattern.
    exact = AclBindingFilter(ResourceType.TOPIC, "orders", ResourcePatternType.ANY, None, None,
                             AclOperation.ANY, AclPermissionType.ANY)  # fmt: skip
    assert _names(admin.describe_acls(exact).result(30)) == {
        ("orders", "LITERAL"), ("orders", "PREFIXED"),
    }  # fmt: skip

    (deleted,) = admin.delete_acls([_match("orders-eu")]).values()
    assert _names(deleted.result(30)) == {
        ("orders-eu", "LITERAL"), ("*", "LITERAL"), ("ord", "PREFIXED"), ("orders", "PREFIXED"),
    }  # fmt: skip
    left = admin.describe_acls(_match(None)).result(30)
    assert _names(left) == {("orders", "LITERAL"), ("x", "PREFIXED")}
