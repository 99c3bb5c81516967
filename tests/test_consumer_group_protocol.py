"""KIP-848 through ``kip98 serve``: the features ApiVersions gives (group.version,
transaction.version, and the operator's pin), and ConsumerGroupHeartbeat /
ConsumerGroupDescribe spoken raw: epochs, revocation before assignment, fencing, leave,
static members, and the offset commits' member epoch check (docs/design.md rules 60-63)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kio.index import load_request_schema

from app.broker import Broker
from app.errors import KafkaError
from app.log.topics import create_topic
from app.server.codec import build
from tests.helpers.cli_runner import KIP98_BIN
from tests.helpers.wire_client import exchange, serving

HEARTBEAT, DESCRIBE, API_VERSIONS, OFFSET_COMMIT, OFFSET_FETCH = 68, 69, 18, 8, 9


def call(server: str, api_key: int, version: int, values: dict[str, Any]) -> Any:
    return exchange(server, api_key, version, build(load_request_schema(api_key, version), values))


def beat(server: str, group: str, member: str, epoch: int, **fields: Any) -> Any:
    values = {"group_id": group, "member_id": member, "member_epoch": epoch,
              "rebalance_timeout": fields.pop("rebalance_timeout", -1),
              "topic_partitions": None, **fields}  # fmt: skip
    return call(server, HEARTBEAT, 1, values)


def join(server: str, group: str, member: str, topics: list[str], **fields: Any) -> Any:
    fields.setdefault("rebalance_timeout", 30000)
    return beat(
        server, group, member, 0, subscribed_topic_names=topics, topic_partitions=[], **fields
    )


def owned(answer: Any) -> list[dict[str, Any]]:
    """The partitions an answer assigned, as the next heartbeat reports them."""
    return [
        {"topic_id": tp.topic_id, "partitions": list(tp.partitions)}
        for tp in answer.assignment.topic_partitions
    ]


def count(answer: Any) -> int:
    return sum(len(tp.partitions) for tp in answer.assignment.topic_partitions)


def test_api_versions_gives_the_features_kafka_4_4_names(server: str) -> None:
    v3 = call(
        server, API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"}
    )
    finalized = {f.name: (f.min_version_level, f.max_version_level) for f in v3.finalized_features}
    assert finalized == {"group.version": (1, 1), "transaction.version": (2, 2)}
    assert v3.finalized_features_epoch >= 0
    assert [f.name for f in v3.supported_features] == []  # v3 leaves out those from level 0
    v4 = call(
        server, API_VERSIONS, 4, {"client_software_name": "t", "client_software_version": "1"}
    )
    supported = {f.name: (f.min_version, f.max_version) for f in v4.supported_features}
    assert supported == {"group.version": (0, 1), "transaction.version": (0, 2)}
    keys = {k.api_key: (k.min_version, k.max_version) for k in v4.api_keys}
    assert keys[HEARTBEAT] == (0, 1) and keys[DESCRIBE] == (0, 1)


@pytest.fixture
def group_version_0(db_url: str) -> Iterator[str]:
    with serving(db_url, env={"KIP98_FEATURES": "group.version=0"}) as address:
        yield address


def test_the_operator_pins_group_version_0_and_the_heartbeat_is_unsupported(
    group_version_0: str,
) -> None:
    server = group_version_0
    v3 = call(
        server, API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"}
    )
    assert {f.name for f in v3.finalized_features} == {"transaction.version"}
    # Kafka 4.4 with group.version downgraded to 0 still lists ConsumerGroupHeartbeat and
    # ConsumerGroupDescribe at 0-1 (kafka-features downgrade, then ApiVersions): so does
    # kip98, and answers them UNSUPPORTED_VERSION.
    keys = {k.api_key: (k.min_version, k.max_version) for k in v3.api_keys}
    assert keys[HEARTBEAT] == (0, 1) and keys[DESCRIBE] == (0, 1)
    answer = join(server, "g", str(uuid.uuid4()), ["t"])
    assert answer.error_code == 35  # UNSUPPORTED_VERSION, as Kafka with the feature off
    described = call(server, DESCRIBE, 0, {"group_ids": ["g"]})
    assert described.groups[0].error_code == 35


def test_members_reconcile_revoking_before_a_partition_moves(server: str, broker: Broker) -> None:
    create_topic(broker, "orders", 4)
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    # A new group starts at epoch 1, and a's subscription bumps it (as Kafka 4.4 counts).
    first = join(server, "g1", a, ["orders"])
    assert first.error_code == 0 and first.member_epoch == 2 and count(first) == 4
    # b joins: epoch 3, but a still holds everything, so b is given nothing yet.
    second = join(server, "g1", b, ["orders"])
    assert second.error_code == 0 and second.member_epoch == 3 and count(second) == 0
    # a is asked to revoke two partitions, staying at epoch 2 until it acknowledges.
    asked = beat(server, "g1", a, 2, topic_partitions=owned(first))
    assert asked.member_epoch == 2 and count(asked) == 2
    # b heartbeats meanwhile: still nothing, the two are not released yet.
    waiting = beat(server, "g1", b, 3, topic_partitions=[])
    assert waiting.error_code == 0 and (waiting.assignment is None or count(waiting) == 0)
    done = beat(server, "g1", a, 2, topic_partitions=owned(asked))
    assert done.error_code == 0 and done.member_epoch == 3
    given = beat(server, "g1", b, 3, topic_partitions=[])
    assert count(given) == 2
    kept = {p for tp in asked.assignment.topic_partitions for p in tp.partitions}
    moved = {p for tp in given.assignment.topic_partitions for p in tp.partitions}
    assert kept.isdisjoint(moved) and kept | moved == {0, 1, 2, 3}
    described = call(server, DESCRIBE, 1, {"group_ids": ["g1"]}).groups[0]
    assert described.error_code == 0 and described.group_state == "Stable"
    assert described.group_epoch == 3 and described.assignment_epoch == 3
    assert {m.member_id: m.member_epoch for m in described.members} == {a: 3, b: 3}
    # The group is a consumer group: ListGroups says so, DescribeGroups shows it Dead.
    listed = call(server, 16, 5, {"states_filter": [], "types_filter": ["consumer"]})
    assert [(g.group_id, g.group_type) for g in listed.groups] == [("g1", "consumer")]
    classic = call(server, 15, 5, {"groups": ["g1"]}).groups[0]
    assert (classic.error_code, classic.group_state, classic.members) == (0, "Dead", ())


def test_kafkas_errors_for_epochs_members_and_groups(server: str, broker: Broker) -> None:
    create_topic(broker, "t", 2)
    a = str(uuid.uuid4())
    assert beat(server, "none", a, 3).error_code == KafkaError.GROUP_ID_NOT_FOUND
    joined = join(server, "g2", a, ["t"])
    assert joined.member_epoch == 2
    assert beat(server, "g2", a, 5).error_code == KafkaError.FENCED_MEMBER_EPOCH
    stranger = beat(server, "g2", str(uuid.uuid4()), 1)
    assert stranger.error_code == KafkaError.UNKNOWN_MEMBER_ID
    unsubscribed = beat(server, "g2", "", 0, rebalance_timeout=30000, topic_partitions=[])
    assert unsubscribed.error_code == KafkaError.INVALID_REQUEST  # neither names nor regex
    bad = join(server, "g2", str(uuid.uuid4()), ["t"], server_assignor="sticky")
    assert bad.error_code == KafkaError.UNSUPPORTED_ASSIGNOR
    # OffsetCommit v9 from the member: its epoch must be the current one.
    commit = {"group_id": "g2", "member_id": a, "generation_id_or_member_epoch": 0,
              "topics": [{"name": "t", "partitions": [
                  {"partition_index": 0, "committed_offset": 0, "committed_metadata": ""}]}]}  # fmt: skip
    stale = call(server, OFFSET_COMMIT, 9, commit)
    assert stale.topics[0].partitions[0].error_code == KafkaError.STALE_MEMBER_EPOCH
    commit["generation_id_or_member_epoch"] = 2
    assert call(server, OFFSET_COMMIT, 9, commit).topics[0].partitions[0].error_code == 0
    left = beat(server, "g2", a, -1)
    assert left.error_code == 0 and left.member_epoch == -1
    assert beat(server, "g2", a, 2).error_code == KafkaError.UNKNOWN_MEMBER_ID


def test_offset_fetch_checks_a_members_epoch_and_commits_below_v9_are_refused(
    server: str, broker: Broker
) -> None:
    """Rule 63: OffsetFetch v9 naming a consumer group's member answers its offsets only
    at the member's epoch (STALE_MEMBER_EPOCH, UNKNOWN_MEMBER_ID otherwise, the group
    alone refused in a v8+ answer of several); a member's OffsetCommit below v9 is
    UNSUPPORTED_VERSION, as Kafka answers both."""
    create_topic(broker, "f", 1)
    a = str(uuid.uuid4())
    epoch = join(server, "g9", a, ["f"]).member_epoch
    commit = {"group_id": "g9", "member_id": a, "generation_id_or_member_epoch": epoch,
              "topics": [{"name": "f", "partitions": [
                  {"partition_index": 0, "committed_offset": 5, "committed_metadata": ""}]}]}  # fmt: skip
    code = call(server, OFFSET_COMMIT, 8, commit).topics[0].partitions[0].error_code
    assert code == KafkaError.UNSUPPORTED_VERSION
    assert call(server, OFFSET_COMMIT, 9, commit).topics[0].partitions[0].error_code == 0
    asked = [{"name": "f", "partition_indexes": [0]}]

    def fetch(member: str | None, member_epoch: int) -> list[tuple[int, list[int]]]:
        groups = [{"group_id": "g9", "member_id": member, "member_epoch": member_epoch,
                   "topics": asked}, {"group_id": "nobody", "topics": asked}]  # fmt: skip
        answer = call(server, OFFSET_FETCH, 9, {"groups": groups})
        return [
            (g.error_code, [p.committed_offset for t in g.topics for p in t.partitions])
            for g in answer.groups
        ]

    assert fetch(a, epoch) == [(0, [5]), (0, [-1])]
    assert fetch(None, -1) == [(0, [5]), (0, [-1])]
    assert fetch(a, epoch + 1) == [(KafkaError.STALE_MEMBER_EPOCH, []), (0, [-1])]
    assert fetch("stranger", epoch) == [(KafkaError.UNKNOWN_MEMBER_ID, []), (0, [-1])]
    v8 = call(server, OFFSET_FETCH, 8, {"groups": [{"group_id": "g9", "topics": None}]})
    assert [(t.name, [p.committed_offset for p in t.partitions]) for t in v8.groups[0].topics] == [
        ("f", [5])
    ]


def test_a_static_member_leaves_for_a_while_and_its_instance_comes_back(
    server: str, broker: Broker
) -> None:
    create_topic(broker, "s", 3)
    first, other = str(uuid.uuid4()), str(uuid.uuid4())
    joined = join(server, "g3", first, ["s"], instance_id="i-1")
    assert joined.error_code == 0 and count(joined) == 3
    taken = join(server, "g3", other, ["s"], instance_id="i-1")
    assert taken.error_code == KafkaError.UNRELEASED_INSTANCE_ID
    gone = beat(server, "g3", first, -2, instance_id="i-1")
    assert gone.error_code == 0 and gone.member_epoch == -2
    back = join(server, "g3", other, ["s"], instance_id="i-1")
    assert back.error_code == 0 and count(back) == 3  # the instance keeps its partitions
    assert back.member_epoch == joined.member_epoch  # and the group epoch did not move


def test_a_restarted_serve_continues_the_group_from_the_database(
    db_url: str, broker: Broker
) -> None:
    """Rule 61: the epochs and assignments are the projection in PostgreSQL, so another
    (or a restarted) ``kip98 serve`` answers the member where the first left it."""
    create_topic(broker, "r", 2)
    a = str(uuid.uuid4())
    with serving(db_url) as first:
        joined = join(first, "g4", a, ["r"])
        assert joined.member_epoch == 2 and count(joined) == 2
    with serving(db_url) as second:
        again = beat(second, "g4", a, 2, topic_partitions=owned(joined))
        assert again.error_code == 0 and again.member_epoch == 2
        b = join(second, "g4", str(uuid.uuid4()), ["r"])
        assert b.error_code == 0 and b.member_epoch == 3
        asked = beat(second, "g4", a, 2, topic_partitions=owned(joined))
        assert count(asked) == 1  # a is asked to give one up to b


def test_kip98_groups_shows_the_type_and_the_member_epochs(server: str, broker: Broker) -> None:
    """``kip98 groups list`` and ``describe`` give a consumer group's type, its members'
    partitions and member epochs."""
    create_topic(broker, "shown", 2)
    a = str(uuid.uuid4())
    assert join(server, "g5", a, ["shown"]).member_epoch == 2
    listed = json.loads(_kip98("groups", "list", "--output", "json"))
    assert [(g["group_id"], g["type"], g["state"], g["members"]) for g in listed] == [
        ("g5", "consumer", "Stable", 1)
    ]
    described = json.loads(_kip98("groups", "describe", "g5", "--output", "json"))
    assert [(r["partition"], r["consumer_id"], r["type"], r["member_epoch"]) for r in described] == [
        (0, a, "consumer", 2), (1, a, "consumer", 2)
    ]  # fmt: skip


def _kip98(*args: str) -> str:
    result = subprocess.run(
        [str(KIP98_BIN), *args], capture_output=True, text=True, timeout=120, input=""
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("KIP98_FEATURES", "group.version=7"),
        ("KIP98_FEATURES", "share.version=1"),
        ("KIP98_FEATURES", "group.version"),
        ("KIP98_GROUP_CONSUMER_ASSIGNORS", "sticky"),
        ("KIP98_GROUP_CONSUMER_ASSIGNORS", "uniform,cooperative"),
        ("KIP98_GROUP_CONSUMER_ASSIGNORS", ","),
    ],
)
def test_a_bad_setting_stops_serve_with_one_line(db_url: str, setting: str, value: str) -> None:
    """A feature pin serve cannot serve, or an assignor it does not have, stops it before
    it listens, in one line naming the setting."""
    result = subprocess.run(
        [str(KIP98_BIN), "serve", "--listen", "127.0.0.1:0"], capture_output=True, text=True,
        timeout=120, input="", env={**os.environ, setting: value},
    )  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1, result.stderr
    assert setting in lines[0]


def test_a_group_whose_members_all_died_is_described_empty(db_url: str, broker: Broker) -> None:
    """No member heartbeats, so none expires the others: ConsumerGroupDescribe and
    ListGroups remove the members past their session themselves (rule 61) and show the
    group Empty."""
    create_topic(broker, "quiet", 1)
    env = {"KIP98_GROUP_CONSUMER_SESSION_TIMEOUT_MS": "1000"}
    with serving(db_url, env=env) as server:
        joined = join(server, "g6", str(uuid.uuid4()), ["quiet"])
        assert joined.member_epoch == 2
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            described = call(server, DESCRIBE, 1, {"group_ids": ["g6"]}).groups[0]
            if not described.members:
                break
            time.sleep(0.2)
        assert (described.group_state, described.group_epoch, described.members) == (
            "Empty", 3, ()
        )  # fmt: skip
        # ListGroups likewise, for another group whose member died.
        join(server, "g8", str(uuid.uuid4()), ["quiet"])
        while time.monotonic() < deadline:
            listed = call(server, 16, 5, {"states_filter": [], "types_filter": []})
            states = {g.group_id: g.group_state for g in listed.groups}
            if states.get("g8") == "Empty":
                break
            time.sleep(0.2)
        assert states == {"g6": "Empty", "g8": "Empty"}


def test_a_member_that_does_not_revoke_in_its_rebalance_timeout_is_removed(
    server: str, broker: Broker
) -> None:
    """Rule 60: a member asked to revoke that keeps reporting the partitions past its
    rebalance timeout is removed; the partitions then go to the member waiting for them,
    and the one removed is an unknown member."""
    create_topic(broker, "slow", 2)
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    first = join(server, "g7", a, ["slow"], rebalance_timeout=500)
    assert count(first) == 2
    second = join(server, "g7", b, ["slow"])
    asked = beat(server, "g7", a, first.member_epoch, topic_partitions=owned(first))
    assert count(asked) == 1  # asked to give one up; it keeps reporting both
    deadline = time.monotonic() + 60
    given = 0
    while given < 2 and time.monotonic() < deadline:
        stuck = beat(server, "g7", a, first.member_epoch, topic_partitions=owned(first))
        answer = beat(server, "g7", b, second.member_epoch, topic_partitions=[])
        if answer.assignment is not None:
            given = count(answer)
        time.sleep(0.1)
    assert given == 2
    # Removed by its own heartbeat or by the coordinator's timer, whichever came first.
    stuck = beat(server, "g7", a, first.member_epoch, topic_partitions=owned(first))
    assert stuck.error_code == KafkaError.UNKNOWN_MEMBER_ID


def test_the_coordinators_timer_removes_members_past_their_session(
    make_broker: Any, clock: Any
) -> None:
    """Rule 61: the coordinator loop's pass removes a consumer group's members past
    their session (Kafka's session timer), with no heartbeat, Describe or ListGroups to
    notice: the group epoch moves on and the member left is given the dead one's
    partitions at its next heartbeat; a member that heartbeat in time stays."""
    from app.broker.loop import CoordinatorLoop
    from app.protocol import ConsumerGroupHeartbeatRequest as Beat

    b = make_broker({"tt": 2}, clock=clock, transaction_log_partitions=1)
    session = b.settings.group_consumer_session_timeout_ms
    dead, alive = str(uuid.uuid4()), str(uuid.uuid4())
    for member in (dead, alive):
        joined = b.handle(Beat("gt", member, 0, rebalance_timeout_ms=30000,
                               subscribed_topic_names=("tt",), owned={}))  # fmt: skip
        assert joined.error_code == 0
    epoch = joined.member_epoch

    def members() -> set[str]:
        with b.engine.connect() as conn:
            rows = conn.exec_driver_sql(
                "SELECT member_id FROM consumer_group_members WHERE group_id = 'gt'"
            )
            return {r.member_id for r in rows}

    clock.advance(session // 2)
    assert b.handle(Beat("gt", alive, epoch)).error_code == 0
    loop = CoordinatorLoop(b)
    assert loop.run_once().expired_members == 0 and members() == {dead, alive}
    clock.advance(session // 2 + 1)
    assert loop.run_once().expired_members == 1
    assert members() == {alive}
    held: tuple[int, ...] = ()
    for _ in range(4):  # revoke-then-assign settles within a few heartbeats
        answer = b.handle(Beat("gt", alive, epoch, owned={"tt": held}))
        assert answer.error_code == 0
        epoch = answer.member_epoch
        if answer.assignment is not None:
            held = answer.assignment.get("tt", ())
    assert held == (0, 1)
