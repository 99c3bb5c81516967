"""``kip98 produce`` / ``kip98 consume``: the console producer and consumer.

They behave like kafka-console-producer/-consumer so shell pipelines carry over: one record
per stdin line in, one value per stdout line out, diagnostics on stderr. The consumer stops
after ``--timeout`` idle seconds by default, because a tool that waits forever for data
that never comes is the wrong default for scripts.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from typing import IO, Any

import click

from app.broker import Broker
from app.cli.errors import CliError, one_line
from app.cli.names import name_argument, topic_option
from app.cli.output import emit, output_choice
from app.client import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from app.protocol import MetadataRequest

CONSUME_FORMATS = ("plain", "table", "json")


def _check_partition(topic: str, partition: int | None, *, producing: bool = False) -> int:
    """The topic's partition count, failing early (one line) on an unknown topic or
    partition rather than once per record. A producer's Metadata asks for a missing topic
    to be created, as a Kafka producer's does (allow_auto_topic_creation); whether it is
    made is the broker's one decision (``app.log.topics.metadata``: KIP98_AUTO_CREATE_TOPICS,
    KIP98_NUM_PARTITIONS, the principal's Create). A consumer never creates, as Kafka's
    consumers do not by default (allow.auto.create.topics=false)."""
    request = MetadataRequest([topic], allow_auto_topic_creation=producing)
    [found] = Broker.connect().handle(request).topics
    if found.error_code == KafkaError.UNKNOWN_TOPIC_OR_PARTITION:
        raise KafkaException(KafkaError(found.error_code, f"topic {topic!r} does not exist"))
    if found.error_code != KafkaError.NO_ERROR:  # an illegal name, a refused Create, ...
        why = found.error_message or KafkaError(found.error_code).str()
        raise KafkaException(KafkaError(found.error_code, f"topic {topic!r}: {why}"))
    count = found.num_partitions
    if partition is not None and not 0 <= partition < count:
        raise CliError(f"partition {partition} does not exist: {topic!r} has {count} partition(s)")
    return count


class _Tally:
    """Delivery reports, counted; the first failure is kept to explain the exit status."""

    def __init__(self) -> None:
        self.delivered = 0
        self.failed = 0
        self.first_error: str | None = None

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            self.delivered += 1
            return
        self.failed += 1
        if self.first_error is None:
            self.first_error = f"{err.name()}: {one_line(err.str())}"


def _split(line: str, separator: str | None) -> tuple[str | None, str]:
    if separator is None:
        return None, line
    key, sep, value = line.partition(separator)
    if not sep:
        raise ValueError(f"no key separator {separator!r} found on line")
    return key, value


def _produce_lines(
    producer: Producer,
    lines: IO[str],
    topic: str,
    partition: int,
    separator: str | None,
    tally: _Tally,
) -> int:
    """Queue every line; returns how many lines were rejected before being queued."""
    rejected = 0
    for number, raw in enumerate(lines, start=1):
        line = raw.rstrip("\r\n")
        try:
            key, value = _split(line, separator)
        except ValueError as exc:
            rejected += 1
            click.echo(f"line {number}: {exc}", err=True)
            continue
        while True:
            try:
                producer.produce(
                    topic, value=value, key=key, partition=partition, on_delivery=tally
                )
                break
            except BufferError:  # the local queue is full: let the sender catch up
                producer.poll(0.1)
        producer.poll(0)
    return rejected


@click.command()
@click.argument("topic_arg", metavar="TOPIC", required=False)
@topic_option
@click.option(
    "--key-separator", default=None, help="Split each line at its first SEP into key and value."
)
@click.option("--partition", "-p", type=int, default=None, help="Write every record here.")
@click.option(
    "--transactional-id",
    default=None,
    help="Write all lines in one transaction, committed only if every record is delivered.",
)
def produce(
    topic_arg: str | None,
    topic: str | None,
    key_separator: str | None,
    partition: int | None,
    transactional_id: str | None,
) -> None:
    """Write one record per stdin line to TOPIC, creating TOPIC if it does not exist and
    the broker auto-creates topics (KIP98_AUTO_CREATE_TOPICS, KIP98_NUM_PARTITIONS)."""
    if key_separator == "":
        raise CliError("--key-separator must not be empty")
    topic = name_argument(topic_arg, topic, "TOPIC", "--topic")
    _check_partition(topic, partition, producing=True)
    config: dict[str, Any] = {"client.id": "kip98-console-producer", "linger.ms": 5}
    if transactional_id:
        config["transactional.id"] = transactional_id
    tally = _Tally()
    outcome = ""
    with Producer(config) as producer:
        if transactional_id:
            producer.init_transactions()
            producer.begin_transaction()
        target = -1 if partition is None else partition
        rejected = _produce_lines(producer, sys.stdin, topic, target, key_separator, tally)
        producer.flush()
        if transactional_id:
            if tally.failed or rejected:
                producer.abort_transaction()
                outcome = ", transaction aborted"
            else:
                producer.commit_transaction()
                outcome = ", transaction committed"
    errors = tally.failed + rejected
    click.echo(f"{tally.delivered} record(s) produced, {errors} error(s){outcome}", err=True)
    if tally.first_error:
        click.echo(f"error: first delivery failure: {tally.first_error}", err=True)
    if errors:
        sys.exit(1)


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", errors="replace")


def _record(message: Message) -> dict[str, Any]:
    return {
        "topic": message.topic(),
        "partition": message.partition(),
        "offset": message.offset(),
        "timestamp": message.timestamp()[1],
        "key": _text(message.key()),
        "value": _text(message.value()),
    }


def _binary_safe(record: dict[str, Any], message: Message) -> dict[str, Any]:
    """JSON output marks values that are not UTF-8 and carries them base64-encoded."""
    for field in ("key", "value"):
        raw = message.key() if field == "key" else message.value()
        if raw is None:
            continue
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            record[field] = base64.b64encode(raw).decode("ascii")
            record[f"{field}_encoding"] = "base64"
    return record


def _plain(record: dict[str, Any], print_key: bool, print_offset: bool, sep: str) -> str:
    parts = []
    if print_offset:
        parts.append(f"Partition:{record['partition']}")
        parts.append(f"Offset:{record['offset']}")
    if print_key:
        parts.append("null" if record["key"] is None else record["key"])
    parts.append("null" if record["value"] is None else record["value"])
    return sep.join(parts)


def _consumer(
    topic: str,
    isolation: str,
    from_beginning: bool,
    group: str | None,
    partition: int | None,
) -> Consumer:
    count = _check_partition(topic, partition)
    config: dict[str, Any] = {
        "client.id": "kip98-console-consumer",
        "isolation.level": isolation,
        "auto.offset.reset": "earliest" if from_beginning else "latest",
    }
    if group:
        config["group.id"] = group
    consumer = Consumer(config)
    try:
        if group and partition is None:
            consumer.subscribe([topic])
        else:
            start = OFFSET_BEGINNING if from_beginning else OFFSET_END
            chosen = range(count) if partition is None else [partition]
            consumer.assign([TopicPartition(topic, p, start) for p in chosen])
    except BaseException:
        consumer.close()
        raise
    return consumer


@click.command()
@click.argument("topic_arg", metavar="TOPIC", required=False)
@topic_option
@click.option(
    "--isolation",
    type=click.Choice(["read_committed", "read_uncommitted"]),
    default="read_committed",
    show_default=True,
)
@click.option("--from-beginning", is_flag=True, help="Start at the log start, not the end.")
@click.option("--max-messages", type=click.IntRange(min=1), default=None)
@click.option("--group", "-g", default=None, help="Join this consumer group; commit on exit.")
@click.option("--partition", "-p", type=int, default=None, help="Read only this partition.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="Stop after this many seconds without a record.",
)
@click.option("--print-key", is_flag=True, help="Plain output: print the key before the value.")
@click.option("--print-offset", is_flag=True, help="Plain output: print partition and offset.")
@click.option("--separator", default="\t", show_default=repr("\t"), help="Between printed fields.")
@output_choice(
    CONSUME_FORMATS,
    "plain",
    "plain: values, one per line; json: one object per line; table: at the end.",
)
def consume(
    topic_arg: str | None,
    topic: str | None,
    isolation: str,
    from_beginning: bool,
    max_messages: int | None,
    group: str | None,
    partition: int | None,
    timeout: float,
    print_key: bool,
    print_offset: bool,
    separator: str,
    output: str,
) -> None:
    """Print records of TOPIC (read_committed unless told otherwise). A missing TOPIC is an
    error: a consumer does not create topics."""
    topic = name_argument(topic_arg, topic, "TOPIC", "--topic")
    consumer = _consumer(topic, isolation, from_beginning, group, partition)
    collected: list[dict[str, Any]] = []
    seen = 0
    try:
        idle_since = time.monotonic()
        while max_messages is None or seen < max_messages:
            remaining = timeout - (time.monotonic() - idle_since)
            if remaining <= 0:
                break
            message = consumer.poll(min(remaining, 0.5))
            if message is None:
                continue
            if message.error() is not None:
                error = message.error()
                assert error is not None
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise CliError(f"{error.name()}: {one_line(error.str())}")
            idle_since = time.monotonic()
            seen += 1
            record = _record(message)
            if output == "json":
                click.echo(json.dumps(_binary_safe(record, message)))
            elif output == "plain":
                click.echo(_plain(record, print_key, print_offset, separator))
            else:
                collected.append(record)
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
    if output == "table":
        emit(collected, "table", columns=["partition", "offset", "key", "value"])
    click.echo(f"Processed a total of {seen} messages", err=True)
