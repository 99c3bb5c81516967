"""A ``kip98 topics clean`` process killed with SIGKILL at each step of a pass: the log
stays consistent (projections rebuild to the live tables, no aborted record visible, the
latest committed value of every key unchanged), and the next pass ends exactly where an
uninterrupted pass ends."""

from __future__ import annotations

import signal
from typing import Any

import pytest
from sqlalchemy import text

from app.broker import Broker
from app.clock import SYSTEM_CLOCK
from app.log.topics import create_topic
from app.protocol import RecordIn
from app.settings import BrokerSettings
from tests.helpers.cli_runner import run_kip98
from tests.helpers.txn_driver import TxnDriver
from tests.test_cleaner import assert_rebuild_equals_live, idempotent, latest_by_key, read

CONFIG = {"cleanup.policy": "delete,compact", "retention.ms": 3_600_000, "delete.retention.ms": 0}
OLD = 1_000  # a 1970 timestamp: retention removes these


def workload(broker: Broker, topic: str) -> None:
    """Old records (for retention), then keyed updates, aborted and committed
    transactions and tombstones (for compaction)."""
    create_topic(broker, topic, 1, CONFIG)
    old = [RecordIn(f"k{i % 7}".encode(), f"old{i}".encode(), OLD) for i in range(50)]
    for n in range(5):
        idempotent(broker, topic, 7000, n * 10, old[n * 10 : n * 10 + 10])
    d = TxnDriver(broker, f"{topic}-txn")
    assert d.init() == 0
    for i in range(12):
        recs = [RecordIn(f"k{(i + j) % 5}".encode(), f"v{i}-{j}".encode(), 0) for j in range(4)]
        if i % 4 == 3:
            recs.append(RecordIn(b"k1", None, 0))
        assert d.send_records(topic, 0, recs).error_code == 0
        assert d.end(commit=i % 3 != 1) == 0


def log_of(broker: Broker, topic: str) -> list[tuple[Any, ...]]:
    with broker.engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                text(
                    'SELECT "offset", key, value, is_control FROM records WHERE topic = :t '
                    'AND "offset" >= (SELECT log_start_offset FROM partitions WHERE topic = :t '
                    'AND partition = 0) ORDER BY "offset"'
                ),
                {"t": topic},
            )
        ]


@pytest.mark.parametrize(
    "point",
    [
        "cleaner.after_snapshot",
        "cleaner.after_log_start",
        "cleaner.between_slices",
        "cleaner.mid_compaction",
    ],
)
def test_a_cleaner_killed_anywhere_leaves_a_consistent_log(db_url: str, point: str) -> None:
    broker = Broker.connect(db_url, clock=SYSTEM_CLOCK, settings=BrokerSettings())
    workload(broker, "control")
    for _ in range(3):  # the third pass finds nothing left to do
        assert run_kip98("topics", "clean", "control").returncode == 0
    expected_log = log_of(broker, "control")
    cleaned = latest_by_key(read(broker, "control"))

    workload(broker, "victim")
    before = latest_by_key(read(broker, "victim"))
    killed = run_kip98(
        "topics",
        "clean",
        "victim",
        env={"KIP98_CRASH_AT": point, "KIP98_LOG_CLEANER_DELETE_SLICE": "10"},
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # As before the pass, or as after its retention step: never anything in between.
    assert latest_by_key(read(broker, "victim")) in (before, cleaned)
    aborted = (b"v1-", b"v4-", b"v7-", b"v10-")
    assert not any(r.value.startswith(aborted) for r in read(broker, "victim") if r.value)
    assert_rebuild_equals_live(broker, SYSTEM_CLOCK)

    for _ in range(3):
        assert run_kip98("topics", "clean", "victim").returncode == 0
    assert latest_by_key(read(broker, "victim")) == cleaned != before
    assert [r[1:] for r in log_of(broker, "victim")] == [r[1:] for r in expected_log]
    assert [r[0] for r in log_of(broker, "victim")] == [r[0] for r in expected_log]
    assert_rebuild_equals_live(broker, SYSTEM_CLOCK)
