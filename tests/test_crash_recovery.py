"""A process killed with SIGKILL at each step of a transaction: the outcome is always
all-or-nothing across partitions, and another process completes it without help
(docs/design.md rule 2; PREPARE durable ⇒ the transaction completes that way)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from app.broker import Broker
from app.broker.loop import CoordinatorLoop
from app.clock import SYSTEM_CLOCK, ManualClock
from app.coordinator import machines as m
from app.errors import KafkaError
from tests.helpers.txn_driver import TxnDriver, partition_offsets, read_values, state_of

ROOT = Path(__file__).resolve().parents[1]
PARTITIONS = (("a", 0), ("b", 1), ("c", 2))


pytestmark = pytest.mark.broker(topics={"a": 3, "b": 3, "c": 3})


def run_child(
    db_url: str,
    crash_at: str | None,
    tid: str = "crash",
    timeout_ms: int = 60_000,
    combined: bool = False,
) -> int:
    env = {**os.environ, "KIP98_DATABASE_URL": db_url}
    env.pop("KIP98_CRASH_AT", None)
    if crash_at:
        env["KIP98_CRASH_AT"] = crash_at
    proc = subprocess.run(
        [sys.executable, "-m", "tests.children.crash_child", tid, str(timeout_ms),
         "combined" if combined else "separate"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return proc.returncode


def committed_everywhere(broker: Broker, tid: str) -> bool:
    return all(read_values(broker, t, p) == [f"{tid}-{t}"] for t, p in PARTITIONS)


def nothing_visible(broker: Broker) -> bool:
    return all(read_values(broker, t, p) == [] for t, p in PARTITIONS)


def settled(broker: Broker) -> bool:
    return all(
        partition_offsets(broker, t, p)[0] == partition_offsets(broker, t, p)[1]
        for t, p in PARTITIONS
    )


def test_no_crash_commits(db_url: str, broker: Broker) -> None:
    assert run_child(db_url, None) == 0
    assert committed_everywhere(broker, "crash") and settled(broker)


@pytest.mark.parametrize(
    "crash_at",
    ["end_txn.after_prepare", "complete.after_marker", "complete.before_complete"],
)
def test_crash_after_prepare_commit_is_rolled_forward(
    db_url: str, broker: Broker, crash_at: str
) -> None:
    assert run_child(db_url, crash_at) == -signal.SIGKILL
    assert state_of(broker, "crash") == m.PREPARE_COMMIT
    assert nothing_visible(broker), "undecided data stays invisible to read_committed"
    assert CoordinatorLoop(broker).run_once().rolled_forward == 1
    assert state_of(broker, "crash") == m.COMPLETE_COMMIT
    assert committed_everywhere(broker, "crash") and settled(broker)


def test_crash_after_prepare_is_completed_by_the_next_instance(db_url: str, broker: Broker) -> None:
    assert run_child(db_url, "end_txn.after_prepare") == -signal.SIGKILL
    successor = TxnDriver(broker, "crash")
    assert successor.init() == 0
    assert committed_everywhere(broker, "crash") and settled(broker)


def test_combined_commit_without_crash_commits(db_url: str, broker: Broker) -> None:
    assert run_child(db_url, None, combined=True) == 0
    assert committed_everywhere(broker, "crash") and settled(broker)
    assert state_of(broker, "crash") == m.COMPLETE_COMMIT


@pytest.mark.parametrize(
    "crash_at",
    ["append.after_copy", "end_txn.after_prepare", "complete.after_marker",
     "complete.before_complete", "commit_request.before_commit"],
)  # fmt: skip
def test_crash_inside_a_combined_commit_leaves_nothing(
    db_url: str, broker: Broker, crash_at: str
) -> None:
    """The last batches, PREPARE, markers and COMPLETE are one DB transaction: killed
    anywhere inside it, none of it happened (the registration included), and the next
    instance starts clean. The markers, the events and the advance are queued until just
    before COMMIT, so the last point is the one where all of them ran on the server."""
    assert run_child(db_url, crash_at, combined=True) == -signal.SIGKILL
    assert state_of(broker, "crash") == m.EMPTY
    assert nothing_visible(broker) and settled(broker)
    successor = TxnDriver(broker, "crash")
    assert successor.init() == 0
    assert nothing_visible(broker) and settled(broker)


def test_crash_mid_append_aborts_by_fencing(db_url: str, broker: Broker) -> None:
    assert run_child(db_url, "append.after_copy") == -signal.SIGKILL
    assert state_of(broker, "crash") == m.BEGIN
    assert nothing_visible(broker)
    successor = TxnDriver(broker, "crash")
    assert successor.init() == 0
    assert state_of(broker, "crash") == m.EMPTY
    assert nothing_visible(broker) and settled(broker)


def test_crash_mid_transaction_is_aborted_by_the_timeout(db_url: str, broker: Broker) -> None:
    assert run_child(db_url, "append.after_copy", timeout_ms=1_000) == -signal.SIGKILL
    later = Broker(broker.engine, ManualClock(SYSTEM_CLOCK.now_ms() + 5_000), broker.settings)
    assert CoordinatorLoop(later).run_once().timed_out == 1
    assert state_of(broker, "crash") == m.COMPLETE_ABORT
    assert nothing_visible(broker) and settled(broker)


def test_zombie_paused_mid_transaction_cannot_write_into_the_next(
    db_url: str, broker: Broker
) -> None:
    """SIGSTOP a producer mid-transaction; a new instance takes over and runs its own
    transaction; SIGCONT the zombie: every late request is fenced, nothing of it commits."""
    env = {**os.environ, "KIP98_DATABASE_URL": db_url}
    env.pop("KIP98_CRASH_AT", None)
    zombie = subprocess.Popen(
        [sys.executable, "-m", "tests.children.zombie_child", "shared"],
        cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert zombie.stdout is not None and zombie.stdin is not None
    assert zombie.stdout.readline().strip() == "paused-here"
    zombie.send_signal(signal.SIGSTOP)
    successor = TxnDriver(broker, "shared")
    assert successor.init() == 0
    assert successor.send("a", 0, "successor").error_code == 0
    zombie.send_signal(signal.SIGCONT)
    zombie.stdin.write("go\n")
    zombie.stdin.flush()
    late, add, end = (int(x) for x in zombie.stdout.readline().split())
    zombie.wait(timeout=60)
    assert late == KafkaError.INVALID_PRODUCER_EPOCH
    assert add == KafkaError.PRODUCER_FENCED
    assert end == KafkaError.PRODUCER_FENCED
    assert successor.end(commit=True) == 0
    assert read_values(broker, "a", 0) == ["successor"]
