"""Transaction markers written set-based: all partitions of a transaction in one go must
behave exactly as marking them one at a time (offsets, LSO, aborted index, producer state),
and a refusal on any partition stops the whole write before anything is written (rule 7)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from sqlalchemy import text

from app.broker import Broker
from app.broker.write import under_locks
from app.coordinator import machines as m
from app.coordinator.handlers import prepare_end_txn, roll_forward
from app.errors import KafkaError, KafkaException
from app.log.markers import Marker, write_txn_markers
from app.log.topics import create_topic, delete_topic
from app.protocol import CONTROL_ABORT, CONTROL_COMMIT, EndTxnRequest, ProduceBatchesRequest
from tests.helpers.backends import idle_unbounded
from tests.helpers.txn_driver import TxnDriver, partition_offsets, read_values, state_of

pytestmark = pytest.mark.broker(topics={"m": 3, "n": 3, "x": 3})


def driver(broker: Broker, tid: str) -> TxnDriver:
    d = TxnDriver(broker, tid)
    assert d.init() == 0
    return d


def open_transactions(broker: Broker, topic: str) -> tuple[TxnDriver, TxnDriver]:
    """Producer ``other`` holds a transaction open on partition 1 from offset 0; producer
    ``mine`` then writes to partitions 0 (two records), 1 and 2."""
    other = driver(broker, f"other-{topic}")
    other.send(topic, 1, "o")
    mine = driver(broker, f"mine-{topic}")
    mine.send(topic, 0, "a", "b")
    mine.send(topic, 1, "c")
    mine.send(topic, 2, "d")
    return other, mine


def snapshot(broker: Broker, topic: str, roles: dict[int, str]) -> dict[str, Any]:
    """Everything a marker touches on a topic, with producer ids replaced by their role."""
    with broker.engine.connect() as conn:
        params = {"t": topic}
        return {
            "partitions": conn.execute(
                text(
                    "SELECT partition, next_offset, last_stable_offset FROM partitions "
                    "WHERE topic = :t ORDER BY partition"
                ),
                params,
            ).all(),
            "markers": [
                (p, o, roles[pid], epoch, ctype, cepoch)
                for p, o, pid, epoch, ctype, cepoch in conn.execute(
                    text(
                        'SELECT partition, "offset", producer_id, producer_epoch, control_type, '
                        "coordinator_epoch FROM records WHERE topic = :t AND is_control "
                        'ORDER BY partition, "offset"'
                    ),
                    params,
                )
            ],
            "aborted": [
                (p, roles[pid], first, last, lso)
                for p, pid, first, last, lso in conn.execute(
                    text(
                        "SELECT partition, producer_id, first_offset, last_offset, "
                        "last_stable_offset FROM aborted_txns WHERE topic = :t "
                        "ORDER BY partition, last_offset"
                    ),
                    params,
                )
            ],
            "producers": sorted(
                (p, roles[pid], epoch, seq, last, batches, cepoch, first)
                for p, pid, epoch, seq, last, batches, cepoch, first in conn.execute(
                    text(
                        "SELECT partition, producer_id, producer_epoch, last_sequence, "
                        "last_offset, batches, coordinator_epoch, txn_first_offset "
                        "FROM producer_states WHERE topic = :t"
                    ),
                    params,
                )
            ),
        }


@pytest.mark.parametrize("control", [CONTROL_ABORT, CONTROL_COMMIT])
def test_set_based_markers_match_one_at_a_time(broker: Broker, control: int) -> None:
    snapshots = []
    for topic, together in (("m", True), ("n", False)):
        other, mine = open_transactions(broker, topic)
        partitions = [(topic, 2), (topic, 0), (topic, 1)]
        with broker.engine.begin() as conn:
            if together:
                marker = Marker(mine.producer_id, mine.producer_epoch, 3, control, 1_000)
                written = write_txn_markers(conn, partitions, marker)
            else:
                marker = Marker(mine.producer_id, mine.producer_epoch, 3, control, 1_000)
                written = [tp for tp in sorted(partitions) if write_txn_markers(conn, [tp], marker)]
        assert written == [(topic, 0), (topic, 1), (topic, 2)]
        snapshots.append(
            snapshot(broker, topic, {other.producer_id: "other", mine.producer_id: "mine"})
        )
    together_snapshot, one_by_one = snapshots
    assert together_snapshot == one_by_one
    # And the values themselves: partition 1 stays pinned by the other open transaction.
    assert together_snapshot["partitions"] == [(0, 3, 3), (1, 3, 0), (2, 2, 2)]
    assert [mk[:2] for mk in together_snapshot["markers"]] == [(0, 2), (1, 2), (2, 1)]
    if control == CONTROL_ABORT:
        assert together_snapshot["aborted"] == [
            (0, "mine", 0, 2, 3),
            (1, "mine", 1, 2, 0),
            (2, "mine", 0, 1, 2),
        ]
        assert read_values(broker, "m", 0) == []
    else:
        assert together_snapshot["aborted"] == []
        assert read_values(broker, "m", 0) == ["a", "b"]
    mine_states = [s for s in together_snapshot["producers"] if s[1] == "mine"]
    assert [(s[6], s[7]) for s in mine_states] == [(3, None)] * 3


def test_markers_with_nothing_open_write_nothing(broker: Broker) -> None:
    _, mine = open_transactions(broker, "x")
    with broker.engine.begin() as conn:
        marker = Marker(mine.producer_id, mine.producer_epoch, 0, CONTROL_COMMIT, 1_000)
        assert write_txn_markers(conn, [("x", 0), ("x", 1), ("x", 2)], marker) != []
        assert write_txn_markers(conn, [("x", 0), ("x", 1), ("x", 2)], marker) == []
        assert write_txn_markers(conn, [], marker) == []
    assert partition_offsets(broker, "x", 0) == (3, 3), "the retry wrote nothing"


def fence(broker: Broker, topic: str, partition: int, **changes: int) -> None:
    """Make one partition's producer state newer than the marker (a newer epoch/coordinator)."""
    sets = ", ".join(f"{column} = :{column}" for column in changes)
    with broker.engine.begin() as conn:
        conn.execute(
            text(
                f"UPDATE producer_states SET {sets} WHERE topic = :t AND partition = :p "
                "AND txn_first_offset IS NOT NULL AND producer_id = :pid"
            ),
            {**changes, "t": topic, "p": partition, "pid": producer_of(broker, topic, partition)},
        )


def producer_of(broker: Broker, topic: str, partition: int) -> int:
    with broker.engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT max(producer_id) FROM producer_states WHERE topic = :t AND partition = :p"
                ),
                {"t": topic, "p": partition},
            ).scalar_one()
        )


def test_one_fenced_partition_stops_every_marker(broker: Broker) -> None:
    _, mine = open_transactions(broker, "m")
    fence(broker, "m", 1, coordinator_epoch=7)
    fence(broker, "m", 2, producer_epoch=mine.producer_epoch + 1)
    before = [partition_offsets(broker, "m", p) for p in range(3)]
    with broker.engine.begin() as conn:
        with pytest.raises(KafkaException) as refused:
            marker = Marker(mine.producer_id, mine.producer_epoch, 5, CONTROL_COMMIT, 1_000)
            write_txn_markers(conn, [("m", 0), ("m", 1), ("m", 2)], marker)
        # The first refusal in partition order, as one-at-a-time marking would give.
        assert refused.value.error.code() == KafkaError.TRANSACTION_COORDINATOR_FENCED
        written = conn.execute(text("SELECT count(*) FROM records WHERE is_control")).scalar()
        assert written == 0, "nothing is written before every partition has been checked"
    assert [partition_offsets(broker, "m", p) for p in range(3)] == before
    with broker.engine.begin() as conn:
        with pytest.raises(KafkaException) as single:
            marker = Marker(mine.producer_id, mine.producer_epoch, 9, CONTROL_COMMIT, 1_000)
            write_txn_markers(conn, [("m", 2)], marker)
        assert single.value.error.code() == KafkaError.INVALID_PRODUCER_EPOCH


def test_missing_partitions_are_refused_or_skipped(broker: Broker) -> None:
    _, mine = open_transactions(broker, "m")
    marker = Marker(mine.producer_id, mine.producer_epoch, 0, CONTROL_COMMIT, 1_000)
    with broker.engine.begin() as conn:
        with pytest.raises(KafkaException) as refused:
            write_txn_markers(conn, [("m", 0), ("m", 7)], marker)
        assert refused.value.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    with broker.engine.begin() as conn:
        written = write_txn_markers(
            conn, [("m", 0), ("m", 7), ("gone", 0)], marker, skip_missing=True
        )
    assert written == [("m", 0)]


def test_completion_with_a_fenced_partition_stays_prepared(broker: Broker) -> None:
    d = driver(broker, "fenced")
    for topic in ("m", "n", "x"):
        d.send(topic, 0, topic)
    prepare_end_txn(broker, EndTxnRequest("fenced", d.producer_id, d.producer_epoch, True))
    fence(broker, "n", 0, coordinator_epoch=99)
    with pytest.raises(KafkaException) as refused:
        roll_forward(broker, "fenced")
    assert refused.value.error.code() == KafkaError.TRANSACTION_COORDINATOR_FENCED
    assert state_of(broker, "fenced") == m.PREPARE_COMMIT
    assert [read_values(broker, t, 0) for t in ("m", "n", "x")] == [[], [], []]


def test_completion_skips_a_deleted_topic(broker: Broker) -> None:
    d = driver(broker, "deleted")
    for topic in ("m", "n", "x"):
        d.send(topic, 0, topic)
    prepare_end_txn(broker, EndTxnRequest("deleted", d.producer_id, d.producer_epoch, True))
    delete_topic(broker, "n")
    roll_forward(broker, "deleted")
    assert state_of(broker, "deleted") == m.COMPLETE_COMMIT
    assert [read_values(broker, t, 0) for t in ("m", "x")] == [["m"], ["x"]]


def wait_for_lock_wait(broker: Broker) -> None:
    """Return once some backend of this database waits for a row lock."""
    deadline = time.monotonic() + 60
    with broker.engine.connect() as conn:
        while time.monotonic() < deadline:
            waiting = conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ).scalar()
            conn.rollback()
            if waiting:
                return
            time.sleep(0.01)
    raise AssertionError("no backend waited for a lock")


@pytest.mark.parametrize("path", ["EndTxn", "combined commit"])
def test_markers_see_a_transaction_opened_while_they_waited(
    broker: Broker, db_url: str, path: str
) -> None:
    """The other open transactions are read once the partition locks are held (rule 8).
    Here another producer opens a transaction in the DB transaction holding the partition
    lock while the markers wait for it: the LSO must stay at that transaction's first
    offset. Read with a snapshot from before the wait (a subquery of the locking
    statement), it would not see that transaction, and the LSO would pass its records."""
    # The other producer's transaction idles while the markers wait for it, for as long as
    # the test takes: neither an idle bound nor the markers' watch may end it.
    broker = Broker.connect(db_url, broker.clock, idle_unbounded(broker.settings))
    create_topic(broker, "race", 1)
    mine = driver(broker, "mine-race")
    mine.send("race", 0, "a")
    other = driver(broker, "other-race")
    assert other.add(("race", 0)) == 0
    ended: list[int] = []

    def end() -> None:
        if path == "EndTxn":
            ended.append(mine.end(commit=True))
        else:
            ended.append(mine.commit_with([]).end.error_code)

    with broker.engine.connect() as conn:
        held = conn.begin()
        [appended] = under_locks(
            broker, conn, ProduceBatchesRequest(other.requests(("race", 0, "o")))
        )[1].batches
        assert (appended.error_code, appended.base_offset) == (0, 1)
        ender = threading.Thread(target=end)
        ender.start()
        wait_for_lock_wait(broker)
        held.commit()
    ender.join(60)
    assert ended == [0]
    # Offsets: 0 "a" (mine, committed), 1 "o" (other's open transaction), 2 mine's marker.
    assert partition_offsets(broker, "race", 0) == (3, 1)
    assert read_values(broker, "race", 0) == ["a"]
    assert read_values(broker, "race", 0, committed=False) == ["a", "o"]
