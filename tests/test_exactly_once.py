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
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import IO

import pytest
from sqlalchemy import text

from app.admin import AdminClient, NewTopic
from app.broker import Broker
from app.client import Consumer, Producer, TopicPartition
from app.protocol import DescribeGroupsRequest, OffsetFetchRequest
from tests.helpers.txn_driver import read_values

ROOT = Path(__file__).resolve().parents[1]
PARTITIONS = 4


def setup_topics(db_url: str) -> None:
    admin = AdminClient({"database.url": db_url})
    for name in ("in", "out"):
        admin.create_topics([NewTopic(name, PARTITIONS)])[name].result()


def produce_input(db_url: str, start: int, end: int) -> None:
    """Input records ``start`` to ``end`` (excluded), record i to partition i % PARTITIONS."""
    with Producer({"database.url": db_url, "linger.ms": 20}) as producer:
        for i in range(start, end):
            p = i % PARTITIONS
            producer.produce("in", f"rec-{p}-{i}".encode(), partition=p)
            if i % 5000 == 0:
                producer.poll(0)
        assert producer.flush(120) == 0


def expected_output(records: int) -> dict[int, list[str]]:
    expected: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    for i in range(records):
        expected[i % PARTITIONS].append(f"REC-{i % PARTITIONS}-{i}")
    return expected


# Each copier's stderr, by pid: a file, not a pipe, which a copier left running while the
# test waits on something else could fill and block on.
_stderr: dict[int, IO[str]] = {}


def start_copier(db_url: str, transactional_id: str, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "KIP98_DATABASE_URL": db_url}
    log = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed by stderr_of
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.pipeline", "in", "out", "copiers", transactional_id, *extra],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log, text=True,
    )  # fmt: skip
    _stderr[proc.pid] = log
    return proc


def stderr_of(proc: subprocess.Popen[str]) -> str:
    """What an ended copier wrote on stderr."""
    log = _stderr.pop(proc.pid)
    log.seek(0)
    text = log.read()
    log.close()
    return text


def copied_or_ended(broker: Broker, proc: subprocess.Popen[str], records: int) -> bool:
    return proc.poll() is not None or copied(broker) >= records


def committed_offsets(db_url: str) -> dict[int, int]:
    with Consumer({"database.url": db_url, "group.id": "copiers"}) as c:
        got = c.committed([TopicPartition("in", p) for p in range(PARTITIONS)], timeout=30)
    return {tp.partition: tp.offset for tp in got}


def copied(broker: Broker) -> int:
    """Input records copied and committed: the group's committed offsets, added up."""
    committed = broker.handle(OffsetFetchRequest("copiers", None, False))
    return sum(max(om.offset, 0) for om in committed.offsets.values())


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.01)


def stop_once_all_copied(broker: Broker, copier: subprocess.Popen[str], records: int) -> None:
    """Wait for the copy to end (a hang guard only), then stop the copier as its
    operator would: SIGTERM, which it must obey cleanly."""
    wait_until(partial(copied_or_ended, broker, copier, records), "the copy")
    assert copier.poll() is None, stderr_of(copier)
    copier.send_signal(signal.SIGTERM)
    copier.wait(120)
    assert copier.returncode == 0, stderr_of(copier)


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
@pytest.mark.timeout(900)  # twenty copier starts: a hang guard for a loaded machine
def test_copy_is_exactly_once_across_sigkills(db_url: str) -> None:
    records = int(os.environ.get("KIP98_EOS_RECORDS", "100000"))
    kills = int(os.environ.get("KIP98_EOS_KILLS", "20"))
    setup_topics(db_url)
    broker = Broker.connect(db_url)
    # The input grows in kills + 1 steps. Each copier but the last is SIGKILLed as soon as
    # the copy has reached a random point inside the step produced before it started,
    # before the next step exists: every kill lands while there is work to do, wherever
    # the copier then is, on a machine of any speed.
    steps = [records * (k + 1) // (kills + 1) for k in range(kills + 1)]
    rng = random.Random(2024)
    for k in range(kills):
        step_start = steps[k - 1] if k else 0
        produce_input(db_url, step_start, steps[k])
        # Five lanes: the output's four partitions each on its own, the riskiest setting.
        proc = start_copier(db_url, "copier-0", "--max-in-flight", "5")
        kill_at = step_start + int(rng.uniform(0.1, 0.9) * (steps[k] - step_start))
        wait_until(partial(copied_or_ended, broker, proc, kill_at), f"{kill_at} copied")
        if proc.poll() is not None:
            pytest.fail(f"copier exited early: {stderr_of(proc)}")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        stderr_of(proc)
    produce_input(db_url, steps[kills - 1], records)
    stop_once_all_copied(broker, start_copier(db_url, "copier-0"), records)
    check_output(db_url, expected_output(records))


@pytest.mark.slow
def test_group_member_killed_mid_stream_loses_and_duplicates_nothing(db_url: str) -> None:
    records = 20_000
    setup_topics(db_url)
    broker = Broker.connect(db_url)
    a = start_copier(db_url, "copier-a", "--batch-size", "100")
    b = start_copier(db_url, "copier-b", "--batch-size", "100")
    try:
        # The input's first half comes once both hold partitions: had a been alone for
        # longer than it takes to copy it, b would have nothing to copy and never commit.
        wait_until(
            lambda: a.poll() is not None or b.poll() is not None or both_hold_partitions(broker),
            "both copiers holding partitions",
        )
        assert a.poll() is None and b.poll() is None, stderr_of(a if a.poll() is not None else b)
        produce_input(db_url, 0, records // 2)
        # b is killed once it has committed a transaction, before the second half of the
        # input exists: mid-stream, most likely inside its next transaction. a takes over
        # its partitions once b's session times out (6 s), from b's offsets as its open
        # transaction's timeout (10 s) left them, and copies everything.
        wait_until(lambda: b.poll() is not None or commits_of(broker, "copier-b") > 0, "b")
        assert b.poll() is None, stderr_of(b)
        b.send_signal(signal.SIGKILL)
        b.wait()
        produce_input(db_url, records // 2, records)
        stop_once_all_copied(broker, a, records)
    finally:
        for proc in (a, b):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    check_output(db_url, expected_output(records))


def both_hold_partitions(broker: Broker) -> bool:
    [group] = broker.handle(DescribeGroupsRequest(("copiers",))).groups
    holders = {m.client_id for m in group.members if m.partitions}
    return group.state == "Stable" and holders == {"copier-a-consumer", "copier-b-consumer"}


def commits_of(broker: Broker, transactional_id: str) -> int:
    with broker.engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM transaction_log "
                    "WHERE transactional_id = :t AND state = 'COMPLETE_COMMIT'"
                ),
                {"t": transactional_id},
            ).scalar_one()
        )
