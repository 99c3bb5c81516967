"""The group coordinator against a real PostgreSQL: offsets (plain and transactional),
require_stable (KIP-447), generation fencing, membership and rebalances, and the offset
projections = fold of offset_commit_log."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import text

from app.broker import Broker
from app.broker.offsets import txn_offset_commit
from app.clock import ManualClock
from app.errors import KafkaError
from app.groups.assignor import range_assign
from app.groups.membership import heartbeat, join_group, leave_group, sync_group
from app.groups.offsets import offset_commit, offset_fetch
from app.groups.rebuild import compute_group_offsets, live_group_offsets
from app.protocol import (
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    OffsetAndMetadata,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
    TxnOffsetCommitRequest,
)
from tests.helpers.backends import idle_unbounded
from tests.helpers.txn_driver import TxnDriver

pytestmark = pytest.mark.broker(topics={"in": 4, "out": 2}, manual_clock=True)


def committed(
    broker: Broker,
    group: str,
    require_stable: bool = False,
    partitions: list[tuple[str, int]] | None = None,
) -> dict[tuple[str, int], int] | int:
    r = offset_fetch(broker, OffsetFetchRequest(group, partitions, require_stable))
    if r.error_code:
        return r.error_code
    return {tp: om.offset for tp, om in r.offsets.items()}


def txn_commit_offsets(
    broker: Broker,
    d: TxnDriver,
    group: str,
    offsets: dict[tuple[str, int], int],
    generation: int = -1,
    member: str = "",
    add_offsets: bool = False,
) -> int:
    req = TxnOffsetCommitRequest(
        d.transactional_id, group, d.producer_id, d.producer_epoch,
        {tp: OffsetAndMetadata(o) for tp, o in offsets.items()}, generation, member,
        add_offsets,
    )  # fmt: skip
    return txn_offset_commit(broker, req).error_code


def txn_events(broker: Broker, transactional_id: str) -> list[tuple[str, bool]]:
    """The (state, has_offsets) of ``transactional_id``'s transaction log events, in order."""
    with broker.engine.connect() as conn:
        return [
            (r.state, r.has_offsets)
            for r in conn.execute(
                text(
                    "SELECT state, has_offsets FROM transaction_log WHERE transactional_id = :t "
                    "ORDER BY event_id"
                ),
                {"t": transactional_id},
            )
        ]


# ------------------------------------------------------------------ offsets


def test_plain_commit_and_fetch(broker: Broker) -> None:
    r = offset_commit(
        broker,
        OffsetCommitRequest(
            "g", {("in", 0): OffsetAndMetadata(5, "m"), ("in", 1): OffsetAndMetadata(7)}
        ),
    )
    assert r.error_code == 0
    fetched = offset_fetch(broker, OffsetFetchRequest("g", [("in", 0), ("in", 3)]))
    assert fetched.offsets[("in", 0)] == OffsetAndMetadata(5, "m")
    assert fetched.offsets[("in", 3)].offset == -1


@pytest.mark.parametrize(
    ("group", "offsets", "code"),
    [
        ("", {("in", 0): 1}, KafkaError.INVALID_GROUP_ID),
        ("g", {("in", 0): -3}, KafkaError.INVALID_REQUEST),
        ("g", {("nope", 0): 1}, KafkaError.UNKNOWN_TOPIC_OR_PARTITION),
        ("g", {("in", 9): 1}, KafkaError.UNKNOWN_TOPIC_OR_PARTITION),
    ],
)
def test_bad_commits_write_nothing(
    broker: Broker, group: str, offsets: dict[tuple[str, int], int], code: int
) -> None:
    r = offset_commit(
        broker, OffsetCommitRequest(group, {tp: OffsetAndMetadata(o) for tp, o in offsets.items()})
    )
    assert r.results == dict.fromkeys(offsets, code)  # each partition says why
    assert committed(broker, "g") == {}


def test_a_refused_partition_leaves_the_others_committed(broker: Broker) -> None:
    """As Kafka answers an OffsetCommit: each partition on its own."""
    offsets = {
        ("in", 0): OffsetAndMetadata(5, "ok"),
        ("in", 1): OffsetAndMetadata(6, "x" * 4097),
        ("in", 9): OffsetAndMetadata(7),
        ("nope", 0): OffsetAndMetadata(8),
        ("in", 2): OffsetAndMetadata(-1),
    }
    r = offset_commit(broker, OffsetCommitRequest("g", offsets))
    assert r.error_code == KafkaError.NO_ERROR
    assert r.results == {
        ("in", 0): 0,
        ("in", 1): KafkaError.OFFSET_METADATA_TOO_LARGE,
        ("in", 9): KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
        ("nope", 0): KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
        ("in", 2): KafkaError.INVALID_REQUEST,
    }
    assert committed(broker, "g") == {("in", 0): 5}


def test_offset_metadata_is_kept_exactly(broker: Broker) -> None:
    """Any string Kafka's wire carries (NUL, characters beyond the BMP) up to
    offset.metadata.max.bytes, counted in UTF-16 units as Kafka counts it."""
    nul = "a\x00b\x00"
    astral = "\U0001f600" * 2048  # 4096 UTF-16 units: the limit exactly
    over = "\U0001f600" * 2048 + "x"
    r = offset_commit(
        broker,
        OffsetCommitRequest(
            "g",
            {
                ("in", 0): OffsetAndMetadata(1, nul),
                ("in", 1): OffsetAndMetadata(2, astral),
                ("in", 2): OffsetAndMetadata(3, over),
                ("in", 3): OffsetAndMetadata(4, ""),
            },
        ),
    )
    assert r.results == {
        ("in", 0): 0, ("in", 1): 0, ("in", 2): KafkaError.OFFSET_METADATA_TOO_LARGE,
        ("in", 3): 0,
    }  # fmt: skip
    fetched = offset_fetch(broker, OffsetFetchRequest("g", [("in", 0), ("in", 1), ("in", 3)]))
    assert fetched.offsets == {
        ("in", 0): OffsetAndMetadata(1, nul),
        ("in", 1): OffsetAndMetadata(2, astral),
        ("in", 3): OffsetAndMetadata(4, ""),
    }
    with broker.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT partition, metadata FROM consumer_group_lag ORDER BY partition"
        ).all()
    assert [(p, bytes(m)) for p, m in rows] == [
        (0, nul.encode()), (1, astral.encode()), (3, b""),
    ]  # fmt: skip


def test_txn_offsets_pending_until_commit_and_dropped_on_abort(broker: Broker) -> None:
    d = TxnDriver(broker, "copier")
    assert d.init() == 0
    d.send("out", 0, "x")
    assert txn_commit_offsets(broker, d, "g", {("in", 0): 10}) == KafkaError.INVALID_TXN_STATE, (
        "AddOffsetsToTxn first"
    )
    assert d.add_offsets("g") == 0
    assert txn_commit_offsets(broker, d, "g", {("in", 0): 10, ("in", 1): 3}) == 0
    assert committed(broker, "g") == {}, "invisible until the COMMIT marker"
    pending = [("in", 0), ("in", 1)]
    assert committed(broker, "g", True, pending) == KafkaError.UNSTABLE_OFFSET_COMMIT
    # As Kafka's: all the group's offsets are the partitions that have one, none yet.
    assert committed(broker, "g", require_stable=True) == {}
    assert d.end(commit=False) == 0
    assert committed(broker, "g", require_stable=True) == {}, "dropped on ABORT"
    d.send("out", 0, "y")
    assert d.add_offsets("g") == 0
    assert txn_commit_offsets(broker, d, "g", {("in", 0): 11}) == 0
    assert d.end(commit=True) == 0
    assert committed(broker, "g", require_stable=True) == {("in", 0): 11}


def test_txn_offsets_that_add_themselves_join_the_transaction(broker: Broker) -> None:
    """KIP-890's transaction version 2: a TxnOffsetCommit that also adds the group's
    offsets (no AddOffsetsToTxn before it) joins them to the transaction in its own DB
    transaction; sent again (a retry), it adds nothing more; a transaction can start with
    it."""
    d = TxnDriver(broker, "copier")
    assert d.init() == 0
    d.send("out", 0, "x")
    before = len(txn_events(broker, "copier"))
    assert txn_commit_offsets(broker, d, "g", {("in", 0): 10}, add_offsets=True) == 0
    assert txn_commit_offsets(broker, d, "g", {("in", 0): 10}, add_offsets=True) == 0
    assert txn_events(broker, "copier")[before:] == [("BEGIN", True)], "added once"
    assert committed(broker, "g", True, [("in", 0)]) == KafkaError.UNSTABLE_OFFSET_COMMIT
    assert d.end(commit=True) == 0
    assert committed(broker, "g", require_stable=True) == {("in", 0): 10}

    # Offsets alone start a transaction.
    assert txn_commit_offsets(broker, d, "g", {("in", 1): 4}, add_offsets=True) == 0
    assert d.end(commit=True) == 0
    assert committed(broker, "g", require_stable=True) == {("in", 0): 10, ("in", 1): 4}


@pytest.mark.parametrize(
    ("offsets", "generation", "member", "code"),
    [
        ({("in", 9): 1}, -1, "", KafkaError.UNKNOWN_TOPIC_OR_PARTITION),
        ({("in", 0): 1}, 5, "nobody", KafkaError.ILLEGAL_GENERATION),
    ],
    ids=["unknown-partition", "stale-generation"],
)
def test_txn_offsets_that_add_themselves_and_are_refused_add_nothing(
    broker: Broker, offsets: dict[tuple[str, int], int], generation: int, member: str, code: int
) -> None:
    """Refused, the offsets take their AddOffsetsToTxn back with them: the transaction
    stays without offsets (a later commit of offsets alone is refused as not added), and
    nothing is pending."""
    d = TxnDriver(broker, "copier")
    assert d.init() == 0
    d.send("out", 0, "x")
    before = txn_events(broker, "copier")
    got = txn_commit_offsets(broker, d, "g", offsets, generation, member, add_offsets=True)
    assert got == code
    assert txn_events(broker, "copier") == before
    assert txn_commit_offsets(broker, d, "g", {("in", 0): 1}) == KafkaError.INVALID_TXN_STATE
    assert committed(broker, "g", require_stable=True) == {}
    assert d.end(commit=True) == 0
    assert committed(broker, "g", require_stable=True) == {}


def test_txn_offsets_that_add_themselves_from_a_fenced_producer_are_refused(
    broker: Broker,
) -> None:
    d = TxnDriver(broker, "copier")
    d.init()
    d.send("out", 0, "x")
    successor = TxnDriver(broker, "copier")
    successor.init()
    before = txn_events(broker, "copier")
    got = txn_commit_offsets(broker, d, "g", {("in", 0): 1}, add_offsets=True)
    assert got == KafkaError.PRODUCER_FENCED
    assert txn_events(broker, "copier") == before
    assert committed(broker, "g", require_stable=True) == {}


def test_txn_offsets_from_a_fenced_producer_are_refused(broker: Broker) -> None:
    d = TxnDriver(broker, "copier")
    d.init()
    d.add_offsets("g")
    successor = TxnDriver(broker, "copier")
    successor.init()
    assert txn_commit_offsets(broker, d, "g", {("in", 0): 1}) == KafkaError.PRODUCER_FENCED


def test_rebuild_group_offsets_equals_live(broker: Broker) -> None:
    offset_commit(broker, OffsetCommitRequest("g", {("in", 0): OffsetAndMetadata(1)}))
    d = TxnDriver(broker, "copier")
    d.init()
    for commit, off in ((True, 5), (False, 6), (True, 7)):
        d.add_offsets("g")
        txn_commit_offsets(broker, d, "g", {("in", 0): off, ("in", 2): off})
        d.end(commit=commit)
    d.add_offsets("g")
    txn_commit_offsets(broker, d, "g", {("in", 3): 99})  # left pending
    with broker.engine.connect() as conn:
        assert compute_group_offsets(conn) == live_group_offsets(conn)
        assert len(live_group_offsets(conn)["pending_txn_offsets"]) == 1


# ------------------------------------------------------------------ membership


def join(
    broker: Broker, member: str = "", topics: tuple[str, ...] = ("in",), group: str = "g"
) -> tuple[str, int]:
    r = join_group(broker, JoinGroupRequest(group, member, list(topics), 10_000, "c"))
    assert r.error_code == 0, r
    return r.member_id, r.generation_id


def assignment(broker: Broker, member: str, generation: int) -> list[tuple[str, int]] | int:
    r = sync_group(broker, SyncGroupRequest("g", member, generation))
    return r.assignment if r.error_code == 0 else r.error_code


def test_rebalance_on_join_leave_and_death(broker: Broker, clock: ManualClock) -> None:
    a, gen1 = join(broker)
    assert assignment(broker, a, gen1) == [("in", p) for p in range(4)]
    b, gen2 = join(broker)
    assert gen2 == gen1 + 1
    # a is still in the old generation: b waits, a learns of the rebalance from its heartbeat.
    assert assignment(broker, b, gen2) == KafkaError.REBALANCE_IN_PROGRESS
    assert (
        heartbeat(broker, HeartbeatRequest("g", a, gen1)).error_code
        == KafkaError.REBALANCE_IN_PROGRESS
    )
    # Until a rejoins it still owns its partitions, and its commits land (as Kafka accepts
    # them while PreparingRebalance); b, of the generation not yet complete, must wait.
    assert (
        offset_commit(
            broker, OffsetCommitRequest("g", {("in", 0): OffsetAndMetadata(1)}, gen1, a)
        ).error_code
        == 0
    )
    assert (
        offset_commit(
            broker, OffsetCommitRequest("g", {("in", 0): OffsetAndMetadata(1)}, gen2, b)
        ).error_code
        == KafkaError.REBALANCE_IN_PROGRESS
    )
    _, gen_a = join(broker, a)
    assert gen_a == gen2
    # Once rejoined, its old generation is refused.
    assert (
        offset_commit(
            broker, OffsetCommitRequest("g", {("in", 0): OffsetAndMetadata(1)}, gen1, a)
        ).error_code
        == KafkaError.ILLEGAL_GENERATION
    )
    sa, sb = assignment(broker, a, gen2), assignment(broker, b, gen2)
    assert isinstance(sa, list) and isinstance(sb, list)
    assert sorted(sa + sb) == [("in", p) for p in range(4)] and not set(sa) & set(sb)
    assert (
        offset_commit(
            broker, OffsetCommitRequest("g", {("in", 0): OffsetAndMetadata(1)}, gen2, a)
        ).error_code
        == 0
    )
    # b dies: after its session timeout the group moves on without it.
    clock.advance(5_000)
    heartbeat(broker, HeartbeatRequest("g", a, gen2))
    clock.advance(6_000)
    hb = heartbeat(broker, HeartbeatRequest("g", a, gen2))
    assert hb.error_code == KafkaError.REBALANCE_IN_PROGRESS
    _, gen3 = join(broker, a)
    assert assignment(broker, a, gen3) == [("in", p) for p in range(4)]
    assert (
        heartbeat(broker, HeartbeatRequest("g", b, gen2)).error_code == KafkaError.UNKNOWN_MEMBER_ID
    )
    # A zombie of an older generation cannot commit offsets inside a transaction (KIP-447).
    d = TxnDriver(broker, "zombie")
    d.init()
    d.add_offsets("g")
    assert (
        txn_commit_offsets(broker, d, "g", {("in", 0): 9}, gen2, a) == KafkaError.ILLEGAL_GENERATION
    )
    assert txn_commit_offsets(broker, d, "g", {("in", 0): 9}, gen3, a) == 0
    assert leave_group(broker, LeaveGroupRequest("g", a)).error_code == 0


def test_generation_minus_one_commits_are_accepted(broker: Broker) -> None:
    join(broker)
    r = offset_commit(broker, OffsetCommitRequest("g", {("in", 0): OffsetAndMetadata(3)}, -1, ""))
    assert r.error_code == 0


def test_range_assignor_matches_kafka() -> None:
    plan = range_assign({"c1": ["t1", "t2"], "c0": ["t1", "t2"]}, {"t1": 3, "t2": 3})
    assert plan == {
        "c0": [("t1", 0), ("t1", 1), ("t2", 0), ("t2", 1)],
        "c1": [("t1", 2), ("t2", 2)],
    }
    assert range_assign({"a": ["x"], "b": ["y"]}, {"x": 2}) == {"a": [("x", 0), ("x", 1)], "b": []}


@given(st.integers(1, 8), st.integers(0, 40))
def test_range_assignor_partitions_everything_exactly_once(members: int, partitions: int) -> None:
    plan = range_assign({f"m{i}": ["t"] for i in range(members)}, {"t": partitions})
    flat = sorted(tp for tps in plan.values() for tp in tps)
    assert flat == [("t", p) for p in range(partitions)]
    sizes = [len(v) for v in plan.values()]
    assert max(sizes) - min(sizes) <= 1


def test_deleting_a_topic_forgets_its_offsets(broker: Broker) -> None:
    """As Kafka's group coordinator drops a deleted partition's offsets: committed and
    pending offsets of the topic go with it (logged, so a rebuild agrees), other topics'
    stay, and the topic made again starts with none."""
    from app.protocol import CreatableTopic, CreateTopicsRequest, DeleteTopicsRequest

    offset_commit(
        broker,
        OffsetCommitRequest(
            "g", {("in", 0): OffsetAndMetadata(5), ("out", 1): OffsetAndMetadata(2)}
        ),
    )
    d = TxnDriver(broker, "copier")
    d.init()
    d.add_offsets("g")
    txn_commit_offsets(broker, d, "g", {("in", 3): 9})  # left pending
    [deleted] = broker.handle(DeleteTopicsRequest(["in"])).responses
    assert deleted.error_code == KafkaError.NO_ERROR
    assert committed(broker, "g") == {("out", 1): 2}
    with broker.engine.connect() as conn:
        assert live_group_offsets(conn)["pending_txn_offsets"] == []
        assert compute_group_offsets(conn) == live_group_offsets(conn)
    [made] = broker.handle(CreateTopicsRequest([CreatableTopic("in", 4)])).topics
    assert made.error_code == KafkaError.NO_ERROR
    assert committed(broker, "g") == {("out", 1): 2}
    assert d.end(commit=True) == 0  # the pending offset's commit brings nothing back
    assert committed(broker, "g") == {("out", 1): 2}


def test_an_offset_commit_racing_a_topic_deletion_leaves_no_offset(
    broker: Broker, db_url: str
) -> None:
    """An offset of the topic, written by a DB transaction still open when DeleteTopics
    starts: the deletion waits for it (the partitions' rows, held FOR KEY SHARE by the commit's
    existence check) and then deletes that offset too (rule 31)."""
    import threading
    import time

    from app.groups.offsets import record_txn_offsets, refused_partitions
    from app.protocol import DeleteTopicsRequest, TxnOffsetCommitRequest

    # The commit's transaction idles while the deletion waits for it, for as long as the
    # test takes: neither an idle bound nor the deletion's watch may end it.
    broker = Broker.connect(db_url, broker.clock, idle_unbounded(broker.settings))
    request = TxnOffsetCommitRequest("copier", "g", 7, 0, {("in", 1): OffsetAndMetadata(3)})
    deleted: list[int] = []
    with broker.engine.connect() as commit:
        assert refused_partitions(commit, broker, request.offsets) == {}  # FOR KEY SHARE
        record_txn_offsets(commit, 0, request, request.offsets)  # pending, not committed
        deletion = threading.Thread(
            target=lambda: deleted.extend(
                r.error_code for r in broker.handle(DeleteTopicsRequest(["in"])).responses
            )
        )
        deletion.start()
        with broker.engine.connect() as watch:  # until the deletion waits on a lock, or is done
            # (its statements may go out pipelined: the query shown need not be the waiting one)
            waiting = text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            deadline = time.monotonic() + 60
            while deletion.is_alive() and not watch.execute(waiting).scalar_one():
                assert time.monotonic() < deadline, "the deletion neither waited nor finished"
                watch.rollback()  # a fresh snapshot of the statistics each time
                time.sleep(0.01)
        commit.commit()
    deletion.join(60)
    assert not deletion.is_alive()
    assert deleted == [KafkaError.NO_ERROR]
    with broker.engine.connect() as conn:
        assert live_group_offsets(conn)["pending_txn_offsets"] == []
        assert compute_group_offsets(conn) == live_group_offsets(conn)
