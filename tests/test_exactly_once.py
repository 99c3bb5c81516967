"""Exactly-once consume-transform-produce under real crashes: copier processes killed with
SIGKILL at random moments and restarted, and a group that loses a member mid-stream.
The committed output must hold every input record exactly once, in per-partition order,
and the group's committed offsets must equal the input's end."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from app.admin import AdminClient, NewTopic
from app.broker import Broker
from app.client import Consumer, Producer, TopicPartition
from tests.txn_driver import read_values

ROOT = Path(__file__).resolve().parents[1]
PARTITIONS = 4


def setup_topics(db_url: str, records: int) -> dict[int, list[str]]:
    admin = AdminClient({"database.url": db_url})
    for name in ("in", "out"):
        admin.create_topics([NewTopic(name, PARTITIONS)])[name].result()
    expected: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    with Producer({"database.url": db_url, "linger.ms": 20}) as producer:
        for i in range(records):
            p = i % PARTITIONS
            value = f"rec-{p}-{i}"
            producer.produce("in", value.encode(), partition=p)
            expected[p].append(value.upper())
            if i % 5000 == 0:
                producer.poll(0)
        assert producer.flush(60) == 0
    return expected


def start_copier(db_url: str, transactional_id: str, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "KIP98_DATABASE_URL": db_url}
    return subprocess.Popen(
        [sys.executable, "-m", "app.pipeline", "in", "out", "copiers", transactional_id, *extra],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def committed_offsets(db_url: str) -> dict[int, int]:
    with Consumer({"database.url": db_url, "group.id": "copiers"}) as c:
        got = c.committed([TopicPartition("in", p) for p in range(PARTITIONS)], timeout=30)
    return {tp.partition: tp.offset for tp in got}


def committed_output(db_url: str) -> int:
    with Broker.connect(db_url).engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM committed_records WHERE topic = 'out'")
            ).scalar_one()
        )


def check_output(db_url: str, expected: dict[int, list[str]]) -> None:
    broker = Broker.connect(db_url)
    for p in range(PARTITIONS):
        got = read_values(broker, "out", p)
        assert len(got) == len(expected[p]), (
            f"partition {p}: {len(got)} records, expected {len(expected[p])}"
        )
        assert got == expected[p], (
            f"partition {p}: output differs from input (duplicate, loss or reorder)"
        )
    assert committed_offsets(db_url) == {p: len(expected[p]) for p in range(PARTITIONS)}


@pytest.mark.slow
def test_copy_is_exactly_once_across_sigkills(db_url: str) -> None:
    records = int(os.environ.get("KIP98_EOS_RECORDS", "100000"))
    kills = int(os.environ.get("KIP98_EOS_KILLS", "20"))
    expected = setup_topics(db_url, records)
    rng = random.Random(2024)
    killed = 0
    mid_stream = 0
    while killed < kills:
        # Five lanes: the output's four partitions each on its own, the riskiest setting.
        proc = start_copier(db_url, "copier-0", "--max-in-flight", "5")
        time.sleep(rng.uniform(0.5, 2.0))
        if proc.poll() is not None:
            pytest.fail(f"copier exited early: {proc.stderr.read() if proc.stderr else ''}")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        killed += 1
        mid_stream += committed_output(db_url) < records
    # The kills must land while there was still work to do, or they prove nothing.
    assert mid_stream >= kills // 2, f"only {mid_stream} of {kills} kills hit a copier mid-stream"
    final = start_copier(db_url, "copier-0", "--idle-exit", "8")
    _, err = final.communicate(timeout=600)
    assert final.returncode == 0, err
    check_output(db_url, expected)


@pytest.mark.slow
def test_group_member_killed_mid_stream_loses_and_duplicates_nothing(db_url: str) -> None:
    expected = setup_topics(db_url, 20_000)
    # a must wait out b's session timeout (6 s), then b's open transaction, which holds
    # b's offsets pending until its timeout (10 s) aborts it, before it may call itself idle.
    a = start_copier(db_url, "copier-a", "--batch-size", "100", "--idle-exit", "30")
    b = start_copier(db_url, "copier-b", "--batch-size", "100")
    time.sleep(3)
    b.send_signal(signal.SIGKILL)
    b.wait()
    _, err = a.communicate(timeout=600)
    assert a.returncode == 0, err
    check_output(db_url, expected)
