"""The admin and console commands through the installed ``kip98`` entry point: exit codes,
JSON that parses, Kafka's column names, one-line errors."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from typing import Any

from sqlalchemy import text

from app.broker import Broker
from app.client import Consumer, TopicPartition
from tests.helpers.cli_runner import KIP98_BIN
from tests.helpers.txn_driver import TxnDriver


def ok(*args: str, stdin: str | None = None) -> str:
    result = run(*args, stdin=stdin)
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result.stdout


def ok_json(*args: str) -> Any:
    return json.loads(ok(*args, "--output", "json"))


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``run_kip98`` with text on stdin (empty unless given, so nothing waits on a terminal)."""
    return subprocess.run(
        [str(KIP98_BIN), *args], input=stdin or "", capture_output=True, text=True, timeout=120
    )


def fails(*args: str, expect: str, stdin: str | None = None) -> str:
    """Asserts exit 1 and a single ``error: …`` line on stderr (no traceback)."""
    result = run(*args, stdin=stdin)
    assert result.returncode == 1, (args, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert expect in lines[0], lines[0]
    return lines[0]


def json_lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def table(stdout: str) -> tuple[list[str], list[list[str]]]:
    header, *rows = stdout.strip().splitlines()
    return header.split(), [row.split() for row in rows]


def test_topics_lifecycle_and_errors(db_url: str) -> None:
    created = ok("topics", "create", "t", "--partitions", "2", "-c", "retention.ms=5000")
    assert "Created topic t" in created
    listed = ok_json("topics", "list")
    assert listed == [{"topic": "t", "partitions": 2, "config": {"retention.ms": 5000}}]
    described = ok_json("topics", "describe", "t")
    assert [p["partition"] for p in described["partitions"]] == [0, 1]
    assert {p["last_stable_offset"] for p in described["partitions"]} == {0}
    header, rows = table(ok("topics", "describe", "t"))
    assert header == [
        "TOPIC",
        "PARTITION",
        "LOG-START-OFFSET",
        "HIGH-WATERMARK",
        "LSO",
        "OPEN-TRANSACTIONS",
    ]
    assert rows == [["t", "0", "0", "0", "0", "0"], ["t", "1", "0", "0", "0", "0"]]

    fails("topics", "describe", "nope", expect="UNKNOWN_TOPIC_OR_PARTITION")
    fails("topics", "create", "u", "--partitions", "0", expect="INVALID_PARTITIONS")
    fails("topics", "create", "t", expect="TOPIC_ALREADY_EXISTS")
    fails("topics", "create", "u", "--config", "novalue", expect="key=value")
    fails(
        "topics", "create", "u", "-c", "x.y=5", expect="INVALID_CONFIG: unknown topic config 'x.y'"
    )
    fails("topics", "create", "u", "-c", "cleanup.policy=shred", expect="cleanup.policy")
    fails("topics", "alter", "t", expect="nothing to change")
    fails("topics", "alter", "t", "-c", "retention.ms=-7", expect="INVALID_CONFIG")
    fails("topics", "alter", "nope", "-c", "retention.ms=1", expect="UNKNOWN_TOPIC_OR_PARTITION")
    fails("topics", "clean", "nope", expect="does not exist")
    altered = {
        e["name"]: e
        for e in ok_json("topics", "alter", "t", "-c", "cleanup.policy=compact", "--delete-config", "retention.ms")
    }  # fmt: skip
    assert altered["cleanup.policy"] == {
        "name": "cleanup.policy",
        "value": "compact",
        "source": "DYNAMIC_TOPIC_CONFIG",
    }
    assert altered["retention.ms"]["source"] == "DEFAULT_CONFIG"
    assert ok_json("topics", "list")[0]["config"] == {"cleanup.policy": "compact"}
    bad_output = run("topics", "list", "--output", "xml")
    assert bad_output.returncode == 2
    assert "Traceback" not in bad_output.stderr and "--output" in bad_output.stderr

    assert "Deleted topic t" in ok("topics", "delete", "t")
    assert ok_json("topics", "list") == []
    fails("topics", "delete", "t", expect="UNKNOWN_TOPIC_OR_PARTITION")


def test_produce_consume_round_trip(db_url: str) -> None:
    ok("topics", "create", "t", "--partitions", "2")
    produced = run("produce", "--topic", "t", "--key-separator", ":", stdin="k1:v1\nk2:v2\nk3:v3\n")
    assert produced.returncode == 0, produced.stderr
    assert "3 record(s) produced, 0 error(s)" in produced.stderr
    txn = run("produce", "-t", "t", "-p", "1", "--transactional-id", "console", stdin="a\nb\n")
    assert txn.returncode == 0, txn.stderr
    assert "transaction committed" in txn.stderr

    # Consumers given a count stop at it; their --timeout (idle seconds) is a hang guard.
    records = json_lines(
        ok("consume", "--topic", "t", "--from-beginning", "--max-messages", "5", "-o", "json",
           "--timeout", "60")
    )  # fmt: skip
    assert sorted((r["key"] or "-", r["value"]) for r in records) == [
        ("-", "a"),
        ("-", "b"),
        ("k1", "v1"),
        ("k2", "v2"),
        ("k3", "v3"),
    ]
    assert all({"partition", "offset"} <= r.keys() for r in records)
    on_1 = str(sum(r["partition"] == 1 for r in records))
    plain = ok("consume", "-t", "t", "--from-beginning", "--max-messages", on_1, "-p", "1",
               "--timeout", "60")  # fmt: skip
    assert plain.splitlines()[-2:] == ["a", "b"]
    # Without --from-beginning a consumer starts at the end: nothing to print.
    assert ok("consume", "--topic", "t", "--timeout", "0.3") == ""

    # A consumer does not create a missing topic (a producer does: test_cli_console.py).
    fails("consume", "--topic", "nope", expect="UNKNOWN_TOPIC_OR_PARTITION")
    fails("produce", "-t", "t", "-p", "5", expect="partition 5 does not exist", stdin="x\n")
    missing_key = run("produce", "-t", "t", "--key-separator", ":", stdin="ok:1\nnokey\n")
    assert missing_key.returncode == 1
    assert "1 record(s) produced, 1 error(s)" in missing_key.stderr
    assert "Traceback" not in missing_key.stderr


def test_topics_clean_compacts_now_and_reports(db_url: str) -> None:
    ok("topics", "create", "c", "-c", "cleanup.policy=compact")
    produced = run("produce", "-t", "c", "--key-separator", ":", stdin="a:1\nb:1\na:2\na:3\n")
    assert produced.returncode == 0, produced.stderr
    [result] = ok_json("topics", "clean", "c")
    assert result["partition"] == 0 and result["records_removed"] == 2
    assert result["examined"] == 4 and result["cleaned_up_to"] == 4
    header, rows = table(ok("topics", "clean", "c"))
    assert header[:3] == ["PARTITION", "LOG-START-OFFSET", "CLEANED-UP-TO"]
    assert rows[0][-2] == "0"  # nothing more to remove
    consumed = run(
        "consume", "-t", "c", "--from-beginning", "--max-messages", "2", "--print-key",
        "--timeout", "60",
    )  # fmt: skip
    assert consumed.stdout.splitlines() == ["b\t1", "a\t3"]


def test_transactions_list_and_describe_after_a_producer(db_url: str) -> None:
    ok("topics", "create", "t", "--partitions", "2")
    ok("produce", "-t", "t", "-p", "0", "--transactional-id", "app-1", stdin="x\ny\n")

    header, rows = table(ok("transactions", "list"))
    assert header == ["TransactionalId", "Coordinator", "ProducerId", "TransactionState"]
    # The table names states as kafka-transactions.sh does; JSON as the KIP does.
    assert rows[0][0:2] == ["app-1", "0"] and rows[0][3] == "CompleteCommit"
    (listed,) = ok_json("transactions", "list")
    assert listed["transaction_state"] == "COMPLETE_COMMIT"
    assert ok_json("transactions", "list", "--state", "BEGIN") == []
    assert ok_json("transactions", "list", "--state", "CompleteCommit") == [listed]

    described = ok_json("transactions", "describe", "--transactional-id", "app-1")
    assert described["transactional_id"] == "app-1"
    assert described["producer_id"] == listed["producer_id"]
    assert described["transaction_state"] == "COMPLETE_COMMIT"
    assert described["coordinator_id"] == 0
    header, described_rows = table(ok("transactions", "describe", "app-1"))
    assert described_rows[0][4] == "CompleteCommit"
    assert header == [
        "CoordinatorId",
        "TransactionalId",
        "ProducerId",
        "ProducerEpoch",
        "TransactionState",
        "TransactionTimeoutMs",
        "CurrentTransactionStartTimeMs",
        "TransactionDurationMs",
        "TopicPartitions",
    ]
    fails("transactions", "describe", "--transactional-id", "nope", expect="TRANSACTIONAL_ID")

    (producer,) = ok_json("transactions", "describe-producers", "--topic", "t", "--partition", "0")
    assert producer["producer_id"] == listed["producer_id"]
    # The commit marker carries the epoch bumped for the next transaction (KIP-890).
    assert producer["producer_epoch"] == described["producer_epoch"]
    assert producer["current_transaction_start_offset"] == -1
    header, _ = table(ok("transactions", "describe-producers", "--topic", "t", "--partition", "0"))
    assert header == [
        "ProducerId",
        "ProducerEpoch",
        "LatestCoordinatorEpoch",
        "LastSequence",
        "LastTimestamp",
        "CurrentTransactionStartOffset",
    ]
    fails(
        "transactions", "describe-producers", "--topic", "t", "--partition", "7",
        expect="UNKNOWN_TOPIC_OR_PARTITION",
    )  # fmt: skip


def test_find_hanging_then_abort_moves_the_lso(db_url: str) -> None:
    ok("topics", "create", "t", "--partitions", "2")
    broker = Broker.connect(db_url)
    # Timeouts no run of this test can outlast; stuck's start is moved back past its own.
    stuck = TxnDriver(broker, "stuck", timeout_ms=600_000)
    assert stuck.init() == 0
    assert stuck.send("t", 0, "s1", "s2").error_code == 0
    young = TxnDriver(broker, "young", timeout_ms=900_000)
    assert young.init() == 0
    assert young.send("t", 1, "y").error_code == 0

    assert ok_json("transactions", "find-hanging") == []
    # Kafka's --max-transaction-timeout (minutes) also reports transactions open longer.
    long_open = ok_json("transactions", "find-hanging", "--max-transaction-timeout", "0")
    assert [(h["topic"], h["partition"]) for h in long_open] == [("t", 0), ("t", 1)]

    # Past its timeout while no coordinator loop runs: it hangs and pins the LSO.
    with broker.engine.begin() as conn:
        conn.execute(
            text("UPDATE transactions SET txn_start_ms = txn_start_ms - 700000 WHERE transactional_id = 'stuck'")
        )  # fmt: skip
        # Its records' age is what find-hanging shows: from its first record's timestamp.
        started_ms = conn.execute(
            text("SELECT \"timestamp\" FROM records WHERE topic = 't' AND partition = 0 AND \"offset\" = 0")
        ).scalar_one()  # fmt: skip
    header, _ = table(ok("transactions", "find-hanging"))
    assert header == [
        "Topic",
        "Partition",
        "ProducerId",
        "ProducerEpoch",
        "CoordinatorEpoch",
        "StartOffset",
        "LastTimestamp",
        "Duration(min)",
    ]
    before_ms = time.time() * 1000
    (hanging,) = ok_json("transactions", "find-hanging", "--topic", "t", "--partition", "0")
    after_ms = time.time() * 1000
    assert hanging["producer_id"] == stuck.producer_id
    assert hanging["start_offset"] == 0
    # Whole minutes since the start, as the command saw the clock while it ran.
    assert (before_ms - started_ms - 1) // 60_000 <= hanging["duration_min"]
    assert hanging["duration_min"] <= (after_ms - started_ms + 1) // 60_000
    assert isinstance(hanging["last_timestamp"], int)
    open_ids = ok_json("transactions", "list", "--state", "BEGIN", "--state", "PREPARE_ABORT")
    assert [t["transactional_id"] for t in open_ids] == ["stuck", "young"]
    described = ok_json("transactions", "describe", "--transactional-id", "stuck")
    assert described["transaction_state"] == "BEGIN"
    assert described["topic_partitions"] == [{"topic": "t", "partition": 0}]
    _, rows = table(ok("transactions", "describe", "stuck"))
    assert rows[0][4] == "Ongoing" and rows[0][-1] == "t-0"
    _, rows = table(ok("transactions", "list", "--state", "Ongoing"))
    assert [(r[0], r[3]) for r in rows] == [("stuck", "Ongoing"), ("young", "Ongoing")]
    assert described["transaction_duration_ms"] >= 10_000
    partitions = ok_json("topics", "describe", "t")["partitions"]
    assert (partitions[0]["high_watermark"], partitions[0]["last_stable_offset"]) == (2, 0)
    assert partitions[0]["open_transactions"] == 1
    # read_uncommitted readers see the open records, read_committed readers do not.
    committed = ok("consume", "-t", "t", "-p", "0", "--from-beginning", "--timeout", "0.3")
    uncommitted = ok(
        "consume", "-t", "t", "-p", "0", "--from-beginning", "--max-messages", "2",
        "--timeout", "60", "--isolation", "read_uncommitted",
    )  # fmt: skip
    assert (committed, uncommitted) == ("", "s1\ns2\n")

    aborted = ok("transactions", "abort", "--topic", "t", "--partition", "0", "--start-offset", "0")
    assert "Aborted" in aborted
    partitions = ok_json("topics", "describe", "t")["partitions"]
    assert (partitions[0]["high_watermark"], partitions[0]["last_stable_offset"]) == (3, 3)
    assert ok_json("transactions", "find-hanging") == []
    fails(
        "transactions", "abort", "--topic", "t", "--partition", "0", "--start-offset", "0",
        expect="INVALID_TXN_STATE",
    )  # fmt: skip

    # The coordinator still holds 'stuck' in BEGIN past its timeout: one pass times it out.
    once = ok_json("coordinator", "run", "--once")
    assert once["timed_out"] == 1 and once["leases"] == 16
    assert (
        ok_json("transactions", "describe", "--transactional-id", "stuck")["transaction_state"]
        == "COMPLETE_ABORT"
    )
    header, rows = table(ok("coordinator", "run", "--once"))
    assert header[:3] == ["LEASES", "TIMED-OUT", "ROLLED-FORWARD"]
    assert rows[0][:2] == ["16", "0"]


def test_groups_describe_agrees_with_committed_offsets(db_url: str) -> None:
    ok("topics", "create", "t", "--partitions", "2")
    ok("produce", "-t", "t", "-p", "0", stdin="a\nb\nc\n")
    ok("produce", "-t", "t", "-p", "1", stdin="d\n")
    with Consumer({"group.id": "g", "database.url": db_url}) as consumer:
        consumer.commit(offsets=[TopicPartition("t", 0, 1)], asynchronous=False)
        committed = consumer.committed([TopicPartition("t", 0), TopicPartition("t", 1)])

    rows = ok_json("groups", "describe", "g")
    assert [(r["topic"], r["partition"], r["current_offset"]) for r in rows] == [
        (tp.topic, tp.partition, tp.offset) for tp in committed if tp.offset >= 0
    ]
    assert (rows[0]["log_end_offset"], rows[0]["lag"]) == (3, 2)
    header, table_rows = table(ok("groups", "describe", "g"))
    assert header[:7] == [
        "GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LSO", "LAG",
    ]  # fmt: skip
    assert table_rows[0][:7] == ["g", "t", "0", "1", "3", "3", "2"]
    assert rows[0]["last_stable_offset"] == 3

    # A console consumer in a group commits where it stopped.
    ok("consume", "-t", "t", "--group", "g2", "--from-beginning", "--max-messages", "4",
       "--timeout", "60")  # fmt: skip
    lag = {
        (r["partition"], r["current_offset"], r["lag"]) for r in ok_json("groups", "describe", "g2")
    }
    assert lag == {(0, 3, 0), (1, 1, 0)}
    assert {r["group_id"] for r in ok_json("groups", "list")} == {"g", "g2"}
    fails("groups", "describe", "nope", expect="does not exist")


def test_coordinator_run_stops_cleanly_on_sigterm(db_url: str) -> None:
    proc = subprocess.Popen(
        [str(KIP98_BIN), "coordinator", "run", "--interval-ms", "100"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert "holding 16 of 16 transaction-log partitions" in first
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "coordinator stopped after" in out and "leases released" in out
    assert "Traceback" not in err
    broker = Broker.connect(db_url)
    with broker.engine.connect() as conn:
        held = conn.execute(text("SELECT count(*) FROM coordinator_leases WHERE expires_ms > 0"))
        assert held.scalar() == 0
