"""The combined commit on the rows this process's last commit left (docs/design.md §3.11).

After a Producer's first commit of a transactional id, its next ones are decided on the id's
row and the partition rows as that commit left them and sent as one query string, whose
first statements lock the rows and read their versions; the data goes only if every row
is still the version remembered. These tests make the remembered rows wrong in each way
they can be (another instance fenced the producer, another producer wrote a partition or
opened a transaction there, the lease moved, the process died inside the query) and check
that the commit is then decided as if nothing had been remembered, and that the commits
that do go in one query leave the tables exactly as the lock's way leaves them. A
transaction with a group's offsets goes the same way: its TxnOffsetCommit remembers the
id's row it moves, and the offsets' completion is among the query string's writes.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from app.broker import Broker, strategy
from app.client import ConsumerGroupMetadata, KafkaException, Producer, TopicPartition
from app.coordinator.machines import MAX_EPOCH
from app.errors import KafkaError
from app.log.topics import create_topic
from app.storage import one_query as one_query_module
from tests.helpers.backends import conninfo, holding, terminate, wait_for_blocked_backend
from tests.helpers.txn_driver import TxnDriver, partition_offsets, read_values
from tests.helpers.write_strategy import Ways

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.broker(topics={"t": 3})


@pytest.fixture(autouse=True)
def steady_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    """No coordinator loop in the clients: a loop taking the lease over moves its epoch,
    which refuses the next one-query commit (as it must); these tests move it themselves."""
    monkeypatch.setenv("KIP98_CLIENT_COORDINATOR_LOOP", "0")


@pytest.fixture
def ways() -> Ways:
    """The commits sent each way from here on (``broker.strategy``'s counter)."""
    return Ways("commit")


@pytest.fixture
def producers(db_url: str) -> Iterator[Callable[..., Producer]]:
    made: list[Producer] = []

    def make(transactional_id: str, **config: Any) -> Producer:
        p = Producer(
            {"database.url": db_url, "transactional.id": transactional_id, "linger.ms": 5_000}
            | config
        )
        p.init_transactions()
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def transaction(p: Producer, values: dict[int, list[str]], commit: bool = True) -> None:
    """One transaction of ``values`` by partition of topic "t", sent with its commit."""
    p.begin_transaction()
    for partition, vs in values.items():
        for v in vs:
            p.produce("t", value=v.encode(), partition=partition, timestamp=1_000)
    if commit:
        p.commit_transaction()
    else:
        p.abort_transaction()


def all_values(broker: Broker, committed: bool = True) -> dict[int, list[str]]:
    return {p: read_values(broker, "t", p, committed) for p in range(3)}


def test_commits_after_the_first_go_in_one_query(
    broker: Broker, producers: Any, ways: Ways
) -> None:
    p = producers("tx")
    for i in range(4):
        transaction(p, {0: [f"a{i}"], 1: [f"b{i}", f"c{i}"], 2: [f"d{i}"]})
    assert ways.sent == (3, 1)
    assert ways.refused == 0
    assert all_values(broker) == {
        0: [f"a{i}" for i in range(4)],
        1: [v for i in range(4) for v in (f"b{i}", f"c{i}")],
        2: [f"d{i}" for i in range(4)],
    }
    for partition in range(3):
        high_watermark, lso = partition_offsets(broker, "t", partition)
        assert lso == high_watermark


# A run of transactions of one producer: values by partition, and commit or abort.
RUN: list[tuple[dict[int, list[str]], bool]] = [
    ({0: ["a", "b"], 1: ["c"], 2: ["d"]}, True),
    ({0: ["e"], 1: ["f"], 2: ["g"]}, True),
    ({0: ["h"], 2: ["i", "j"]}, True),
    ({1: ["k"]}, False),
    ({0: ["l"], 1: ["m"], 2: ["n"]}, True),
    ({0: ["o"], 1: ["p"], 2: ["q"]}, True),
    ({1: ["r", "s"]}, True),
    ({1: ["t"]}, True),
]

_TABLES = {
    "records": """SELECT partition, "offset", CASE WHEN is_control THEN 0 ELSE "timestamp" END,
                         key, value, producer_epoch,
                         sequence, batch_base_offset, is_transactional, is_control,
                         control_type, coordinator_epoch
                  FROM records WHERE topic = :topic ORDER BY partition, "offset\"""",
    "partitions": """SELECT partition, next_offset, log_start_offset, last_stable_offset
                     FROM partitions WHERE topic = :topic ORDER BY partition""",
    "producer_states": """SELECT partition, producer_epoch, last_sequence, last_offset,
                                 batches, coordinator_epoch, txn_first_offset
                          FROM producer_states WHERE topic = :topic
                          ORDER BY partition, last_offset""",
    "aborted_txns": """SELECT partition, first_offset, last_offset, last_stable_offset
                       FROM aborted_txns WHERE topic = :topic ORDER BY partition, first_offset""",
    "transaction_log": """SELECT array_position(CAST(:tids AS text[]), transactional_id),
                                 producer_epoch, last_producer_epoch, state,
                                 jsonb_path_query_array(partitions, '$[*][1]'),
                                 has_offsets, coordinator_epoch, reason
                          FROM transaction_log
                          WHERE transactional_id = ANY(CAST(:tids AS text[]))
                          ORDER BY event_id""",
}


def tables(broker: Broker, topic: str, *transactional_ids: str) -> dict[str, list[Any]]:
    """What a run left, without what differs between two runs of it (producer ids, times;
    the transactional ids by their place in ``transactional_ids``)."""
    params = {"topic": topic, "tids": list(transactional_ids)}
    with broker.engine.connect() as conn:
        return {
            name: [tuple(r) for r in conn.execute(text(q), params)] for name, q in _TABLES.items()
        }


def test_one_query_commits_write_what_the_lock_way_writes(
    db_url: str, broker: Broker, producers: Any, ways: Ways, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same run of commits and aborts, once with the one-query commit and once with
    every commit taken the lock's way, leaves the same records, markers, partition rows,
    producer states, aborted index and transaction events."""
    create_topic(broker, "u", 3)
    for topic, tid in (("t", "one-query"), ("u", "lock-way")):
        if topic == "u":
            monkeypatch.setattr(strategy, "one_query", lambda *_: False)
        p = producers(tid)
        for values, commit in RUN:
            p.begin_transaction()
            for partition, vs in values.items():
                for v in vs:
                    p.produce(topic, value=v.encode(), partition=partition, timestamp=1_000)
            if commit:
                p.commit_transaction()
            else:
                p.abort_transaction()
    assert ways.one >= 5  # after the first commit, and after the abort
    assert tables(broker, "t", "one-query") == tables(broker, "u", "lock-way")


def offsets_transaction(
    p: Producer,
    topic: str,
    values: dict[int, list[str]],
    offsets: list[dict[int, int]],
    group: str,
    commit: bool = True,
) -> None:
    """A transaction of ``values`` by partition of ``topic`` that also sends, once per
    entry of ``offsets``, consumed positions of topic "t" for ``group``."""
    p.begin_transaction()
    for partition, vs in values.items():
        for v in vs:
            p.produce(topic, value=v.encode(), partition=partition, timestamp=1_000)
    for sent in offsets:
        positions = [TopicPartition("t", part, offset) for part, offset in sent.items()]
        p.send_offsets_to_transaction(positions, ConsumerGroupMetadata(group))
    if commit:
        p.commit_transaction()
    else:
        p.abort_transaction()


_GROUP_TABLES = {
    "group_offsets": """SELECT topic, partition, committed_offset, metadata FROM group_offsets
                        WHERE group_id = :group ORDER BY topic, partition""",
    "offset_commit_log": """SELECT topic, partition, kind, committed_offset, metadata,
                                   producer_epoch
                            FROM offset_commit_log WHERE group_id = :group ORDER BY event_id""",
    "pending_txn_offsets": """SELECT topic, partition, committed_offset
                              FROM pending_txn_offsets WHERE group_id = :group
                              ORDER BY topic, partition""",
}


def group_tables(broker: Broker, group: str) -> dict[str, list[Any]]:
    with broker.engine.connect() as conn:
        return {
            name: [tuple(r) for r in conn.execute(text(q), {"group": group})]
            for name, q in _GROUP_TABLES.items()
        }


def test_commits_with_offsets_go_in_one_query(broker: Broker, producers: Any, ways: Ways) -> None:
    """A consume-transform-produce loop: each transaction's first send_offsets (a
    TxnOffsetCommit that adds the offsets, KIP-890) leaves the id's row remembered, and
    its commit, on the partitions the last commit left, goes in one query string with the
    pending offsets' completion among its writes; a second send_offsets in the same
    transaction (no add) changes nothing of that. The offsets land with their commit."""
    p = producers("tx")
    for i in range(4):
        offsets_transaction(
            p, "t", {0: [f"a{i}"], 1: [f"b{i}"]}, [{0: i + 1}, {1: 10 * (i + 1)}], "g"
        )
        assert group_tables(broker, "g")["group_offsets"] == [
            ("t", 0, i + 1, None), ("t", 1, 10 * (i + 1), None)
        ]  # fmt: skip
    assert ways.sent == (3, 1)
    assert ways.refused == 0
    kinds = [row[2] for row in group_tables(broker, "g")["offset_commit_log"]]
    assert kinds == ["txn_pending", "txn_pending", "txn_commit", "txn_commit"] * 4
    assert group_tables(broker, "g")["pending_txn_offsets"] == []
    assert all_values(broker) == {
        0: [f"a{i}" for i in range(4)],
        1: [f"b{i}" for i in range(4)],
        2: [],
    }


# A run of transactions with offsets: values by partition, the offsets sent (one
# send_offsets_to_transaction each), and commit or abort.
OFFSETS_RUN: list[tuple[dict[int, list[str]], list[dict[int, int]], bool]] = [
    ({0: ["a"], 1: ["b"]}, [{0: 1}], True),
    ({0: ["c"], 2: ["d"]}, [{0: 2}, {2: 5}], True),
    ({1: ["e"]}, [{1: 7}], False),
    ({0: ["f"], 1: ["g"], 2: ["h"]}, [{0: 3, 1: 8}], True),
    ({0: ["i"]}, [], True),
    ({0: ["j"], 1: ["k"]}, [{0: 4}], True),
    ({2: ["l"]}, [{2: 9}, {2: 11}], True),
]


def test_one_query_commits_with_offsets_write_what_the_lock_way_writes(
    db_url: str, broker: Broker, producers: Any, ways: Ways, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same run of transactions with offsets, once with the one-query commit and once
    with every commit taken the lock's way, leaves the same records, markers, partition
    rows, producer states, transaction events, committed offsets and offset events."""
    create_topic(broker, "u", 3)
    for topic, tid in (("t", "one-query"), ("u", "lock-way")):
        if topic == "u":
            monkeypatch.setattr(strategy, "one_query", lambda *_: False)
        p = producers(tid)
        for values, offsets, commit in OFFSETS_RUN:
            offsets_transaction(p, topic, values, offsets, f"g-{tid}", commit)
    assert ways.one >= 4
    one_query, lock_way = tables(broker, "t", "one-query"), tables(broker, "u", "lock-way")
    one_query["transaction_log"] = [  # AddOffsetsToTxn's reason names its group
        (*row[:-1], row[-1].replace("g-one-query", "g-lock-way"))
        for row in one_query["transaction_log"]
    ]
    assert one_query == lock_way
    assert group_tables(broker, "g-one-query") == group_tables(broker, "g-lock-way")
    assert group_tables(broker, "g-one-query")["group_offsets"] == [
        ("t", 0, 4, None), ("t", 1, 8, None), ("t", 2, 11, None)
    ]  # fmt: skip


def test_a_fenced_producer_is_refused_on_its_reads(
    broker: Broker, producers: Any, ways: Ways
) -> None:
    """Another instance of the transactional id fences the first between two of its
    commits: the first's commit, decided on the row it remembers, is refused on the
    row's version with nothing written, and the lock's way answers it as fenced."""
    first = producers("tx")
    transaction(first, {0: ["a"], 1: ["b"]})
    transaction(first, {0: ["c"], 1: ["d"]})
    second = producers("tx")
    with pytest.raises(KafkaException) as raised:
        transaction(first, {0: ["zombie"], 1: ["zombie"]})
    assert raised.value.args[0].code() == KafkaError._FENCED
    assert ways.sent == (1, 2)
    assert ways.refused == 1
    transaction(second, {0: ["e"], 1: ["f"]})
    assert all_values(broker, committed=False) == {0: ["a", "c", "e"], 1: ["b", "d", "f"], 2: []}


@pytest.mark.parametrize("records", [1, 40])
def test_another_producer_appending_between_two_commits(
    db_url: str, broker: Broker, producers: Any, ways: Ways, records: int
) -> None:
    """An idempotent producer appends to one of the partitions between two commits. With
    one record, the partition's version tells (refused on the reads); with more records
    than the commit's batch, the marker decided on the old row collides with them and its
    statement fails first. Either way nothing of the query string is left, and the lock's
    way appends after the other producer's records."""
    p = producers("tx")
    transaction(p, {0: ["a"], 1: ["b"]})
    transaction(p, {0: ["c"], 1: ["d"]})
    with Producer({"database.url": db_url, "linger.ms": 0}) as other:
        for i in range(records):
            other.produce("t", value=f"x{i}".encode(), partition=1)
        assert other.flush(30) == 0
    transaction(p, {0: ["e"], 1: ["f"]})
    assert ways.sent == (1, 2)
    # refused on its reads (one record), or its marker's statement failed (more): refused
    assert ways.refused == 1
    xs = [f"x{i}" for i in range(records)]
    assert all_values(broker) == {0: ["a", "c", "e"], 1: ["b", "d", *xs, "f"], 2: []}
    high_watermark, lso = partition_offsets(broker, "t", 1)
    assert (high_watermark, lso) == (2 * 2 + records + 2, high_watermark)
    one = ways.one
    transaction(p, {0: ["g"], 1: ["h"]})
    assert ways.one == one + 1  # the lock's way left rows to remember


def test_another_transaction_open_on_a_partition(
    broker: Broker, producers: Any, ways: Ways
) -> None:
    """Another producer's transaction opens on a partition between two commits: refused,
    and the commit's marker leaves the partition's LSO at the other's first offset. The
    next commit goes in one query again, knowing the other transaction is open there from
    the LSO it left, and keeps the LSO there until the other commits."""
    p = producers("tx")
    transaction(p, {0: ["a"], 1: ["b"]})
    other = producers("other", **{"linger.ms": 0})
    other.begin_transaction()
    other.produce("t", value=b"o", partition=0)
    assert other.flush(30) == 0
    opened_at = partition_offsets(broker, "t", 0)[0] - 1
    transaction(p, {0: ["c"], 1: ["d"]})
    transaction(p, {0: ["e"], 1: ["f"]})
    assert ways.sent == (1, 2)
    assert ways.refused == 1
    assert partition_offsets(broker, "t", 0)[1] == opened_at
    assert read_values(broker, "t", 0) == ["a"]
    other.commit_transaction()
    assert read_values(broker, "t", 0) == ["a", "o", "c", "e"]
    high_watermark, lso = partition_offsets(broker, "t", 0)
    assert lso == high_watermark


def test_a_moved_lease_is_refused_and_the_markers_carry_the_new_epoch(
    broker: Broker, producers: Any, ways: Ways
) -> None:
    """The transaction-log partition's lease moves to another coordinator epoch between two
    commits: refused on the lease's epoch, and the lock's way stamps the markers with the
    new one."""
    p = producers("tx")
    transaction(p, {0: ["a"]})
    with broker.engine.begin() as conn:
        epochs = conn.execute(
            text(
                """INSERT INTO coordinator_leases (txn_partition, owner, coordinator_epoch)
                   SELECT txn_partition, 'elsewhere', 7 FROM transactions
                   WHERE transactional_id = 'tx'
                   ON CONFLICT (txn_partition) DO UPDATE SET coordinator_epoch = 7
                   RETURNING coordinator_epoch"""
            )
        ).scalar_one()
    transaction(p, {0: ["b"]})
    transaction(p, {0: ["c"]})
    assert ways.sent == (1, 2)
    assert ways.refused == 1
    with broker.engine.connect() as conn:
        stamped = (
            conn.execute(
                text('SELECT coordinator_epoch FROM records WHERE is_control ORDER BY "offset"')
            )
            .scalars()
            .all()
        )
    assert stamped[1:] == [epochs, epochs]


@pytest.mark.parametrize("offsets", [False, True], ids=["records", "with-offsets"])
def test_a_process_killed_inside_the_one_query_commit_leaves_nothing(
    db_url: str, broker: Broker, offsets: bool
) -> None:
    """Killed (SIGKILL) with the COPYs' data handed over and the last COPY not ended: the
    server rolls the whole transaction back, records, markers and transitions, and the
    offsets it was completing stay pending; the id's next instance finds the second commit
    as the last, aborts the third transaction (its offsets never land), and appends right
    after the second."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    assert env["KIP98_CLIENT_COORDINATOR_LOOP"] == "0"
    child = subprocess.run(
        [sys.executable, "-m", "tests.children.remembered_commit_child", db_url,
         *(["offsets"] if offsets else [])],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert all_values(broker, committed=False) == {0: ["a", "c"], 1: ["b", "d"], 2: []}
    with broker.engine.connect() as conn:
        states = (
            conn.execute(
                text(
                    "SELECT state FROM transaction_log WHERE transactional_id = 'tx' ORDER BY event_id"
                )
            )
            .scalars()
            .all()
        )
    assert states.count("COMPLETE_COMMIT") == 2
    if offsets:  # the third transaction's offsets joined it, in a commit of their own
        assert states[-1] == "BEGIN"
        left = group_tables(broker, "g")
        assert left["group_offsets"] == [("t", 0, 2, None)]
        assert left["pending_txn_offsets"] == [("t", 0, 3)]
    else:
        assert states[-1] == "COMPLETE_COMMIT"
    with Producer({"database.url": db_url, "transactional.id": "tx"}) as p:
        p.init_transactions()
        if offsets:
            assert group_tables(broker, "g")["pending_txn_offsets"] == []
            offsets_transaction(p, "t", {0: ["e"], 1: ["f"]}, [{0: 4}], "g")
        else:
            transaction(p, {0: ["e"], 1: ["f"]})
    assert all_values(broker) == {0: ["a", "c", "e"], 1: ["b", "d", "f"], 2: []}
    assert [partition_offsets(broker, "t", i)[0] for i in (0, 1)] == [6, 6]
    if offsets:
        left = group_tables(broker, "g")
        assert left["group_offsets"] == [("t", 0, 4, None)]
        kinds = [row[2] for row in left["offset_commit_log"]]
        assert kinds == ["txn_pending", "txn_commit"] * 2 + ["txn_pending", "txn_abort"] * 1 + [
            "txn_pending", "txn_commit"
        ]  # fmt: skip


def test_producers_racing_on_shared_partitions(
    db_url: str, broker: Broker, producers: Any, ways: Ways
) -> None:
    """Two transactional producers commit on threads of their own, one mostly on
    partitions 0 and 1, the other mostly on 2 and now and then on 1, while an idempotent
    producer appends to 1: commits go in one query while their rows stay theirs and are
    refused when the other wrote in between. Every committed record is read once, each
    producer's in order, every partition gapless, its LSO at the end."""
    create_topic(broker, "r", 3)
    plans = {
        "r0": [[0, 1] if i % 5 else [0, 1, 2] for i in range(25)],
        "r1": [[2] if i % 3 else [1, 2] for i in range(25)],
    }
    made = {tid: producers(tid) for tid in plans}
    errors: list[BaseException] = []

    def run(tid: str) -> None:
        try:
            p = made[tid]
            for n, partitions in enumerate(plans[tid]):
                p.begin_transaction()
                for partition in partitions:
                    for k in range(random.randint(1, 3)):
                        value = f"{tid}-{n}-{k}".encode()
                        p.produce("r", value=value, partition=partition)
                p.commit_transaction()
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)

    def plain() -> None:
        try:
            with Producer({"database.url": db_url, "linger.ms": 0}) as other:
                for i in range(20):
                    other.produce("r", value=f"x-{i}".encode(), partition=1)
                    assert other.flush(30) == 0
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(tid,)) for tid in plans]
    threads.append(threading.Thread(target=plain))
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert ways.one >= 1
    for partition in range(3):
        values = read_values(broker, "r", partition)
        assert len(values) == len(set(values))
        for tid in (*plans, "x"):
            mine = [v for v in values if v.startswith(f"{tid}-")]
            assert mine == sorted(mine, key=lambda v: tuple(int(x) for x in v.split("-")[1:]))
        expected = {
            f"{tid}-{n}"
            for tid, ps in plans.items()
            for n, parts in enumerate(ps)
            if partition in parts
        }
        assert {v.rsplit("-", 1)[0] for v in values if not v.startswith("x-")} == expected
        high_watermark, lso = partition_offsets(broker, "r", partition)
        assert lso == high_watermark
        with broker.engine.connect() as conn:
            offsets = (
                conn.execute(
                    text(
                        'SELECT "offset" FROM records WHERE topic = :t AND partition = :p ORDER BY 1'
                    ),
                    {"t": "r", "p": partition},
                )
                .scalars()
                .all()
            )
        assert offsets == list(range(high_watermark))
    plain_values = [v for v in read_values(broker, "r", 1) if v.startswith("x-")]
    assert plain_values == [f"x-{i}" for i in range(20)]


class World:
    """One run of a property example: a topic, the producer under test (``main``, replaced
    by a new instance when fenced) and another transactional producer, on their own ids;
    the main producer's transactions may send ``group`` positions on the topic."""

    def __init__(self, db_url: str, broker: Broker, name: str, group: str) -> None:
        self.db_url, self.topic, self.group = db_url, name, group
        self.positions = 0
        self.main_id, self.other_id = f"{name}-main", f"{name}-other"
        create_topic(broker, name, 3)
        self.main = self._transactional(self.main_id)
        self.other = self._transactional(self.other_id, 0)
        self.other_open = False
        self.main_open = False  # a transaction begun by "early" sends, not yet ended
        self.plain = Producer({"database.url": db_url, "linger.ms": 0})

    def _transactional(self, transactional_id: str, linger_ms: int = 5_000) -> Producer:
        p = Producer(
            {"database.url": self.db_url, "transactional.id": transactional_id}
            | {"linger.ms": linger_ms}
        )
        p.init_transactions()
        return p

    def apply(self, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind in ("commit", "abort"):
            if not self.main_open:
                self.main.begin_transaction()
            self.main_open = False
            for partition, count in sorted(op[1].items()):
                for k in range(count):
                    value = f"{kind}-{partition}-{k}".encode()
                    self.main.produce(self.topic, value=value, partition=partition, timestamp=7)
            if op[2]:  # offsets in the transaction
                self.positions += 1
                sent = [TopicPartition(self.topic, 0, self.positions)]
                self.main.send_offsets_to_transaction(sent, ConsumerGroupMetadata(self.group))
            if kind == "commit":
                self.main.commit_transaction()
            else:
                self.main.abort_transaction()
        elif kind == "early":  # records flushed before the commit: the first registers
            if not self.main_open:
                self.main.begin_transaction()
                self.main_open = True
            for k in range(op[2]):
                value = f"early-{op[1]}-{k}".encode()
                self.main.produce(self.topic, value=value, partition=op[1], timestamp=7)
            assert self.main.flush(30) == 0
        elif kind == "plain":
            for _ in range(op[2]):  # a batch each, as both topics' must be alike
                self.plain.produce(self.topic, value=b"p", partition=op[1], timestamp=7)
                assert self.plain.flush(30) == 0
        elif kind == "open_other":
            if not self.other_open:
                self.other.begin_transaction()
                self.other_open = True
            self.other.produce(self.topic, value=b"o", partition=op[1], timestamp=7)
            assert self.other.flush(30) == 0
        elif kind == "commit_other" and self.other_open:
            self.other.commit_transaction()
            self.other_open = False
        elif kind == "fence":
            self.main.close()
            self.main = self._transactional(self.main_id)
            self.main_open = False

    def close(self) -> None:
        for p in (self.main, self.other, self.plain):
            p.close()


_PARTITION_COUNTS = st.dictionaries(st.integers(0, 2), st.integers(1, 3), min_size=1)
_OPS = st.lists(
    st.one_of(
        st.tuples(
            st.sampled_from(["commit", "commit", "commit", "abort"]),
            _PARTITION_COUNTS,
            st.booleans(),  # with offsets
        ),
        st.tuples(st.just("plain"), st.integers(0, 2), st.integers(1, 4)),
        st.tuples(st.just("early"), st.integers(0, 2), st.integers(1, 3)),
        st.tuples(st.just("open_other"), st.integers(0, 2)),
        st.tuples(st.just("commit_other")),
        st.tuples(st.just("lease")),
        st.tuples(st.just("fence")),
    ),
    min_size=1,
    max_size=10,
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=_OPS)
def test_any_interleaving_leaves_what_the_lock_way_leaves(
    db_url: str, broker: Broker, ways: Ways, monkeypatch: pytest.MonkeyPatch, ops: list[Any]
) -> None:
    """Random runs of the producer's commits and aborts, some with a group's offsets or
    with records sent before them (the transaction's first request registering its
    partitions), with another producer's plain appends, another transaction opened and
    committed on the same partitions, the lease moving and the producer fenced by a new
    instance in between, each applied to two topics at once: on one the producer's
    registrations and commits may go in one query, on the other every one takes the
    lock's way. Both leave the same rows, the group's offsets and their events
    included."""
    tag = f"w{ways.one + ways.lock}x{random.randrange(1 << 30)}"
    with broker.engine.begin() as conn:  # the leases as no example moved them
        conn.execute(text("DELETE FROM coordinator_leases"))
    group = f"{tag}-g"
    one_query = World(db_url, broker, f"{tag}a", group)
    lock_way = World(db_url, broker, f"{tag}b", group)
    eligible = strategy.one_query

    def only_on_one_query(context: Any, conn: Any, req: Any) -> bool:
        named = req.end or req.add
        tids = {b.transactional_id for b in req.batches}
        if lock_way.main_id in tids or (named and named.transactional_id == lock_way.main_id):
            return False
        return bool(eligible(context, conn, req))

    monkeypatch.setattr(strategy, "one_query", only_on_one_query)
    try:
        for op in [("commit", {0: 1, 1: 1, 2: 1}, False), *ops, ("commit", {0: 1}, True)]:
            if op[0] == "lease":
                ids = (one_query.main_id, one_query.other_id, lock_way.main_id, lock_way.other_id)
                _move_leases(broker, *ids)
                continue
            one_query.apply(op)
            lock_way.apply(op)
    finally:
        one_query.close()
        lock_way.close()
    assert tables(broker, one_query.topic, one_query.main_id, one_query.other_id) == tables(
        broker, lock_way.topic, lock_way.main_id, lock_way.other_id
    )
    offsets = group_tables(broker, group)  # both topics' positions, each world's its own
    for rows in offsets.values():
        assert [r[1:] for r in rows if r[0] == one_query.topic] == [
            r[1:] for r in rows if r[0] == lock_way.topic
        ]
    assert [r[1:] for r in offsets["group_offsets"] if r[0] == one_query.topic] == [
        (0, one_query.positions, None)
    ]


def _move_leases(broker: Broker, *transactional_ids: str) -> None:
    """Move the lease of the ids' transaction-log partitions to another coordinator epoch,
    once for a partition several share: every id's lease moves alike, whichever share."""
    with broker.engine.begin() as conn:
        conn.execute(
            text(
                """INSERT INTO coordinator_leases (txn_partition, owner, coordinator_epoch)
                   SELECT DISTINCT txn_partition, 'elsewhere', 1 FROM transactions
                   WHERE transactional_id = ANY(:tids)
                   ON CONFLICT (txn_partition)
                   DO UPDATE SET coordinator_epoch = coordinator_leases.coordinator_epoch + 1"""
            ),
            {"tids": list(transactional_ids)},
        )


def test_statements_gone_from_the_session_are_prepared_again(
    broker: Broker, producers: Any, ways: Ways, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session whose prepared statements are gone (someone ran DEALLOCATE, here: they
    were taken for prepared without being so) fails the query string's first EXECUTE:
    the commit takes the lock's way, and the next one prepares them again."""
    p = producers("tx")
    transaction(p, {0: ["a"], 1: ["b"]})
    real = one_query_module.prepare_once
    monkeypatch.setattr(one_query_module, "prepare_once", _taken_for_prepared)
    transaction(p, {0: ["c"], 1: ["d"]})
    monkeypatch.setattr(one_query_module, "prepare_once", real)
    transaction(p, {0: ["e"], 1: ["f"]})
    assert ways.sent == (1, 2)
    assert all_values(broker) == {0: ["a", "c", "e"], 1: ["b", "d", "f"], 2: []}


def _taken_for_prepared(conn: Any, name: str, statement: str, types: Any = ()) -> None:
    conn.connection.info[("kip98_prepared", name)] = True


def test_a_commit_after_batches_sent_early_goes_in_one_query_too(
    broker: Broker, producers: Any, ways: Ways
) -> None:
    """A transaction whose first batch went before the commit (a flush) registered its
    partition then, in one query string on the rows the last commit left, which the
    process remembers as that request left them; the commit, over a partition holding the
    producer's own open transaction, goes in one query string too, with no refusal."""
    p = producers("tx")
    transaction(p, {0: ["a"], 1: ["b"]})
    p.begin_transaction()
    p.produce("t", value=b"c", partition=0)
    assert p.flush(30) == 0
    p.produce("t", value=b"d", partition=1)
    p.commit_transaction()
    transaction(p, {0: ["e"], 1: ["f"]})
    assert ways.sent == (2, 1)
    assert ways.refused == 0
    assert all_values(broker) == {0: ["a", "c", "e"], 1: ["b", "d", "f"], 2: []}


# What holds the one-query commit where its backend is terminated: the holder's statement
# (let go once the backend is gone), and what the backend then waits in.
_HOLDS = {
    # its first statement waits for the transactional id's row
    "id-row": (
        "SELECT 1 FROM transactions WHERE transactional_id = 'tx' FOR UPDATE",
        "EXECUTE kip98_%",
    ),
    # its COPY waits on an uncommitted record at one of its offsets, the statements before
    # it run (transitions, markers) and its first rows written
    "mid-copy": (
        'INSERT INTO records SELECT topic, partition, "offset" + 2, "timestamp", key, value, '
        "headers, producer_id, producer_epoch, sequence, batch_base_offset + 2, "
        "is_transactional, is_control, control_type, coordinator_epoch FROM records "
        "WHERE topic = 't' AND partition = 1 AND \"offset\" = 1",
        "EXECUTE kip98_%COPY records%",
    ),
}


@pytest.mark.parametrize("hold", sorted(_HOLDS))
def test_a_backend_terminated_inside_the_one_query_commit(
    db_url: str, broker: Broker, producers: Any, hold: str
) -> None:
    """The one-query commit's backend is terminated while it waits, in its first locking
    read or inside its COPY with the transitions and markers run: nothing of it stays (the
    server rolls the implicit transaction back), the process forgets what it remembered
    (the connection is lost), and the commit, retried, commits its records once by the
    lock's way."""
    statement, waiting = _HOLDS[hold]
    p = producers("tx", **{"client.id": f"terminated-{hold}", "retry.backoff.ms": 5})
    transaction(p, {0: ["a"], 1: ["b"]})
    with (
        psycopg.connect(conninfo(db_url), autocommit=True) as admin,
        holding(db_url, statement) as holder,
    ):
        p.begin_transaction()
        for partition, value in ((0, "c"), (1, "d"), (1, "e")):
            p.produce("t", value=value.encode(), partition=partition)
        committing = threading.Thread(target=p.commit_transaction)
        committing.start()
        terminate(admin, wait_for_blocked_backend(admin, f"terminated-{hold}", waiting))
        holder.release()  # its row lock freed, its uncommitted record rolled back
        committing.join(60)
    assert not committing.is_alive()
    assert all_values(broker, committed=False) == {0: ["a", "c"], 1: ["b", "d", "e"], 2: []}
    assert all_values(broker) == {0: ["a", "c"], 1: ["b", "d", "e"], 2: []}
    with broker.engine.connect() as conn:
        states = (
            conn.execute(text("SELECT state FROM transaction_log WHERE transactional_id = 'tx'"))
            .scalars()
            .all()
        )
    assert states.count("COMPLETE_COMMIT") == 2
    transaction(p, {0: ["f"], 1: ["g"]})  # and the next one goes on
    assert all_values(broker)[0] == ["a", "c", "f"]


def test_two_batches_for_one_partition_commit_in_one_query(broker: Broker, ways: Ways) -> None:
    """A commit with two batches for one partition is decided batch after batch on the
    remembered row, as under the lock, and sent in one query string: the records once and
    in order, no DB transaction left open."""
    driver = TxnDriver(broker, "tx")
    driver.init()
    first = driver.commit_with(
        driver.requests(("t", 0, "a"), ("t", 1, "b")), register=[("t", 0), ("t", 1)]
    )
    assert first.end is not None and first.end.error_code == 0
    c, d = driver.requests(("t", 0, "c"), ("t", 0, "d"))
    second = driver.commit_with([c, replace(d, base_sequence=c.base_sequence + 1)], [("t", 0)])
    assert second.end is not None and second.end.error_code == 0
    assert [b.base_offset for b in second.batches] == [2, 3]
    assert ways.sent == (1, 1)
    assert ways.refused == 0
    assert all_values(broker) == {0: ["a", "c", "d"], 1: ["b"], 2: []}
    with broker.engine.connect() as conn:
        idle = conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND state = 'idle in transaction'"
            )
        ).scalar_one()
    assert idle == 0


def test_a_commit_that_spends_the_epochs_takes_the_lock_way_from_the_start(
    broker: Broker, ways: Ways
) -> None:
    """A commit whose epoch bump (KIP-890) would pass the last epoch allocates a new
    producer id, which the remembered rows cannot: it is sent under the locks without
    being decided on them, and the next transaction, on the new id, commits too."""
    driver = TxnDriver(broker, "tx")
    driver.init()
    with broker.engine.begin() as conn:
        conn.execute(text("UPDATE transactions SET producer_epoch = :e"), {"e": MAX_EPOCH - 2})
    driver.producer_epoch = MAX_EPOCH - 2
    assert driver.init() == 0 and driver.producer_epoch == MAX_EPOCH - 1
    for values in (("a", "b"), ("c", "d")):
        pid = driver.producer_id
        r = driver.commit_with(
            driver.requests(("t", 0, values[0]), ("t", 1, values[1])), [("t", 0), ("t", 1)]
        )
        assert r.end is not None and r.end.error_code == 0
    assert driver.producer_id != pid and driver.producer_epoch == 0
    assert (ways.sent, ways.declined, ways.refused) == ((0, 2), 0, 0)
    r = driver.commit_with(driver.requests(("t", 0, "e")), [("t", 0)])
    assert r.end is not None and r.end.error_code == 0
    assert all_values(broker) == {0: ["a", "c", "e"], 1: ["b", "d"], 2: []}
