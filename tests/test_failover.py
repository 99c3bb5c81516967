"""Losing the primary's machine under load: its processes SIGKILLed and its data directory
deleted, ``kip98 db failover``, every client reconnecting by itself to the new primary
(docs/design.md rule 43). Nothing acknowledged is lost, nothing doubled, no transaction
partly visible, and the work goes on; then the old primary rejoins as a standby."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from app.admin import AdminClient, NewTopic
from app.broker import Broker
from app.client import Consumer, Producer, TopicPartition
from app.log.partition_lock import remembered
from app.storage.engine import dispose_engines
from app.torture.failover import kill_node, lose_machine
from tests.children.failover_load import PARTITIONS
from tests.helpers.replication import ReplicatedDatabase, wait_streaming
from tests.helpers.txn_driver import partition_offsets, read_values
from tests.helpers.wire_client import serving

ROOT = Path(__file__).resolve().parents[1]
COPIERS = ("c1", "c2")
HANG_GUARD_S = 180


@dataclass
class Watched:
    """A child process whose stdout lines are collected as they come, with their times."""

    proc: subprocess.Popen[str]
    lines: list[tuple[float, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.strip()))

    def after(self, moment: float, prefix: str) -> int:
        return sum(1 for at, line in list(self.lines) if at > moment and line.startswith(prefix))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(HANG_GUARD_S) == 0, (
            self.proc.stderr.read() if self.proc.stderr else ""
        )


def _start(db: ReplicatedDatabase, *args: str) -> Watched:
    env = {**os.environ, "KIP98_DATABASE_URL": db.url}
    proc = subprocess.Popen(
        [sys.executable, "-m", *args], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    return Watched(proc)


def _wait(what: str, condition: object) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.1)


def _group_offsets(url: str) -> dict[int, int]:
    with Consumer({"database.url": url, "group.id": "copiers"}) as consumer:
        got = consumer.committed([TopicPartition("in", p) for p in range(PARTITIONS)], 60)
    return {tp.partition: tp.offset for tp in got}


def test_losing_the_primary_under_load_keeps_exactly_once(replica_db: ReplicatedDatabase) -> None:
    url = replica_db.url
    admin = AdminClient({"database.url": url})
    for name in ("in", "out", "wire"):
        admin.create_topics([NewTopic(name, PARTITIONS)])[name].result()
    broker = Broker.connect(url)

    with serving(url) as bootstrap:
        feeder = _start(replica_db, "tests.children.failover_load", "feed", "in")
        wire = _start(replica_db, "tests.children.failover_load", "wire", bootstrap, "wire")
        copiers = [
            _start(replica_db, "app.pipeline", "in", "out", "copiers", tid, "--batch-size", "50")
            for tid in COPIERS
        ]
        _wait("writes before the failover", lambda: (
            feeder.after(0, "acked") > 200 and wire.after(0, "committed") > 3
            and sum(o for o in _group_offsets(url).values() if o > 0) > 200
        ))  # fmt: skip

        lose_machine(replica_db.primary())
        died = time.monotonic()
        failover = replica_db.kip98("db", "failover")
        assert failover.returncode == 0, failover.stderr
        promoted = time.monotonic()
        copied_then = sum(o for o in _group_offsets(url).values() if o > 0)
        _wait("work resumed on the new primary", lambda: (
            feeder.after(promoted, "acked") > 100 and wire.after(promoted, "committed") > 3
            and sum(o for o in _group_offsets(url).values() if o > 0) > copied_then + 100
        ))  # fmt: skip
        first = min(
            at for w in (feeder, wire) for at, line in list(w.lines)
            if at > promoted and line.startswith(("acked", "committed"))
        )  # fmt: skip
        print(f"primary lost -> promoted {promoted - died:.2f}s; -> first write acknowledged "
              f"{first - promoted:.2f}s after the promotion")  # fmt: skip

        feeder.stop()
        wire.stop()
        ends = {p: partition_offsets(broker, "in", p)[0] for p in range(PARTITIONS)}
        _wait("the copiers caught up", lambda: _group_offsets(url) == ends)
        for copier in copiers:
            copier.stop()
    _wait("every transaction ended", lambda: all(
        partition_offsets(broker, t, p)[0] == partition_offsets(broker, t, p)[1]
        for t in ("in", "out", "wire") for p in range(PARTITIONS)
    ))  # fmt: skip

    # Every record the feeder was told was written is there, once; nothing twice.
    fed = [v for p in range(PARTITIONS) for v in read_values(broker, "in", p)]
    counts = Counter(fed)
    assert max(counts.values()) == 1, "a record appended twice"
    acked = {f"f-{line.split()[1]}" for _, line in feeder.lines if line.startswith("acked")}
    assert acked <= counts.keys(), f"acknowledged and lost: {sorted(acked - counts.keys())[:5]}"
    # The copy holds each input record once, in order, and the offsets say so.
    for p in range(PARTITIONS):
        assert read_values(broker, "out", p) == [v.upper() for v in read_values(broker, "in", p)]
    # The wire producer's committed transactions are there whole, once; its aborted ones not.
    seen = Counter(v for p in range(PARTITIONS) for v in read_values(broker, "wire", p))
    committed, aborted = set(), set()
    for _, line in wire.lines:
        kind, first_n, last_n = line.split()
        values = {f"w-{n}" for n in range(int(first_n), int(last_n) + 1)}
        (committed if kind == "committed" else aborted).update(values)
    assert set(seen) == committed and max(seen.values()) == 1
    assert not aborted & set(seen)


def test_clients_forget_what_they_remembered_and_the_old_primary_rejoins(
    replica_db: ReplicatedDatabase,
) -> None:
    """A Producer that remembers its partition rows (docs/design.md rule 32) is moved to
    the new primary by its next request; what it remembered is forgotten with the lost
    connection. The old primary, killed but with its data, is rewound to the new
    primary's history and follows it; a reader of it sees everything."""
    url = replica_db.url
    AdminClient({"database.url": url}).create_topics([NewTopic("t", 1)])["t"].result()
    producer = Producer({"database.url": url})
    try:
        for i in range(20):
            producer.produce("t", f"before-{i}".encode(), partition=0)
            assert producer.flush(60) == 0
        engine = producer._broker.engine
        with engine.connect() as conn:
            assert remembered(conn, ("t", 0)) is not None

        old, old_name = replica_db.primary(), replica_db.layout().primary
        kill_node(old)
        failover = replica_db.kip98("db", "failover")
        assert failover.returncode == 0, failover.stderr

        # The pooled connection to the old primary is found ended at checkout, given up,
        # and everything remembered goes with it.
        with engine.connect() as conn:
            assert remembered(conn, ("t", 0)) is None
            port = conn.exec_driver_sql("SELECT inet_server_port()").scalar_one()
        assert port == replica_db.primary().status().port
        producer.produce("t", b"after", partition=0)
        assert producer.flush(60) == 0
        with engine.connect() as conn:
            tip = remembered(conn, ("t", 0))
        # Remembered again only from the new primary's own answer.
        assert tip is not None and tip.row.next_offset == 21
    finally:
        producer.close()

    rejoin = replica_db.kip98("db", "start")
    assert rejoin.returncode == 0, rejoin.stderr
    assert "rewound" in rejoin.stderr  # its data kept, only what differs copied
    wait_streaming(replica_db.cluster, 2)
    nodes = {n.name: n for n in replica_db.cluster.nodes()}
    assert nodes[old_name].role == "standby" and nodes[old_name].sync_state == "quorum"
    dispose_engines()
    reader = Broker.connect(replica_db.node_url(old))
    _wait("the rejoined standby replayed everything", lambda: (
        read_values(reader, "t", 0) == [*(f"before-{i}" for i in range(20)), "after"]
    ))  # fmt: skip
