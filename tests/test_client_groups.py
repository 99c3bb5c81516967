"""Consumer groups through the public client API (confluent-kafka's), against a real
PostgreSQL with real threads and processes: eager rebalances served from poll(), commits
and committed offsets, auto commit, require_stable (KIP-447), a tailing consumer under
concurrent transactional producers, group metadata, and the session timeout."""

from __future__ import annotations

import itertools
import os
import queue
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from app.broker import Broker
from app.client import (
    OFFSET_INVALID,
    OFFSET_STORED,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from app.protocol import TopicPartitionKey
from tests.helpers.client_helpers import create_topics, group_consumer

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ helpers


def fill(db_url: str, topic: str, partitions: int, per_partition: int, tag: str = "v") -> None:
    with Producer({"database.url": db_url, "linger.ms": 5}) as p:
        for i in range(per_partition):
            for q in range(partitions):
                p.produce(topic, f"{tag}-{q}-{i}".encode(), partition=q)
        assert p.flush(30) == 0


def keys(tps: list[TopicPartition]) -> list[TopicPartitionKey]:
    return sorted((tp.topic, tp.partition) for tp in tps)


def poll_until(
    consumers: list[Consumer], done: Callable[[], bool], what: str, timeout: float = 30
) -> list[Message]:
    """Poll the consumers in turn on this thread until ``done``; returns the records."""
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        for c in consumers:
            m = c.poll(0.05)
            if m is not None and m.error() is None:
                got.append(m)
    return got


class Recorder:
    """on_assign / on_revoke callbacks that log what they were given and on which thread."""

    def __init__(self) -> None:
        self.events: list[tuple[str, list[TopicPartitionKey]]] = []
        self.threads: set[int] = set()

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.threads.add(threading.get_ident())
        self.events.append(("assign", keys(partitions)))

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.threads.add(threading.get_ident())
        self.events.append(("revoke", keys(partitions)))

    def last_assigned(self) -> list[TopicPartitionKey] | None:
        for kind, parts in reversed(self.events):
            if kind == "assign":
                return parts
        return None


def committed_map(
    consumer: Consumer, partitions: list[TopicPartitionKey]
) -> dict[TopicPartitionKey, int]:
    got = consumer.committed([TopicPartition(t, p) for t, p in partitions], timeout=60)
    return {(tp.topic, tp.partition): tp.offset for tp in got}


# ------------------------------------------------------------------ rebalances


def test_rebalance_splits_and_reunites_without_duplicates(db_url: str, clients: list[Any]) -> None:
    create_topics(db_url, {"events": 4})
    fill(db_url, "events", 4, 100)
    all_parts = [("events", q) for q in range(4)]

    rec1 = Recorder()
    c1 = group_consumer(db_url, clients, "split")
    c1.subscribe(["events"], on_assign=rec1.on_assign, on_revoke=rec1.on_revoke)
    first = poll_until([c1], lambda: rec1.last_assigned() == all_parts, "c1's assignment")
    assert rec1.events[0] == ("assign", all_parts)
    assert rec1.threads == {threading.get_ident()}  # served from poll(), on the caller's thread
    for m in first:
        c1.commit(m, asynchronous=False)

    # Both consume concurrently, committing each record after processing it; c2 joins
    # while c1 is busy, and a producer keeps adding records meanwhile.
    seen: dict[str, list[tuple[str, int, int]]] = {"c1": [], "c2": []}
    seen["c1"].extend((m.topic() or "", m.partition() or 0, m.offset() or 0) for m in first)
    stop = threading.Event()
    failures: list[BaseException] = []
    rec2 = Recorder()
    c2_ready = threading.Event()

    def run(name: str, consumer: Consumer, subscribe: Recorder | None) -> None:
        try:
            if subscribe is not None:
                consumer.subscribe(
                    ["events"], on_assign=subscribe.on_assign, on_revoke=subscribe.on_revoke
                )
                c2_ready.set()
            while not stop.is_set():
                m = consumer.poll(0.05)
                if m is None or m.error() is not None:
                    continue
                seen[name].append((m.topic() or "", m.partition() or 0, m.offset() or 0))
                try:
                    consumer.commit(m, asynchronous=False)
                except KafkaException as exc:
                    failures.append(exc)
        except BaseException as exc:
            failures.append(exc)

    c2 = group_consumer(db_url, clients, "split")
    t1 = threading.Thread(target=run, args=("c1", c1, None))
    t2 = threading.Thread(target=run, args=("c2", c2, rec2))
    t1.start()
    t2.start()
    fill(db_url, "events", 4, 50, tag="late")
    total = 4 * 150

    def split() -> bool:
        """Everything read, and both members hold their share of the split (c2 may have
        joined after the backlog was read; c1 takes its half back on its own poll)."""
        a1, a2 = rec1.last_assigned(), rec2.last_assigned()
        return (
            len(seen["c1"]) + len(seen["c2"]) >= total
            and a1 is not None
            and a2 is not None
            and sorted(a1 + a2) == all_parts
        )

    deadline = time.monotonic() + 120
    while not split() and not failures:
        assert time.monotonic() < deadline, f"no split: {rec1.events} {rec2.events}"
        time.sleep(0.05)
    stop.set()
    t1.join(60)
    t2.join(60)
    assert not (t1.is_alive() or t2.is_alive()), "a consumer thread did not stop"
    assert not failures, failures

    everything = seen["c1"] + seen["c2"]
    assert len(everything) == len(set(everything)), "a record was returned twice in the group"
    assert sorted(everything) == sorted(("events", q, o) for q in range(4) for o in range(150))
    # The range assignor split the partitions: c2 got the upper half, c1 kept the lower.
    a1, a2 = rec1.last_assigned(), rec2.last_assigned()
    assert a1 is not None and a2 is not None
    assert sorted(a1 + a2) == all_parts and not set(a1) & set(a2)
    assert ("revoke", all_parts) in rec1.events  # eager: everything revoked first
    assert committed_map(c1, all_parts) == dict.fromkeys(all_parts, 150)

    # c2 leaves: c1 gets every partition back.
    c2.close()
    poll_until([c1], lambda: rec1.last_assigned() == all_parts and len(rec1.events) > 3, "reunion")
    assert keys(c1.assignment()) == all_parts


def test_commit_committed_and_restart_from_committed(db_url: str, clients: list[Any]) -> None:
    create_topics(db_url, {"orders": 2})
    fill(db_url, "orders", 2, 10)
    parts = [("orders", 0), ("orders", 1)]
    c = group_consumer(db_url, clients, "resume")
    c.subscribe(["orders"])
    got = c.consume(6, timeout=60)
    assert len(got) == 6
    last = got[-1]
    assert c.commit(last, asynchronous=False) == [
        TopicPartition(last.topic() or "", last.partition() or 0, (last.offset() or 0) + 1)
    ]
    assert committed_map(c, parts)[(last.topic() or "", last.partition() or 0)] == (
        (last.offset() or 0) + 1
    )
    # commit() without arguments: the positions.
    positions = {(tp.topic, tp.partition): tp.offset for tp in c.position(c.assignment())}
    done = c.commit(asynchronous=False)
    assert done is not None
    assert {(tp.topic, tp.partition): tp.offset for tp in done} == positions
    assert committed_map(c, parts) == positions
    # Explicit offsets.
    c.commit(offsets=[TopicPartition("orders", 1, 8)], asynchronous=False)
    positions[("orders", 1)] = 8
    assert committed_map(c, parts) == positions
    c.close()

    # A new member of the group starts from the committed offsets.
    d = group_consumer(db_url, clients, "resume")
    d.subscribe(["orders"])
    rest = d.consume(10 - positions[("orders", 0)] + 10 - 8, timeout=60)
    firsts: dict[TopicPartitionKey, int] = {}
    for m in rest:
        firsts.setdefault((m.topic() or "", m.partition() or 0), m.offset() or 0)
    assert firsts == {tp: o for tp, o in positions.items() if o < 10}
    assert d.poll(0.3) is None


def test_auto_commit_and_close_commit_positions(db_url: str, clients: list[Any]) -> None:
    create_topics(db_url, {"ticks": 2})
    fill(db_url, "ticks", 2, 20)
    parts = [("ticks", 0), ("ticks", 1)]
    c = group_consumer(
        db_url, clients, "auto", **{"enable.auto.commit": True, "auto.commit.interval.ms": 100}
    )
    c.subscribe(["ticks"])
    assert len(c.consume(40, timeout=60)) == 40
    positions = {(tp.topic, tp.partition): tp.offset for tp in c.position(c.assignment())}
    assert positions == dict.fromkeys(parts, 20)
    viewer = group_consumer(db_url, clients, "auto")
    # The positions reach the group through the periodic auto commit (served from poll).
    deadline = time.monotonic() + 20
    while committed_map(viewer, parts) != positions:
        assert time.monotonic() < deadline, "auto commit never stored the positions"
        assert c.poll(0.05) is None  # everything was consumed already

    # close() commits the final positions (the interval is far away here).
    e = group_consumer(
        db_url, clients, "auto2", **{"enable.auto.commit": True, "auto.commit.interval.ms": 600_000}
    )
    e.subscribe(["ticks"])
    assert len(e.consume(25, timeout=60)) == 25
    final = {(tp.topic, tp.partition): tp.offset for tp in e.position(e.assignment())}
    assert sum(final.values()) == 25
    e.close()
    viewer2 = group_consumer(db_url, clients, "auto2")
    assert committed_map(viewer2, parts) == final


def test_without_auto_commit_close_commits_nothing(db_url: str, clients: list[Any]) -> None:
    create_topics(db_url, {"quiet": 1})
    fill(db_url, "quiet", 1, 5)
    c = group_consumer(db_url, clients, "manual")
    c.subscribe(["quiet"])
    assert len(c.consume(5, timeout=60)) == 5
    c.close()
    viewer = group_consumer(db_url, clients, "manual")
    assert committed_map(viewer, [("quiet", 0)]) == {("quiet", 0): OFFSET_INVALID}


# ------------------------------------------------------------------ KIP-447 require_stable


def test_new_member_waits_for_pending_transactional_offsets(
    db_url: str, clients: list[Any]
) -> None:
    create_topics(db_url, {"src": 1, "dst": 1})
    fill(db_url, "src", 1, 20)
    seed = group_consumer(db_url, clients, "eos")
    seed.commit(offsets=[TopicPartition("src", 0, 5)], asynchronous=False)

    p = Producer({"database.url": db_url, "transactional.id": "eos-tx"})
    clients.append(p)
    p.init_transactions()
    p.begin_transaction()
    p.produce("dst", b"out", partition=0)
    p.send_offsets_to_transaction([TopicPartition("src", 0, 12)], seed.consumer_group_metadata())
    assert p.flush(60) == 0

    joiner = group_consumer(db_url, clients, "eos")
    joiner.subscribe(["src"])
    first: list[Message] = []
    polls = threading.Event()
    failures: list[BaseException] = []

    def consume() -> None:
        try:
            deadline = time.monotonic() + 120
            while not first and time.monotonic() < deadline:
                m = joiner.poll(0.05)
                polls.set()
                if m is not None and m.error() is None:
                    first.append(m)
        except BaseException as exc:
            failures.append(exc)

    t = threading.Thread(target=consume)
    t.start()
    # While the offsets are pending the member holds no partition and returns nothing,
    # however long it polls (it does not fall back to the old committed offset 5).
    assert polls.wait(60)
    for _ in range(10):
        assert not first
        time.sleep(0.05)
    assert not first and joiner.assignment() == []
    p.commit_transaction()
    t.join(125)
    assert not failures, failures
    assert len(first) == 1
    assert first[0].offset() == 12 and first[0].value() == b"v-0-12"


# ------------------------------------------------------------------ tailing under load


def test_tailing_consumer_neither_repeats_nor_skips(db_url: str, clients: list[Any]) -> None:
    create_topics(db_url, {"feed": 2})
    stop = threading.Event()
    failures: list[BaseException] = []

    def transactional(n: int) -> None:
        rng = random.Random(n)
        try:
            with Producer(
                {"database.url": db_url, "transactional.id": f"feed-{n}", "linger.ms": 2}
            ) as p:
                p.init_transactions()
                for i in range(12):
                    p.begin_transaction()
                    for j in range(rng.randint(1, 6)):
                        p.produce("feed", f"t{n}-{i}-{j}".encode(), partition=rng.randrange(2))
                    if rng.random() < 0.3:
                        if rng.random() < 0.5:
                            p.flush(60)
                        p.abort_transaction()
                    else:
                        p.commit_transaction()
        except BaseException as exc:
            failures.append(exc)

    def plain() -> None:
        try:
            with Producer({"database.url": db_url, "linger.ms": 2}) as p:
                for i in range(60):
                    p.produce("feed", f"p-{i}".encode(), partition=i % 2)
                    if i % 7 == 0:
                        p.flush(60)
                assert p.flush(60) == 0
        except BaseException as exc:
            failures.append(exc)

    got: dict[int, list[tuple[int, bytes | None]]] = {0: [], 1: []}
    # Once the writers are done: how many records read_committed shows per partition.
    ends: dict[int, int] = {}

    def tail() -> None:
        try:
            c = group_consumer(db_url, [], "tail")
            try:
                c.subscribe(["feed"])
                while not (stop.is_set() and all(len(got[q]) >= ends[q] for q in ends)):
                    m = c.poll(0.05)
                    if m is None:
                        continue
                    assert m.error() is None, m.error()
                    got[m.partition() or 0].append((m.offset() or 0, m.value()))
                    if len(got[0]) % 10 == 0:
                        c.commit(asynchronous=False)
            finally:
                c.close()
        except BaseException as exc:
            failures.append(exc)

    reader = threading.Thread(target=tail)
    reader.start()
    writers = [threading.Thread(target=transactional, args=(n,)) for n in range(3)]
    writers.append(threading.Thread(target=plain))
    for w in writers:
        w.start()
    for w in writers:
        w.join(120)
        assert not w.is_alive(), "a writer did not finish"

    with Broker.connect(db_url).engine.connect() as conn:
        rows = conn.execute(
            text(
                'SELECT partition, "offset", value FROM committed_records '
                "WHERE topic = 'feed' ORDER BY partition, \"offset\""
            )
        ).all()
    expected: dict[int, list[tuple[int, bytes | None]]] = {0: [], 1: []}
    for r in rows:
        expected[r.partition].append((r.offset, bytes(r.value) if r.value is not None else None))
    ends.update({q: len(v) for q, v in expected.items()})
    stop.set()  # the reader stops once it has read as many (a hang guard: its join)
    reader.join(120)
    assert not reader.is_alive(), f"the reader is stuck at {[len(v) for v in got.values()]}"
    assert not failures, failures
    for q in (0, 1):
        offsets = [o for o, _ in got[q]]
        assert all(a < b for a, b in itertools.pairwise(offsets)), f"partition {q}"
        assert got[q] == expected[q], f"partition {q}: consumer differs from committed_records"
    assert sum(len(v) for v in expected.values()) >= 60


# ------------------------------------------------------------------ group metadata, arguments


def test_consumer_group_metadata_and_group_id_required(db_url: str, clients: list[Any]) -> None:
    create_topics(db_url, {"meta": 2})
    c = group_consumer(db_url, clients, "meta-g")
    before = c.consumer_group_metadata()
    assert (before.group_id, before.generation_id, before.member_id) == ("meta-g", -1, "")
    c.subscribe(["meta"])
    poll_until([c], lambda: len(c.assignment()) == 2, "assignment")
    after = c.consumer_group_metadata()
    assert after.group_id == "meta-g" and after.generation_id >= 1 and after.member_id
    c.unsubscribe()
    assert c.assignment() == []
    gone = c.consumer_group_metadata()
    assert (gone.generation_id, gone.member_id) == (-1, "")

    loner = Consumer({"database.url": db_url})
    clients.append(loner)
    for fn in (
        lambda: loner.subscribe(["meta"]),
        lambda: loner.commit(offsets=[TopicPartition("meta", 0, 1)], asynchronous=False),
        lambda: loner.commit(asynchronous=False),
        lambda: loner.committed([TopicPartition("meta", 0)]),
        loner.consumer_group_metadata,
    ):
        with pytest.raises(KafkaException) as info:
            fn()
        assert info.value.args[0].code() == KafkaError._INVALID_ARG


# ------------------------------------------------------------------ session timeout

CHILD = textwrap.dedent(
    """
    from app.client import Consumer
    c = Consumer({
        "group.id": "sessions", "auto.offset.reset": "earliest", "enable.auto.commit": False,
        "session.timeout.ms": 3000, "heartbeat.interval.ms": 200,
    })
    c.subscribe(["work"])
    announced = None
    while True:
        c.poll(0.05)
        now = sorted(tp.partition for tp in c.assignment())
        if now != announced:
            announced = now
            print(",".join(map(str, now)), flush=True)
    """
)


def test_a_killed_member_is_removed_after_its_session_timeout(
    db_url: str, clients: list[Any]
) -> None:
    create_topics(db_url, {"work": 4})
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        cwd=ROOT,
        env={**os.environ, "KIP98_DATABASE_URL": db_url},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None

        lines: queue.Queue[str] = queue.Queue()
        stdout = child.stdout

        def pump() -> None:
            for line in stdout:
                lines.put(line.strip())

        threading.Thread(target=pump, daemon=True).start()

        def announced(want: Callable[[str], bool]) -> str:
            while True:
                line = lines.get(timeout=60)  # the child's assignment, each time it changes
                if want(line):
                    return line

        assert announced(lambda s: s == "0,1,2,3") == "0,1,2,3"
        rec = Recorder()
        survivor = group_consumer(db_url, clients, "sessions")
        survivor.subscribe(["work"], on_assign=rec.on_assign, on_revoke=rec.on_revoke)
        poll_until([survivor], lambda: len(survivor.assignment()) == 2, "the split")
        child_half = announced(lambda s: s not in ("", "0,1,2,3"))
        mine = sorted(tp.partition for tp in survivor.assignment())
        assert sorted(mine + [int(x) for x in child_half.split(",")]) == [0, 1, 2, 3]

        child.send_signal(signal.SIGKILL)
        child.wait(10)
        # No LeaveGroup: only the missed heartbeats remove the child.
        poll_until(
            [survivor], lambda: len(survivor.assignment()) == 4, "the survivor to take over", 60
        )
        assert rec.last_assigned() == [("work", q) for q in range(4)]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


def test_assigned_consumer_waits_for_pending_offsets_past_the_request_timeout(
    db_url: str, clients: list[Any]
) -> None:
    """assign() with OFFSET_STORED reads the committed offset with require_stable; while a
    transaction holds pending offsets it keeps waiting (KIP-447: UNSTABLE_OFFSET_COMMIT is
    retriable), however long that takes, and never falls back to auto.offset.reset."""
    create_topics(db_url, {"src": 1, "dst": 1})
    fill(db_url, "src", 1, 20)
    seed = group_consumer(db_url, clients, "stored")
    seed.commit(offsets=[TopicPartition("src", 0, 5)], asynchronous=False)
    p = Producer({"database.url": db_url, "transactional.id": "stored-tx"})
    clients.append(p)
    p.init_transactions()
    p.begin_transaction()
    p.send_offsets_to_transaction([TopicPartition("src", 0, 12)], seed.consumer_group_metadata())

    c = group_consumer(db_url, clients, "stored", **{"request.timeout.ms": 300})
    c.assign([TopicPartition("src", 0, OFFSET_STORED)])
    deadline = time.monotonic() + 1.5  # well past request.timeout.ms
    while time.monotonic() < deadline:
        assert c.poll(0.1) is None
    p.commit_transaction()
    m = c.poll(60)
    assert m is not None and m.error() is None
    assert m.offset() == 12


def test_a_member_that_stops_polling_leaves_after_max_poll_interval(
    db_url: str, clients: list[Any]
) -> None:
    """Alive (heartbeating) but not polling: after max.poll.interval.ms it leaves, so the
    rebalance another member started is not held up and that member gets everything."""
    create_topics(db_url, {"stuck": 2})
    stalled = group_consumer(db_url, clients, "stalls", **{"max.poll.interval.ms": 1000})
    stalled.subscribe(["stuck"])
    poll_until([stalled], lambda: len(stalled.assignment()) == 2, "the first assignment")
    other = group_consumer(db_url, clients, "stalls")
    other.subscribe(["stuck"])
    # ``stalled`` never polls again; its heartbeat thread keeps it alive for the session.
    poll_until([other], lambda: len(other.assignment()) == 2, "the other member to get all", 60)


def test_a_batch_never_spans_a_rebalance(db_url: str, clients: list[Any]) -> None:
    """consume(n) that would straddle a rebalance returns what it has first: a batch never
    mixes records of revoked partitions with records re-read after the new assignment."""
    create_topics(db_url, {"trickle": 2})
    stop = threading.Event()

    def trickle() -> None:
        with Producer({"database.url": db_url, "linger.ms": 0}) as p:
            i = 0
            while not stop.is_set():
                p.produce("trickle", f"v{i}".encode(), partition=i % 2)
                p.flush(5)
                i += 1
                time.sleep(0.01)

    writer = threading.Thread(target=trickle)
    writer.start()
    try:
        a = group_consumer(db_url, clients, "spans")
        a.subscribe(["trickle"])
        poll_until([a], lambda: len(a.assignment()) == 2, "the first assignment")
        b = group_consumer(db_url, clients, "spans")
        b_assigned = threading.Event()

        def join() -> None:
            b.subscribe(["trickle"])
            deadline = time.monotonic() + 60
            while not b.assignment() and time.monotonic() < deadline:
                b.consume(1, timeout=0.1)
            b_assigned.set()

        batches = [a.consume(100_000, timeout=1)]  # a is reading when b joins
        joiner = threading.Thread(target=join)
        joiner.start()
        # The rebalance needs a's rejoin, made inside one of these consume() calls: so
        # one of them straddles it, at any speed.
        while not b_assigned.is_set():
            batches.append(a.consume(100_000, timeout=1))
        batches.append(a.consume(100_000, timeout=1))
        joiner.join()
        assert b.assignment(), "b never got a partition"
    finally:
        stop.set()
        writer.join()
    for batch in batches:
        seen = [(m.partition(), m.offset()) for m in batch if m.error() is None]
        assert len(seen) == len(set(seen)), "a record came twice in one batch"
        for p in (0, 1):
            offsets = [o for q, o in seen if q == p]
            assert offsets == sorted(offsets), f"partition {p} went backwards within a batch"
