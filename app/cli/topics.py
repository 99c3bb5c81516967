"""``kip98 topics``: kafka-topics.sh for the PostgreSQL log.

``describe`` shows the three offsets that matter for exactly-once reading side by side:
a read_committed consumer stops at the LSO, not the high watermark, so a gap between them
is an open transaction holding readers back.
"""

from __future__ import annotations

import json
from typing import Any

import click
from rich.progress import Progress
from sqlalchemy import text

from app.admin import AdminClient, ConfigResource, NewPartitions, NewTopic
from app.broker import Broker
from app.cleaner.cleaner import clean_partition, partitions_to_clean
from app.cli.errors import CliError
from app.cli.names import name_argument, topic_option
from app.cli.output import emit, output_option, stderr_console
from app.client.message import TopicPartition
from app.log.topics import authorize_alter, describe_topic

_OPEN_BY_PARTITION = text(
    "SELECT partition, open_transactions FROM partition_status WHERE topic = :topic"
)


def parse_config_pairs(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``k=v`` options into a dict; JSON-looking values (numbers, booleans) keep their type."""
    config: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise CliError(f"--config expects key=value, got {pair!r}")
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        config[key.strip()] = value
    return config


@click.group("topics")
def topics_group() -> None:
    """Create, list, describe and delete topics."""


@topics_group.command()
@click.argument("name")
@click.option("--partitions", "-p", type=int, default=1, show_default=True)
@click.option(
    "--config", "-c", "configs", multiple=True, metavar="KEY=VALUE", help="Topic config (repeat)."
)
def create(name: str, partitions: int, configs: tuple[str, ...]) -> None:
    """Create topic NAME with N partitions."""
    config = parse_config_pairs(configs)
    with AdminClient() as admin:
        admin.create_topics([NewTopic(name, partitions, config=config or None)])[name].result()
    click.echo(f"Created topic {name} with {partitions} partition(s).")


@topics_group.command("list")
@output_option
def list_(output: str) -> None:
    """List topics with their partition counts and configs."""
    with AdminClient() as admin:
        infos = admin.list_topics().topics.values()
    rows = [
        {"topic": i.topic, "partitions": i.num_partitions, "config": i.config}
        for i in sorted(infos, key=lambda i: i.topic)
    ]
    emit(rows, output, columns=["topic", "partitions", "config"])


@topics_group.command()
@click.argument("name")
@click.option(
    "--configs",
    "configs",
    is_flag=True,
    help="List every config instead: its value, whether it is the default, and its source.",
)
@output_option
def describe(name: str, configs: bool, output: str) -> None:
    """Per-partition log start, high watermark, last stable offset and open transactions;
    with --configs, every config of NAME with its value, whether it is the default and its
    source (DescribeConfigs' DYNAMIC_TOPIC_CONFIG: set on the topic; DEFAULT_CONFIG)."""
    if configs:
        _describe_configs(name, output)
        return
    broker = Broker.connect()
    info = describe_topic(broker, name)
    with broker.engine.connect() as conn:
        open_txns = {
            int(r.partition): int(r.open_transactions)
            for r in conn.execute(_OPEN_BY_PARTITION, {"topic": name})
        }
    rows = [
        {
            "topic": info.topic,
            "partition": p.partition,
            "log_start_offset": p.log_start_offset,
            "high_watermark": p.high_watermark,
            "last_stable_offset": p.last_stable_offset,
            "open_transactions": int(open_txns.get(p.partition, 0)),
        }
        for p in info.partitions
    ]
    if output == "json":
        emit(
            {
                "topic": info.topic,
                "num_partitions": info.num_partitions,
                "config": info.config,
                "partitions": rows,
            },
            output,
        )
        return
    emit(
        rows,
        output,
        headers={"last_stable_offset": "LSO", "log_start_offset": "LOG-START-OFFSET"},
    )


def _describe_configs(name: str, output: str) -> None:
    """What the broker's DescribeConfigs answers for the topic, through the AdminClient."""
    resource = ConfigResource("topic", name)
    with AdminClient() as admin:
        entries = admin.describe_configs([resource])[resource].result()
    emit(
        [
            {"name": e.name, "value": e.value, "is_default": e.is_default, "source": e.source}
            for e in sorted(entries.values(), key=lambda e: e.name)
        ],
        output,
        headers={"is_default": "DEFAULT"},
    )


@topics_group.command()
@click.argument("name")
@click.option(
    "--config", "-c", "configs", multiple=True, metavar="KEY=VALUE", help="Set a config (repeat)."
)
@click.option(
    "--delete-config", "deletes", multiple=True, metavar="KEY", help="Drop an override (repeat)."
)
@click.option(
    "--partitions", "-p", type=int, default=None, help="Grow to N partitions (never fewer)."
)
@output_option
def alter(
    name: str,
    configs: tuple[str, ...],
    deletes: tuple[str, ...],
    partitions: int | None,
    output: str,
) -> None:
    """Grow topic NAME to N partitions (kafka-topics.sh --alter --partitions), or change
    its configs (cleanup.policy, retention.ms, ...; the others stay)."""
    if not configs and not deletes and partitions is None:
        raise CliError(
            "nothing to change: give --partitions N, --config KEY=VALUE or --delete-config KEY"
        )
    with AdminClient() as admin:
        if partitions is not None:
            admin.create_partitions([NewPartitions(name, partitions)])[name].result()
            if not configs and not deletes:
                click.echo(f"Topic {name} now has {partitions} partition(s).")
                return
        resource = ConfigResource("topic", name, parse_config_pairs(configs), list(deletes), True)
        admin.alter_configs([resource])[resource].result()
        entries = admin.describe_configs([resource])[resource].result()
    emit(
        [{"name": e.name, "value": e.value, "source": e.source} for e in entries.values()],
        output,
    )


@topics_group.command("delete-records")
@click.argument("topic_arg", metavar="TOPIC", required=False)
@topic_option
@click.option("--partition", "-p", type=int, required=True)
@click.option(
    "--offset", "-o", "offset", type=int, required=True,
    help="The new log start: records below it go (-1: every record up to the high watermark).",
)  # fmt: skip
@click.option("--output", "output", type=click.Choice(("table", "json")), default="table",
              show_default=True, help="Render as a table or as JSON.")  # fmt: skip
def delete_records(
    topic_arg: str | None, topic: str | None, partition: int, offset: int, output: str
) -> None:
    """Delete the records of one partition of TOPIC below an offset
    (kafka-delete-records.sh): its log start moves there, as retention moves it."""
    topic = name_argument(topic_arg, topic, "TOPIC", "--topic")
    tp = TopicPartition(topic, partition, offset)
    with (
        AdminClient() as admin,
        Progress(console=stderr_console(), transient=True) as progress,
    ):
        progress.add_task(f"deleting {topic} [{partition}] below {offset}", total=None)
        deleted = admin.delete_records([tp])[tp].result()
    emit(
        [{"topic": topic, "partition": partition, "low_watermark": deleted.low_watermark}],
        output,
        headers={"low_watermark": "LOW-WATERMARK"},
    )


@topics_group.command()
@click.argument("name")
@output_option
def clean(name: str, output: str) -> None:
    """Run one cleaning pass (retention, compaction) over topic NAME now."""
    broker = Broker.connect()
    authorize_alter(broker, name)
    targets = partitions_to_clean(broker, name)
    if not targets:
        raise CliError(f"topic {name!r} does not exist")
    results = []
    with Progress(console=stderr_console(), transient=True) as progress:
        task = progress.add_task(f"cleaning {name}", total=len(targets))
        for t in targets:
            results.append(clean_partition(broker, t.topic, t.partition, t.config).as_dict())
            progress.advance(task)
    emit(
        results,
        output,
        columns=[
            "partition",
            "log_start_offset",
            "cleaned_up_to",
            "examined",
            "records_removed",
            "bytes_removed",
        ],
    )


@topics_group.command()
@click.argument("name")
def delete(name: str) -> None:
    """Delete topic NAME and all its records."""
    with AdminClient() as admin:
        admin.delete_topics([name])[name].result()
    click.echo(f"Deleted topic {name}.")
