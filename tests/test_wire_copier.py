"""Exactly once through ``kip98 serve`` under real crashes: a librdkafka copier process
(consume, transform, produce, offsets in the transaction) is SIGKILLed again and again at
random moments, and restarted; the copy holds every source record exactly once, in order."""

from __future__ import annotations

import random
import select
import subprocess
import sys
import time

from app.broker import Broker
from app.client import Producer
from app.log.topics import create_topic
from app.protocol import OffsetFetchRequest
from tests.txn_driver import read_values

RECORDS = 50_000
PARTITIONS = 4
KILLS = 10


def _start(server: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.wire_copier", server, "src", "dst"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip


def _wait_for_first_commit(proc: subprocess.Popen[str], timeout: float = 120) -> bool:
    """True once the copier has committed a transaction; False if it exited first."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if line == "":
                return False
            if line.strip() == "committed":
                return True
    raise TimeoutError("the copier committed nothing")


def test_a_copier_killed_ten_times_copies_50000_records_exactly_once(
    server: str, db_url: str
) -> None:
    broker = Broker.connect(db_url)
    create_topic(broker, "src", PARTITIONS)
    create_topic(broker, "dst", PARTITIONS)
    source = Producer({"database.url": db_url, "enable.idempotence": True})
    for i in range(RECORDS):
        source.produce("src", f"r{i}", partition=i % PARTITIONS)
    source.flush()
    source.close()

    rng = random.Random(98)
    kills = 0
    while True:
        proc = _start(server)
        if kills < KILLS and _wait_for_first_commit(proc):
            time.sleep(rng.uniform(0.0, 1.0))  # anywhere: mid-produce, mid-commit, idle
            if proc.poll() is None:
                proc.kill()
                proc.wait()
                kills += 1
                continue
        assert proc.wait(300) == 0, "the copier failed"
        break
    assert kills == KILLS, f"the copy finished after {kills} kills; make it longer"

    for p in range(PARTITIONS):
        assert read_values(broker, "dst", p) == [f"R{i}" for i in range(p, RECORDS, PARTITIONS)], (
            f"partition {p}"
        )
    committed = broker.handle(OffsetFetchRequest("copier", None, True))
    assert {tp: om.offset for tp, om in committed.offsets.items()} == {
        ("src", p): RECORDS // PARTITIONS for p in range(PARTITIONS)
    }
