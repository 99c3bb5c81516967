"""Exactly once through ``kip98 serve`` under real crashes: a librdkafka copier process
(consume, transform, produce, offsets in the transaction) is SIGKILLed again and again in
the middle of its work, and restarted; the copy holds every source record exactly once,
in order."""

from __future__ import annotations

import random
import subprocess
import sys
import time

from app.broker import Broker
from app.client import Producer
from app.log.topics import create_topic
from app.protocol import OffsetFetchRequest
from tests.helpers.txn_driver import read_values

RECORDS = 50_000
PARTITIONS = 4
KILLS = 10


def _start(server: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.children.wire_copier", server, "src", "dst", str(RECORDS)],
        text=True,
    )  # fmt: skip


def _copied(broker: Broker) -> int:
    """Source records copied and committed: the group's committed offsets, added up."""
    committed = broker.handle(OffsetFetchRequest("copier", None, False))
    return sum(max(om.offset, 0) for om in committed.offsets.values())


def _kill_once_copied(broker: Broker, proc: subprocess.Popen[str], records: int) -> None:
    """SIGKILL the copier as soon as the copy has reached ``records``: wherever it then
    is (mid-produce, mid-commit, between transactions)."""
    deadline = time.monotonic() + 300
    while _copied(broker) < records:
        assert proc.poll() is None, f"the copier exited ({proc.returncode}) short of {records}"
        assert time.monotonic() < deadline, f"the copy never reached {records} records"
        time.sleep(0.01)
    proc.kill()
    proc.wait()


def test_a_copier_killed_ten_times_copies_50000_records_exactly_once(
    server: str, db_url: str
) -> None:
    broker = Broker.connect(db_url)
    create_topic(broker, "src", PARTITIONS)
    create_topic(broker, "dst", PARTITIONS)
    source = Producer({"database.url": db_url, "enable.idempotence": True})
    produced = 0

    def produce_up_to(n: int) -> None:
        nonlocal produced
        for i in range(produced, n):
            source.produce("src", f"r{i}", partition=i % PARTITIONS)
        assert source.flush(120) == 0
        produced = n

    # The source grows in KILLS + 1 steps. Each copier but the last is killed once the copy
    # has reached a random point inside the step produced before it started, before the
    # next step exists: it always has work left (a copier exits only once all RECORDS are
    # copied), so every kill lands mid-copy and there are KILLS of them, at any speed.
    steps = [RECORDS * (k + 1) // (KILLS + 1) for k in range(KILLS + 1)]
    rng = random.Random(98)
    for k in range(KILLS):
        step_start = steps[k - 1] if k else 0
        produce_up_to(steps[k])
        proc = _start(server)
        _kill_once_copied(
            broker, proc, step_start + int(rng.uniform(0.1, 0.9) * (steps[k] - step_start))
        )
    produce_up_to(RECORDS)
    source.close()
    proc = _start(server)
    assert proc.wait(600) == 0, "the copier failed"

    for p in range(PARTITIONS):
        assert read_values(broker, "dst", p) == [f"R{i}" for i in range(p, RECORDS, PARTITIONS)], (
            f"partition {p}"
        )
    committed = broker.handle(OffsetFetchRequest("copier", None, True))
    assert {tp: om.offset for tp, om in committed.offsets.items()} == {
        ("src", p): RECORDS // PARTITIONS for p in range(PARTITIONS)
    }
