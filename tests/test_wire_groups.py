"""Consumer groups through ``kip98 serve``: librdkafka's subscribe() with the classic
protocol (the leader member assigns; the coordinator keeps generations), rebalancing
between two members, read_committed, and every served version of the group APIs."""

from __future__ import annotations

import socket
import time
from typing import Any

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient
from kio.index import load_request_schema

from app.broker import Broker
from app.errors import KafkaError
from app.log.topics import create_topic
from app.server.apis import APIS
from app.server.codec import build
from tests.helpers.wire_client import delivered, read_response, request_frame

FAST_GROUP = {
    "session.timeout.ms": 6000, "heartbeat.interval.ms": 300, "enable.auto.commit": False,
    "auto.offset.reset": "earliest", "isolation.level": "read_committed",
}  # fmt: skip


def test_two_subscribed_members_rebalance_and_read_only_committed_records(
    server: str, broker: Broker
) -> None:
    create_topic(broker, "four", 4)
    producer = ck.Producer({"bootstrap.servers": server, "transactional.id": "grp-writer"})
    producer.init_transactions(30)

    def write(prefix: str, commit: bool) -> None:
        producer.begin_transaction()
        for p in range(4):
            delivered(producer, 3, topic="four", partition=p, key=f"{prefix}{p}")
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)

    write("first", True)
    write("aborted", False)
    assigned: dict[str, list[int]] = {}

    def member(name: str) -> ck.Consumer:
        c = ck.Consumer(
            {"bootstrap.servers": server, "group.id": "readers", "client.id": f"reader-{name}",
             **FAST_GROUP}
        )  # fmt: skip
        c.subscribe(
            ["four"], on_assign=lambda _, ps: assigned.__setitem__(name, [p.partition for p in ps])
        )
        return c

    def poll_until(members: list[ck.Consumer], done: Any, seen: list[Any]) -> None:
        deadline = time.monotonic() + 60
        while not done() and time.monotonic() < deadline:
            for c in members:
                msg = c.poll(0.1)
                if msg is not None:
                    assert msg.error() is None, msg.error()
                    seen.append(msg)
        assert done(), assigned

    one, two = member("one"), None
    try:
        seen: list[Any] = []
        poll_until([one], lambda: len(seen) >= 12, seen)
        assert assigned["one"] == [0, 1, 2, 3]
        assert sorted(m.key() for m in seen) == sorted(
            f"first{p}".encode() for p in range(4) for _ in range(3)
        )  # nothing of the aborted transaction
        one.commit(asynchronous=False)

        two = member("two")
        poll_until(
            [one, two], lambda: len(assigned.get("two", [])) == 2 and len(assigned["one"]) == 2, []
        )
        assert sorted(assigned["one"] + assigned["two"]) == [0, 1, 2, 3]
        admin = AdminClient({"bootstrap.servers": server})
        listed = admin.list_consumer_groups().result(30)
        assert "readers" in [g.group_id for g in listed.valid]
        described = admin.describe_consumer_groups(["readers"])["readers"].result(30)
        assert str(described.state).endswith("STABLE")
        owned = {
            m.member_id: sorted(tp.partition for tp in m.assignment.topic_partitions)
            for m in described.members
        }
        assert sorted(owned.values()) == sorted([assigned["one"], assigned["two"]])
        # Who each member is, as Kafka's coordinator records it from the request header
        # and the connection.
        assert sorted((m.client_id, m.host) for m in described.members) == [
            ("reader-one", "/127.0.0.1"),
            ("reader-two", "/127.0.0.1"),
        ]

        write("second", True)
        after: list[Any] = []
        poll_until([one, two], lambda: len(after) >= 12, after)
        assert sorted(m.key() for m in after) == sorted(
            f"second{p}".encode() for p in range(4) for _ in range(3)
        )  # each once: the first member's committed offsets carried over the rebalance
        two.close()
        poll_until([one], lambda: len(assigned["one"]) == 4, [])
    finally:
        one.close()
        if two is not None:
            two.close()


def _call(sock: socket.socket, api_key: int, version: int, values: dict[str, Any]) -> Any:
    """One request, built from plain values as the server builds its answers."""
    sock.sendall(
        request_frame(api_key, version, build(load_request_schema(api_key, version), values))
    )
    return read_response(sock, api_key, version)


def test_every_served_version_of_the_group_apis(server: str, broker: Broker) -> None:
    """One member joins, syncs, heartbeats, is listed and described, and leaves, in each
    version served: what ApiVersions advertises is what answers."""
    create_topic(broker, "t", 1)
    host, port = server.split(":")
    served = {key: APIS[key][:2] for key in (11, 12, 13, 14, 15, 16)}
    assert served == {11: (0, 9), 12: (0, 4), 13: (0, 5), 14: (0, 5), 15: (0, 5), 16: (0, 5)}
    with socket.create_connection((host, int(port)), 10) as s:
        # JoinGroup's versions are the most; each round also takes the others' version
        # of the same number, up to their highest, so every served version is used.
        for version in range(0, 10):
            group = f"v{version}"
            request = {
                "group_id": group, "session_timeout": 60_000, "rebalance_timeout": 60_000,
                "member_id": "", "protocol_type": "consumer",
                "protocols": [{"name": "range", "metadata": b"\0\0"}],
            }  # fmt: skip
            joined = _call(s, 11, version, request)
            if version >= 4:  # KIP-394: a member id first, then the join with it
                assert joined.error_code == KafkaError.MEMBER_ID_REQUIRED and joined.member_id
                joined = _call(s, 11, version, {**request, "member_id": joined.member_id})
            assert joined.error_code == 0 and joined.leader == joined.member_id
            assert [m.metadata for m in joined.members] == [b"\0\0"]
            assert version < 7 or joined.protocol_name == "range"
            member, gen = joined.member_id, joined.generation_id
            ids = {"group_id": group, "generation_id": gen, "member_id": member}

            synced = _call(s, 14, min(version, 5), {
                **ids, "assignments": [{"member_id": member, "assignment": b"A"}],
            })  # fmt: skip
            assert (synced.error_code, synced.assignment) == (0, b"A")
            assert _call(s, 12, min(version, 4), ids).error_code == 0

            described = _call(s, 15, min(version, 5), {"groups": [group]}).groups[0]
            assert described.group_state == "Stable" and described.protocol_data == "range"
            assert described.members[0].member_assignment == b"A"
            listed = _call(s, 16, min(version, 5), {})
            assert group in [g.group_id for g in listed.groups]

            v = min(version, 5)
            left = _call(s, 13, v, {"group_id": group, "member_id": member,
                                    "members": [{"member_id": member}]})  # fmt: skip
            assert left.error_code == 0
            assert v < 3 or [m.error_code for m in left.members] == [0]
            gone = _call(s, 12, min(version, 4), ids)
            assert gone.error_code == KafkaError.UNKNOWN_MEMBER_ID


def test_a_join_without_member_id_is_handed_one_and_leaves_no_member_behind(
    server: str, broker: Broker
) -> None:
    """KIP-394: JoinGroup v4+ without a member id is answered MEMBER_ID_REQUIRED with an id
    at once, and no member; a client that lost that answer and asks again leaves only an
    id nobody uses, which expires with its session timeout. The join with the id is the
    member, and the group's only one."""
    host, port = server.split(":")
    request = {
        "group_id": "kip394", "session_timeout": 6_000, "rebalance_timeout": 60_000,
        "member_id": "", "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b"\0\0"}],
    }  # fmt: skip
    with socket.create_connection((host, int(port)), 10) as s:
        lost = _call(s, 11, 5, request)
        given = _call(s, 11, 5, request)
        assert [lost.error_code, given.error_code] == [KafkaError.MEMBER_ID_REQUIRED] * 2
        assert lost.member_id and given.member_id and lost.member_id != given.member_id
        assert not _call(s, 15, 5, {"groups": ["kip394"]}).groups[0].members
        joined = _call(s, 11, 5, {**request, "member_id": given.member_id})
        assert (joined.error_code, joined.member_id) == (0, given.member_id)
        assert [m.member_id for m in joined.members] == [given.member_id]
        described = _call(s, 15, 5, {"groups": ["kip394"]}).groups[0]
        assert [m.member_id for m in described.members] == [given.member_id]
    # librdkafka takes the id and joins with it.
    create_topic(broker, "kip394", 2)
    c = ck.Consumer({"bootstrap.servers": server, "group.id": "rk394", **FAST_GROUP})
    try:
        c.subscribe(["kip394"])
        deadline = time.monotonic() + 120
        while not c.assignment() and time.monotonic() < deadline:
            c.poll(0.2)
        assert sorted(tp.partition for tp in c.assignment()) == [0, 1]
        with socket.create_connection((host, int(port)), 10) as s:
            assert len(_call(s, 15, 5, {"groups": ["rk394"]}).groups[0].members) == 1
    finally:
        c.close()


def test_a_static_member_restarts_without_rebalancing_the_group(
    server: str, broker: Broker
) -> None:
    """KIP-345 (librdkafka's 0102): a static member that closes (sending no LeaveGroup) and
    comes back with its group.instance.id gets its old partitions back, and the other
    member, polling all along, is never asked to revoke or take new ones."""
    create_topic(broker, "static", 4)
    config = {"bootstrap.servers": server, "group.id": "static", **FAST_GROUP,
              "session.timeout.ms": 60_000}  # fmt: skip
    rebalances: list[str] = []
    one = ck.Consumer({**config, "group.instance.id": "one"})
    one.subscribe(
        ["static"],
        on_assign=lambda c, tps: rebalances.append("assign"),
        on_revoke=lambda c, tps: rebalances.append("revoke"),
    )

    def assigned(consumer: ck.Consumer) -> list[int]:
        deadline = time.monotonic() + 120
        while len(consumer.assignment()) != 2 and time.monotonic() < deadline:
            consumer.poll(0.1)
            one.poll(0.1)
        return sorted(tp.partition for tp in consumer.assignment())

    two = ck.Consumer({**config, "group.instance.id": "two"})
    try:
        two.subscribe(["static"])
        before = assigned(two)
        while len(one.assignment()) != 2:
            one.poll(0.1)
            two.poll(0.1)
        two.close()  # a static member leaves no LeaveGroup behind
        seen = list(rebalances)
        two = ck.Consumer({**config, "group.instance.id": "two"})
        two.subscribe(["static"])
        assert assigned(two) == before
        assert rebalances == seen
    finally:
        two.close()
        one.close()
