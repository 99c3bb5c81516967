"""The console producer and consumer as a new user meets them: a missing topic is created by
a producer as Kafka's producers have it created (the broker's one decision), never by a
consumer; output into a pipe closed early ends quietly; names are positional, the old
options still accepted."""

from __future__ import annotations

import os
import subprocess

from app.broker import Broker
from app.log.topics import list_topics
from tests.helpers.cli_runner import KIP98_BIN
from tests.test_cli_admin import fails, ok, run


def _topics(db_url: str) -> dict[str, int]:
    return {t.topic: t.num_partitions for t in list_topics(Broker.connect(db_url))}


def test_produce_creates_a_missing_topic_as_the_broker_allows(db_url: str) -> None:
    produced = subprocess.run(
        [str(KIP98_BIN), "produce", "fresh"],
        input="a\nb\n",
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "KIP98_NUM_PARTITIONS": "3"},
    )
    assert produced.returncode == 0, produced.stderr
    assert "2 record(s) produced, 0 error(s)" in produced.stderr
    assert _topics(db_url) == {"fresh": 3}
    # A transactional console producer too, and to a partition of the topic it made.
    ok("produce", "made-in-txn", "-p", "0", "--transactional-id", "tx", stdin="c\n")
    assert _topics(db_url)["made-in-txn"] == 1
    values = ok("consume", "fresh", "--from-beginning", "--max-messages", "2", "--timeout", "60")
    assert sorted(values.split()) == ["a", "b"]


def test_produce_to_a_missing_topic_fails_where_the_broker_does_not_auto_create(
    db_url: str,
) -> None:
    env = {**os.environ, "KIP98_AUTO_CREATE_TOPICS": "false"}
    refused = subprocess.run(
        [str(KIP98_BIN), "produce", "never"],
        input="x\n",
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: UNKNOWN_TOPIC_OR_PARTITION"), refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert "never" not in _topics(db_url)


def test_produce_names_why_a_topic_cannot_be(db_url: str) -> None:
    fails("produce", "bad name", expect="INVALID_TOPIC_EXCEPTION: topic 'bad name'", stdin="x\n")
    assert _topics(db_url) == {}


def test_consume_never_creates(db_url: str) -> None:
    fails("consume", "absent", "--timeout", "0.3", expect="UNKNOWN_TOPIC_OR_PARTITION")
    assert "absent" not in _topics(db_url)


def test_a_closed_pipe_ends_quietly(db_url: str) -> None:
    ok("topics", "create", "many")
    # Far more than a pipe holds (64 KiB), so kip98 is still writing when head has gone.
    pad = "x" * 200
    ok("produce", "many", stdin="".join(f"v{i}{pad}\n" for i in range(5000)))
    # A real shell pipe: head reads one line and exits while kip98 is still writing.
    piped = subprocess.run(
        f"'{KIP98_BIN}' consume many --from-beginning --timeout 60 | head -1; "
        'echo "status=${PIPESTATUS[0]}" >&2',
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert piped.stdout == f"v0{pad}\n"
    assert piped.stderr.strip().splitlines()[-1] == "status=141", piped.stderr
    assert "Traceback" not in piped.stderr and "BrokenPipe" not in piped.stderr
    assert "error" not in piped.stderr, piped.stderr
    # A table (rich) into a closed pipe, too: far more than a pipe's buffer.
    table = subprocess.run(
        f"'{KIP98_BIN}' consume many --from-beginning --max-messages 5000 -o table "
        '--timeout 60 | head -1; echo "status=${PIPESTATUS[0]}" >&2',
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert table.stdout.split() == ["PARTITION", "OFFSET", "KEY", "VALUE"]
    assert table.stderr.strip().splitlines()[-1] in ("status=141", "status=0"), table.stderr
    assert "Traceback" not in table.stderr and "error" not in table.stderr, table.stderr


def test_names_are_positional_and_the_old_options_still_work(db_url: str) -> None:
    ok("topics", "create", "t")
    assert "1 record(s) produced" in run("produce", "--topic", "t", stdin="old\n").stderr
    assert "1 record(s) produced" in run("produce", "-t", "t", stdin="older\n").stderr
    new = ok("consume", "t", "--from-beginning", "--max-messages", "2", "--timeout", "60")
    old = ok("consume", "-t", "t", "--from-beginning", "--max-messages", "2", "--timeout", "60")
    assert new == old == "old\nolder\n"
    fails("produce", "t", "--topic", "t", expect="give TOPIC or --topic, not both", stdin="x\n")
    fails("consume", expect="missing TOPIC")
    ok("produce", "t", "-p", "0", "--transactional-id", "app", stdin="y\n")
    assert ok("transactions", "describe", "app", "-o", "json") == ok(
        "transactions", "describe", "--transactional-id", "app", "-o", "json"
    )
    fails("transactions", "describe", expect="missing TRANSACTIONAL_ID")
    fails(
        "transactions", "describe", "app", "--transactional-id", "app",
        expect="not both",
    )  # fmt: skip
    described = ok("transactions", "describe-producers", "t", "--partition", "0", "-o", "json")
    assert described == ok(
        "transactions", "describe-producers", "--topic", "t", "--partition", "0", "-o", "json"
    )
    help_text = ok("produce", "--help")
    assert "TOPIC" in help_text and "--topic" not in help_text
