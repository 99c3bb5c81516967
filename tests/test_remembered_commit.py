"""The combined commit on the rows this process's last commit left (docs/design.md §3.11).

After a Producer's first commit of a transactional id, its next ones are decided on the id's
row and the partition rows as that commit left them and sent as one query string, whose
first statements lock the rows and read their versions; the data goes only if every row
is still the version remembered. These tests make the remembered rows wrong in each way
they can be (another instance fenced the producer, another producer wrote a partition or
opened a transaction there, the lease moved, the process died inside the query) and check
that the commit is then decided as if nothing had been remembered, and that the commits
that do go in one query leave the tables exactly as the lock's way leaves them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from app.broker import Broker
from app.broker import commit as commit_module
from app.client import KafkaException, Producer
from app.errors import KafkaError
from app.log.topics import create_topic
from app.storage.one_query import QueryCopies
from tests.txn_driver import partition_offsets, read_values

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def steady_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    """No coordinator loop in the clients: a loop taking the lease over moves its epoch,
    which refuses the next one-query commit (as it must); these tests move it themselves."""
    monkeypatch.setenv("KIP98_CLIENT_COORDINATOR_LOOP", "0")


@pytest.fixture
def broker(db_url: str) -> Broker:
    b = Broker.connect(db_url)
    create_topic(b, "t", 3)
    return b


class Ways:
    """Which way each combined commit went: "one" (one query string) or "lock"; and how
    many one-query commits were refused on their reads."""

    def __init__(self) -> None:
        self.taken: list[str] = []
        self.refused = 0


@pytest.fixture
def ways(monkeypatch: pytest.MonkeyPatch) -> Ways:
    seen = Ways()
    original = commit_module.commit_on_remembered

    def spy(context: Any, req: Any) -> Any:
        answered = original(context, req)
        seen.taken.append("lock" if answered is None else "one")
        return answered

    refuse = QueryCopies.refuse

    def counted(self: QueryCopies, why: str) -> None:
        seen.refused += 1
        refuse(self, why)

    monkeypatch.setattr(commit_module, "commit_on_remembered", spy)
    monkeypatch.setattr(QueryCopies, "refuse", counted)
    return seen


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
    assert ways.taken == ["lock", "one", "one", "one"]
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
                          FROM producer_states WHERE topic = :topic ORDER BY partition""",
    "aborted_txns": """SELECT partition, first_offset, last_offset, last_stable_offset
                       FROM aborted_txns WHERE topic = :topic ORDER BY partition, first_offset""",
    "transaction_log": """SELECT producer_epoch, last_producer_epoch, state,
                                 jsonb_path_query_array(partitions, '$[*][1]'),
                                 has_offsets, coordinator_epoch, reason
                          FROM transaction_log WHERE transactional_id = :tid ORDER BY event_id""",
}


def tables(broker: Broker, topic: str, transactional_id: str) -> dict[str, list[Any]]:
    """What a run left, without what differs between two runs of it (producer ids, times)."""
    with broker.engine.connect() as conn:
        return {
            name: [
                tuple(r) for r in conn.execute(text(q), {"topic": topic, "tid": transactional_id})
            ]
            for name, q in _TABLES.items()
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
            monkeypatch.setattr(commit_module, "commit_on_remembered", lambda *_: None)
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
    assert ways.taken.count("one") >= 5  # after the first commit, and after the abort
    assert tables(broker, "t", "one-query") == tables(broker, "u", "lock-way")


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
    assert ways.taken == ["lock", "one", "lock"]
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
    assert ways.taken == ["lock", "one", "lock"]
    assert ways.refused == (1 if records == 1 else 0)
    xs = [f"x{i}" for i in range(records)]
    assert all_values(broker) == {0: ["a", "c", "e"], 1: ["b", "d", *xs, "f"], 2: []}
    high_watermark, lso = partition_offsets(broker, "t", 1)
    assert (high_watermark, lso) == (2 * 2 + records + 2, high_watermark)
    transaction(p, {0: ["g"], 1: ["h"]})
    assert ways.taken[-1] == "one"  # the lock's way left rows to remember


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
    assert ways.taken == ["lock", "lock", "one"]
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
    assert ways.taken == ["lock", "lock", "one"]
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


def test_a_process_killed_inside_the_one_query_commit_leaves_nothing(
    db_url: str, broker: Broker
) -> None:
    """Killed (SIGKILL) with the COPYs' data handed over and the last COPY not ended: the
    server rolls the whole transaction back, records, markers and transitions; the id's
    next instance finds the second commit as the last, and appends right after it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    assert env["KIP98_CLIENT_COORDINATOR_LOOP"] == "0"
    child = subprocess.run(
        [sys.executable, "-m", "tests.remembered_commit_child", db_url],
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
    assert states[-1] == "COMPLETE_COMMIT" and states.count("COMPLETE_COMMIT") == 2
    with Producer({"database.url": db_url, "transactional.id": "tx"}) as p:
        p.init_transactions()
        transaction(p, {0: ["e"], 1: ["f"]})
    assert all_values(broker) == {0: ["a", "c", "e"], 1: ["b", "d", "f"], 2: []}
    assert [partition_offsets(broker, "t", i)[0] for i in (0, 1)] == [6, 6]
