"""``kip98 transactions``: kafka-transactions.sh, with its column names.

Kafka's names are kept so runbooks written for Kafka read the same here. There is one
coordinator (the database), so the coordinator id is always 0; ``find-hanging`` and
``abort`` are the way out when a partition's LSO is stuck behind a transaction nobody
will finish (docs/design.md rule 10).

States are named as Kafka names them in the tables (Ongoing, CompleteCommit, ...), as
kafka-transactions.sh shows them; the JSON and the SQL views keep the KIP's names (BEGIN,
COMPLETE_COMMIT, ...), the coordinator's own. ``--state`` takes either.
"""

from __future__ import annotations

import time
from typing import Any

import click

from app.admin import AdminClient
from app.cli.errors import CliError
from app.cli.names import name_argument, topic_option
from app.cli.output import emit, output_option
from app.client import TopicPartition
from app.coordinator.inspect import TransactionDescription
from app.coordinator.machines import OPEN_STATES, TXN_STATES
from app.log.inspect import HangingTransaction, ProducerDescription
from app.protocol import KAFKA_STATES, STATES_BY_KAFKA_NAME

COORDINATOR_ID = 0

LIST_HEADERS = {
    "transactional_id": "TransactionalId",
    "coordinator": "Coordinator",
    "producer_id": "ProducerId",
    "transaction_state": "TransactionState",
}
DESCRIBE_HEADERS = {
    "coordinator_id": "CoordinatorId",
    "transactional_id": "TransactionalId",
    "producer_id": "ProducerId",
    "producer_epoch": "ProducerEpoch",
    "transaction_state": "TransactionState",
    "transaction_timeout_ms": "TransactionTimeoutMs",
    "current_transaction_start_time_ms": "CurrentTransactionStartTimeMs",
    "transaction_duration_ms": "TransactionDurationMs",
    "topic_partitions": "TopicPartitions",
}
PRODUCER_HEADERS = {
    "producer_id": "ProducerId",
    "producer_epoch": "ProducerEpoch",
    "latest_coordinator_epoch": "LatestCoordinatorEpoch",
    "last_sequence": "LastSequence",
    "last_timestamp": "LastTimestamp",
    "current_transaction_start_offset": "CurrentTransactionStartOffset",
}
HANGING_HEADERS = {
    "topic": "Topic",
    "partition": "Partition",
    "producer_id": "ProducerId",
    "producer_epoch": "ProducerEpoch",
    "coordinator_epoch": "CoordinatorEpoch",
    "start_offset": "StartOffset",
    "last_timestamp": "LastTimestamp",
    "duration_min": "Duration(min)",
}


def _now_ms() -> int:
    return int(time.time() * 1000)


def _for_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Kafka's state names for people; JSON keeps the KIP's, as the SQL views do."""
    return [
        {
            **row,
            "transaction_state": KAFKA_STATES.get(
                row["transaction_state"], row["transaction_state"]
            ),
        }
        for row in rows
    ]


def _describe_row(d: TransactionDescription, now_ms: int) -> dict[str, Any]:
    is_open = d.state in OPEN_STATES
    return {
        "coordinator_id": COORDINATOR_ID,
        "transactional_id": d.transactional_id,
        "producer_id": d.producer_id,
        "producer_epoch": d.producer_epoch,
        "transaction_state": d.state,
        "transaction_timeout_ms": d.timeout_ms,
        "current_transaction_start_time_ms": d.txn_start_ms if is_open else None,
        "transaction_duration_ms": max(now_ms - d.txn_start_ms, 0) if is_open else None,
        "topic_partitions": [{"topic": t, "partition": p} for t, p in d.partitions],
    }


def _producer_row(p: ProducerDescription) -> dict[str, Any]:
    return {
        "producer_id": p.producer_id,
        "producer_epoch": p.producer_epoch,
        "latest_coordinator_epoch": p.coordinator_epoch,
        "last_sequence": p.last_sequence,
        "last_timestamp": p.last_timestamp,
        "current_transaction_start_offset": p.current_transaction_start_offset,
    }


def _hanging_row(
    h: HangingTransaction, producers: dict[int, ProducerDescription], now_ms: int
) -> dict[str, Any]:
    state = producers.get(h.producer_id)
    started_ms = None if h.started_at is None else int(h.started_at.timestamp() * 1000)
    return {
        "topic": h.topic,
        "partition": h.partition,
        "producer_id": h.producer_id,
        "producer_epoch": h.producer_epoch,
        "coordinator_epoch": None if state is None else state.coordinator_epoch,
        "start_offset": h.start_offset,
        "last_timestamp": None if state is None else state.last_timestamp,
        "duration_min": None if started_ms is None else max(now_ms - started_ms, 0) // 60_000,
    }


@click.group("transactions")
def transactions_group() -> None:
    """Inspect transactions; find and abort hanging ones."""


@transactions_group.command("list")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice([*KAFKA_STATES.values(), *TXN_STATES]),
    help="Only transactional ids in this state (repeatable; Kafka's name or the KIP's).",
)
@output_option
def list_(states: tuple[str, ...], output: str) -> None:
    """Every transactional id the coordinator knows. The table names states as Kafka does
    (Ongoing, CompleteCommit, ...); JSON as the KIP and the SQL views do (BEGIN,
    COMPLETE_COMMIT, ...)."""
    wanted = sorted({STATES_BY_KAFKA_NAME.get(s, s) for s in states})
    with AdminClient() as admin:
        found = admin.list_transactions(wanted or None)
    rows = [
        {
            "transactional_id": d.transactional_id,
            "coordinator": COORDINATOR_ID,
            "producer_id": d.producer_id,
            "transaction_state": d.state,
        }
        for d in found
    ]
    if output == "table":
        rows = _for_table(rows)
    emit(rows, output, columns=list(LIST_HEADERS), headers=LIST_HEADERS)


@transactions_group.command()
@click.argument("id_arg", metavar="TRANSACTIONAL_ID", required=False)
@click.option("--transactional-id", "transactional_id", default=None, hidden=True)
@output_option
def describe(id_arg: str | None, transactional_id: str | None, output: str) -> None:
    """The state of TRANSACTIONAL_ID and its current transaction (the table names the
    state as Kafka does, JSON as the KIP does)."""
    tid = name_argument(id_arg, transactional_id, "TRANSACTIONAL_ID", "--transactional-id")
    with AdminClient() as admin:
        found = admin.describe_transactions([tid])
    row = _describe_row(found[tid], _now_ms())
    if output == "table":
        [row] = _for_table([row])
        row["topic_partitions"] = ",".join(
            f"{tp['topic']}-{tp['partition']}" for tp in row["topic_partitions"]
        )
    emit([row] if output == "table" else row, output, list(DESCRIBE_HEADERS), DESCRIBE_HEADERS)


@transactions_group.command("describe-producers")
@click.argument("topic_arg", metavar="TOPIC", required=False)
@topic_option
@click.option("--partition", "-p", type=int, required=True)
@output_option
def describe_producers(
    topic_arg: str | None, topic: str | None, partition: int, output: str
) -> None:
    """Producer state kept by one partition of TOPIC: sequences, epochs, open transaction."""
    topic = name_argument(topic_arg, topic, "TOPIC", "--topic")
    tp = TopicPartition(topic, partition)
    with AdminClient() as admin:
        producers = admin.describe_producers([tp])[tp]
    rows = [_producer_row(p) for p in producers]
    emit(rows, output, columns=list(PRODUCER_HEADERS), headers=PRODUCER_HEADERS)


@transactions_group.command("find-hanging")
@click.option(
    "--max-transaction-timeout",
    "max_timeout_min",
    type=click.IntRange(min=0),
    default=None,
    help="Also report transactions open longer than this many minutes.",
)
@click.option("--topic", default=None, help="Only this topic.")
@click.option("--partition", type=int, default=None, help="Only this partition (with --topic).")
@output_option
def find_hanging(
    max_timeout_min: int | None, topic: str | None, partition: int | None, output: str
) -> None:
    """Transactions open on a partition that no live coordinator transaction covers, or
    open past their timeout."""
    if partition is not None and topic is None:
        raise CliError("--partition needs --topic")
    max_ms = None if max_timeout_min is None else max_timeout_min * 60_000
    now = _now_ms()
    with AdminClient() as admin:
        hanging = [
            h
            for h in admin.find_hanging_transactions(max_ms)
            if (topic is None or h.topic == topic)
            and (partition is None or h.partition == partition)
        ]
        tps = sorted({TopicPartition(h.topic, h.partition) for h in hanging})
        producers = admin.describe_producers(tps) if tps else {}
    by_partition = {
        (tp.topic, tp.partition): {p.producer_id: p for p in found}
        for tp, found in producers.items()
    }
    rows = [_hanging_row(h, by_partition.get((h.topic, h.partition), {}), now) for h in hanging]
    emit(rows, output, columns=list(HANGING_HEADERS), headers=HANGING_HEADERS)


@transactions_group.command()
@click.argument("topic_arg", metavar="TOPIC", required=False)
@topic_option
@click.option("--partition", "-p", type=int, required=True)
@click.option("--start-offset", type=int, required=True, help="Where the transaction begins.")
def abort(topic_arg: str | None, topic: str | None, partition: int, start_offset: int) -> None:
    """Write an abort marker for the transaction that starts at START_OFFSET on a partition
    of TOPIC."""
    topic = name_argument(topic_arg, topic, "TOPIC", "--topic")
    with AdminClient() as admin:
        written = admin.abort_transaction(topic, partition, start_offset)
    if written:
        click.echo(f"Aborted the transaction at offset {start_offset} of {topic}-{partition}.")
    else:
        click.echo(
            f"The transaction at offset {start_offset} of {topic}-{partition} was already closed."
        )
