"""librdkafka 2.12 with ``group.protocol=consumer`` (KIP-848) against ``kip98 serve``:
several consumers share a topic's partitions by the broker's assignment; one is killed
(SIGKILL, no leave) and its partitions move to the others once its session ends; with
read_committed and offsets committed after each record, no record is consumed twice and
none is missed (docs/design.md rules 60-63)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import confluent_kafka as ck
import pytest
from sqlalchemy import text

from app.broker import Broker
from app.log.topics import create_topic
from tests.helpers.wire_client import delivered, serving

RECORDS = 40
# The consumer protocol's session is the broker's (group.consumer.session.timeout.ms).
SERVE_ENV = {
    "KIP98_GROUP_CONSUMER_SESSION_TIMEOUT_MS": "6000",
    "KIP98_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS": "500",
}
HANG_GUARD_S = 180
REGEX = "SELECT subscribed_topic_regex FROM consumer_group_members WHERE group_id = :g"
EVENTS = "SELECT kind FROM consumer_group_events WHERE group_id = :g ORDER BY event_id"

# A consumer in a process of its own: it takes ``take`` records, committing each before
# it prints its key, then says so and waits to be killed.
KILLED_CONSUMER = """
import sys, time
import confluent_kafka as ck
server, take = sys.argv[1], int(sys.argv[2])
c = ck.Consumer({"bootstrap.servers": server, "group.id": "copiers",
                 "group.protocol": "consumer", "enable.auto.commit": False,
                 "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
c.subscribe(["copy-in"])
got = 0
while got < take:
    m = c.poll(0.2)
    if m is None or m.error():
        continue
    c.commit(message=m, asynchronous=False)
    print(m.key().decode(), flush=True)
    got += 1
print("DONE", flush=True)
while True:
    time.sleep(1)
"""


@pytest.fixture
def server(db_url: str) -> Iterator[str]:
    with serving(db_url, env=SERVE_ENV) as address:
        yield address


def _consumer(server: str, name: str) -> ck.Consumer:
    c = ck.Consumer(
        {"bootstrap.servers": server, "group.id": "copiers", "group.protocol": "consumer",
         "client.id": name, "enable.auto.commit": False, "auto.offset.reset": "earliest",
         "isolation.level": "read_committed"}
    )  # fmt: skip
    c.subscribe(["copy-in"])
    return c


def test_a_killed_consumers_partitions_move_and_nothing_is_consumed_twice(
    server: str, db_url: str
) -> None:
    create_topic(Broker.connect(db_url), "copy-in", 4)
    producer = ck.Producer({"bootstrap.servers": server, "transactional.id": "copy-writer"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for p in range(4):
        delivered(producer, 5, topic="copy-in", partition=p, key=f"a{p}")
    producer.abort_transaction(30)  # never read by read_committed consumers
    producer.begin_transaction()
    keys = [f"k{i}" for i in range(RECORDS)]
    for i, key in enumerate(keys):
        producer.produce("copy-in", key=key, value=b"v", partition=i % 4)
    producer.commit_transaction(30)

    killed = subprocess.Popen(
        [sys.executable, "-c", KILLED_CONSUMER, server, "3"],
        stdout=subprocess.PIPE, text=True, env=os.environ.copy(),
    )  # fmt: skip
    seen: list[str] = []
    consumers: list[ck.Consumer] = []
    try:
        assert killed.stdout is not None
        for line in killed.stdout:
            if line.strip() == "DONE":
                break
            seen.append(line.strip())
        assert len(seen) == 3
        consumers = [_consumer(server, "c1"), _consumer(server, "c2")]
        killed.send_signal(signal.SIGKILL)  # no leave: its session must end
        killed.wait(30)
        deadline = time.monotonic() + HANG_GUARD_S
        while len(seen) < RECORDS and time.monotonic() < deadline:
            for c in consumers:
                m = c.poll(0.1)
                if m is None or m.error():
                    continue
                c.commit(message=m, asynchronous=False)
                seen.append(m.key().decode())
        assert sorted(seen) == sorted(keys), "each committed record consumed exactly once"
        assignments = [c.assignment() for c in consumers]
        assert all(assignments), "both live consumers hold partitions"
        owned = [(tp.topic, tp.partition) for a in assignments for tp in a]
        assert sorted(owned) == [("copy-in", p) for p in range(4)]
        with Broker.connect(db_url).engine.begin() as conn:
            kinds = conn.execute(text(EVENTS), {"g": "copiers"}).scalars().all()
        assert "member_expired" in kinds and "target_assignment" in kinds
    finally:
        if killed.poll() is None:
            killed.kill()
        for c in consumers:
            c.close()


def test_a_regular_expression_subscription_follows_the_topics_it_matches(
    server: str, db_url: str
) -> None:
    """librdkafka's ``^pattern`` subscription goes to the broker as KIP-848's regular
    expression: the broker assigns the topics it matches whole, and a topic created
    later is assigned too (the group epoch moves with the topics matched)."""
    broker = Broker.connect(db_url)
    for name in ("rx-a", "rx-b", "other"):
        create_topic(broker, name, 1)
    producer = ck.Producer({"bootstrap.servers": server})
    for name in ("rx-a", "rx-b", "other"):
        producer.produce(name, key=name, value=b"v")
    assert producer.flush(30) == 0
    c = ck.Consumer(
        {"bootstrap.servers": server, "group.id": "rx", "group.protocol": "consumer",
         "enable.auto.commit": False, "auto.offset.reset": "earliest",
         "topic.metadata.refresh.interval.ms": 1000}
    )  # fmt: skip
    try:
        c.subscribe(["^rx-.*"])
        seen = _poll_keys(c, {"rx-a", "rx-b"})
        create_topic(broker, "rx-c", 1)
        producer.produce("rx-c", key="rx-c", value=b"v")
        assert producer.flush(30) == 0
        seen |= _poll_keys(c, {"rx-c"})
        assert seen == {"rx-a", "rx-b", "rx-c"}  # never "other"
        with broker.engine.begin() as conn:
            regex = conn.execute(text(REGEX), {"g": "rx"}).scalars().all()
        assert regex and all(r is not None for r in regex), "the broker resolved the pattern"
    finally:
        c.close()


def _poll_keys(c: ck.Consumer, want: set[str]) -> set[str]:
    seen: set[str] = set()
    deadline = time.monotonic() + HANG_GUARD_S
    while not want <= seen and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and not m.error():
            seen.add(m.key().decode())
    assert want <= seen, seen
    return seen


# A copier of KIP-447's shape in a process of its own: each record read is produced to the
# output in a transaction that also commits its offset through the consumer group. After
# ``take`` transactions it starts one more, leaves it open and waits to be killed.
KILLED_COPIER = """
import sys, time
import confluent_kafka as ck
server, take = sys.argv[1], int(sys.argv[2])
c = ck.Consumer({"bootstrap.servers": server, "group.id": "eos", "group.protocol": "consumer",
                 "enable.auto.commit": False, "auto.offset.reset": "earliest",
                 "isolation.level": "read_committed"})
p = ck.Producer({"bootstrap.servers": server, "transactional.id": "eos-killed",
                 "transaction.timeout.ms": 10000})
p.init_transactions(30)
c.subscribe(["eos-in"])
done = 0
while True:
    m = c.poll(0.2)
    if m is None or m.error():
        continue
    p.begin_transaction()
    p.produce("eos-out", key=m.key(), value=m.value())
    p.send_offsets_to_transaction(
        [ck.TopicPartition(m.topic(), m.partition(), m.offset() + 1)],
        c.consumer_group_metadata(), 30)
    if done == take:
        p.flush(30)
        print("OPEN", flush=True)
        while True:
            time.sleep(1)
    p.commit_transaction(30)
    done += 1
"""


def test_an_exactly_once_copy_survives_a_copier_killed_in_a_transaction(
    db_url: str,
) -> None:
    """Consume-transform-produce with ``group.protocol=consumer``: a copier is SIGKILLed
    with a transaction open (its output written, its offset sent); its partitions move to
    the two left once its session ends, its transaction is aborted at its timeout, and
    the output read read_committed holds each input record exactly once (docs/design.md
    rules 61, 62)."""
    env = {**SERVE_ENV, "KIP98_COORDINATOR_INTERVAL_MS": "500"}
    with serving(db_url, env=env) as server:
        broker = Broker.connect(db_url)
        create_topic(broker, "eos-in", 4)
        create_topic(broker, "eos-out", 1)
        producer = ck.Producer({"bootstrap.servers": server})
        keys = [f"e{i}" for i in range(RECORDS)]
        for i, key in enumerate(keys):
            producer.produce("eos-in", key=key, value=b"v", partition=i % 4)
        assert producer.flush(30) == 0
        killed = subprocess.Popen(
            [sys.executable, "-c", KILLED_COPIER, server, "2"], stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        copiers: list[tuple[ck.Consumer, ck.Producer]] = []
        try:
            assert killed.stdout is not None
            assert killed.stdout.readline().strip() == "OPEN"
            killed.send_signal(signal.SIGKILL)
            killed.wait(30)
            for n in range(2):
                c = _consumer_of(server, "eos", "eos-in")
                p = ck.Producer({"bootstrap.servers": server, "transactional.id": f"eos-{n}"})
                p.init_transactions(30)
                copiers.append((c, p))
            output = _copy_until(copiers, server, len(keys))
            assert sorted(output) == sorted(keys), "each input record copied exactly once"
        finally:
            if killed.poll() is None:
                killed.kill()
            for c, _ in copiers:
                c.close()


def _consumer_of(server: str, group: str, topic: str) -> ck.Consumer:
    c = ck.Consumer(
        {"bootstrap.servers": server, "group.id": group, "group.protocol": "consumer",
         "enable.auto.commit": False, "auto.offset.reset": "earliest",
         "isolation.level": "read_committed"}
    )  # fmt: skip
    c.subscribe([topic])
    return c


def _copy_until(
    copiers: list[tuple[ck.Consumer, ck.Producer]], server: str, want: int
) -> list[str]:
    """Copy in transactions until the output, read read_committed, holds ``want``
    records; the output's keys."""
    reader = ck.Consumer(
        {"bootstrap.servers": server, "group.id": "eos-reader", "enable.auto.commit": False,
         "auto.offset.reset": "earliest", "isolation.level": "read_committed"}
    )  # fmt: skip
    reader.assign([ck.TopicPartition("eos-out", 0, 0)])
    output: list[str] = []
    deadline = time.monotonic() + HANG_GUARD_S
    try:
        while len(output) < want and time.monotonic() < deadline:
            for c, p in copiers:
                m = c.poll(0.1)
                if m is None or m.error():
                    continue
                p.begin_transaction()
                p.produce("eos-out", key=m.key(), value=m.value())
                offsets = [ck.TopicPartition(m.topic(), m.partition(), m.offset() + 1)]
                p.send_offsets_to_transaction(offsets, c.consumer_group_metadata(), 30)
                p.commit_transaction(30)
            r = reader.poll(0.1)
            if r is not None and not r.error():
                output.append(r.key().decode())
        # Anything more would be a duplicate: read on a little past the count.
        end = time.monotonic() + 2
        while time.monotonic() < end:
            r = reader.poll(0.2)
            if r is not None and not r.error():
                output.append(r.key().decode())
    finally:
        reader.close()
    return output


# A consumer that commits each record before it prints its key, and prints each commit
# refused as REFUSED: the zombie of the test below.
PAUSED_CONSUMER = """
import sys
import confluent_kafka as ck
server = sys.argv[1]
c = ck.Consumer({"bootstrap.servers": server, "group.id": "zombies",
                 "group.protocol": "consumer", "enable.auto.commit": False,
                 "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
c.subscribe(["zombie-in"])
while True:
    m = c.poll(0.2)
    if m is None or m.error():
        continue
    try:
        c.commit(message=m, asynchronous=False)
    except ck.KafkaException as exc:
        print("REFUSED", exc.args[0].name(), flush=True)
        continue
    print(m.key().decode(), flush=True)
"""


def test_a_paused_member_comes_back_fenced_and_nothing_is_consumed_twice(
    server: str, db_url: str
) -> None:
    """KIP-447 in the consumer protocol: a member stopped (SIGSTOP) past its session is
    removed and its partitions move; let go again (SIGCONT), the zombie's commits are
    refused by its member epoch, so what it reads twice it never commits, and the
    records committed are each committed once (rule 62)."""
    create_topic(Broker.connect(db_url), "zombie-in", 2)
    producer = ck.Producer({"bootstrap.servers": server})
    keys = [f"z{i}" for i in range(RECORDS)]
    for i, key in enumerate(keys[:10]):
        producer.produce("zombie-in", key=key, value=b"v", partition=i % 2)
    assert producer.flush(30) == 0
    zombie = subprocess.Popen(
        [sys.executable, "-c", PAUSED_CONSUMER, server], stdout=subprocess.PIPE, text=True
    )
    committed: list[str] = []
    other = None
    try:
        assert zombie.stdout is not None
        while len(committed) < 10:
            committed.append(zombie.stdout.readline().strip())
        zombie.send_signal(signal.SIGSTOP)
        for i, key in enumerate(keys[10:]):
            producer.produce("zombie-in", key=key, value=b"v", partition=i % 2)
        assert producer.flush(30) == 0
        other = _consumer_of(server, "zombies", "zombie-in")
        deadline = time.monotonic() + HANG_GUARD_S
        while len(committed) < RECORDS and time.monotonic() < deadline:
            m = other.poll(0.2)
            if m is None or m.error():
                continue
            other.commit(message=m, asynchronous=False)
            committed.append(m.key().decode())
        zombie.send_signal(signal.SIGCONT)
        # The zombie wakes with records fetched before it stopped, or none: whatever it
        # tries to commit now is refused, until it has rejoined with nothing left to read.
        end = time.monotonic() + 5
        woke: list[str] = []
        while time.monotonic() < end:
            line = _line_within(zombie, end - time.monotonic())
            if line:
                woke.append(line)
        committed += [w for w in woke if not w.startswith("REFUSED")]
        assert sorted(committed) == sorted(keys), woke
    finally:
        zombie.send_signal(signal.SIGCONT)
        zombie.kill()
        if other is not None:
            other.close()


def _line_within(proc: subprocess.Popen[str], seconds: float) -> str | None:
    import select

    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], max(seconds, 0))
    return proc.stdout.readline().strip() if ready else None
