"""The options of the ``kip98`` Spark data source, checked before anything runs: pure.

The names and meanings are those of Spark's Kafka source and sink (``subscribe``,
``startingOffsets``, ``maxOffsetsPerTrigger``, ``failOnDataLoss``...), with
``database.url`` where Kafka has ``kafka.bootstrap.servers`` and ``isolation.level``
read_committed by default. Spark hands options over case-insensitively (lower-cased);
an option this source does not know is an error naming it, as is a malformed value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from app.protocol import TopicPartitionKey
from app.spark.offsets import (
    EARLIEST,
    LATEST,
    Positions,
    bad_option,
    parse_assign,
    parse_positions,
)

READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"

# What Spark itself may add to a data source's options (a save path, a stream's
# checkpoint): accepted and ignored.
SPARK_OPTIONS = frozenset({"path", "checkpointlocation", "queryname"})

SOURCE_OPTIONS = frozenset(
    {
        "database.url",
        "subscribe",
        "subscribepattern",
        "assign",
        "startingoffsets",
        "endingoffsets",
        "startingtimestamp",
        "isolation.level",
        "minpartitions",
        "maxoffsetspertrigger",
        "failondataloss",
    }
)
SINK_OPTIONS = frozenset({"database.url", "topic", "transaction.timeout.ms"})

# A sink task's transaction stays open from its first record until the driver commits the
# micro-batch: Kafka's largest allowed transaction timeout (transaction.max.timeout.ms),
# so a slow batch is not aborted under it. The coordinator aborts it after this long only
# when no driver will ever commit it (a query that never restarts).
SINK_TRANSACTION_TIMEOUT_MS = 900_000


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def _check_known(options: Mapping[str, str], known: frozenset[str], what: str) -> None:
    for name in sorted(options):
        if name not in known and name not in SPARK_OPTIONS:
            raise bad_option(name, f"unknown option of the kip98 {what}")


def _positive_int(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise bad_option(name, f"{text!r} is not a positive integer")
    return value


def _bool(name: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise bad_option(name, f"{text!r} is not true or false")
    return lowered == "true"


@dataclass(frozen=True)
class Subscription:
    """Which partitions a query reads: Spark's ``subscribe``, ``subscribePattern`` or
    ``assign``, exactly one."""

    kind: str
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[TopicPartitionKey, ...] = ()

    def wants(self, topic: str, partition: int) -> bool:
        if self.kind == "subscribe":
            return topic in self.topics
        if self.kind == "subscribepattern":
            assert self.pattern is not None
            return re.fullmatch(self.pattern, topic) is not None
        return (topic, partition) in self.assigned

    @property
    def named_topics(self) -> tuple[str, ...]:
        """The topics named outright (which must exist); none for a pattern."""
        if self.kind == "assign":
            return tuple(sorted({t for t, _ in self.assigned}))
        return self.topics


def _subscription(options: Mapping[str, str]) -> Subscription:
    given = [k for k in ("subscribe", "subscribepattern", "assign") if k in options]
    if len(given) != 1:
        what = "none was" if not given else f"{len(given)} were"
        raise bad_option(
            "subscribe",
            f"exactly one of 'subscribe', 'subscribePattern' or 'assign' is needed; {what} given",
        )
    kind = given[0]
    value = options[kind]
    if kind == "subscribe":
        topics = tuple(sorted({t.strip() for t in value.split(",") if t.strip()}))
        if not topics:
            raise bad_option("subscribe", "no topic named")
        return Subscription(kind, topics=topics)
    if kind == "subscribepattern":
        if not value.strip():
            raise bad_option("subscribePattern", "empty pattern")
        try:
            re.compile(value)
        except re.error as exc:
            raise bad_option("subscribePattern", f"not a regular expression: {exc}") from exc
        return Subscription(kind, pattern=value)
    return Subscription(kind, assigned=tuple(parse_assign(value)))


# startingOffsets / endingOffsets: "earliest", "latest" or offsets per partition.
OffsetSpec = str | Positions


def _offset_spec(name: str, text: str | None, default: str) -> OffsetSpec:
    if text is None:
        return default
    lowered = text.strip().lower()
    if lowered in ("earliest", "latest"):
        return lowered
    return parse_positions(name, text)


@dataclass(frozen=True)
class SourceOptions:
    database_url: str | None
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec
    starting_timestamp: int | None
    read_committed: bool
    min_partitions: int | None
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool


def source_options(raw: Mapping[str, str], streaming: bool) -> SourceOptions:
    """The reader's options checked, with Spark's Kafka source's defaults and refusals:
    a batch query starts at ``earliest`` and ends at ``latest``, may not start at the
    latest nor end at the earliest; a streaming query starts at ``latest`` and has no
    end."""
    options = _lower(raw)
    _check_known(options, SOURCE_OPTIONS, "source")
    subscription = _subscription(options)
    starting = _offset_spec(
        "startingOffsets", options.get("startingoffsets"), "latest" if streaming else "earliest"
    )
    ending: OffsetSpec = "latest"
    if streaming:
        if "endingoffsets" in options:
            raise bad_option("endingOffsets", "not valid in streaming queries")
    else:
        ending = _offset_spec("endingOffsets", options.get("endingoffsets"), "latest")
        if starting == "latest":
            raise bad_option("startingOffsets", "can't be latest for batch queries")
        if isinstance(starting, dict) and LATEST in starting.values():
            raise bad_option("startingOffsets", "-1 (latest) is not allowed for batch queries")
        if ending == "earliest":
            raise bad_option("endingOffsets", "can't be earliest for batch queries")
        if isinstance(ending, dict) and EARLIEST in ending.values():
            raise bad_option("endingOffsets", "-2 (earliest) is not allowed for batch queries")
    timestamp = None
    if "startingtimestamp" in options:
        try:
            timestamp = int(options["startingtimestamp"])
        except ValueError:
            timestamp = -1
        if timestamp < 0:
            raise bad_option(
                "startingTimestamp",
                f"{options['startingtimestamp']!r} is not a timestamp in milliseconds",
            )
    isolation = options.get("isolation.level", READ_COMMITTED)
    if isolation not in (READ_COMMITTED, READ_UNCOMMITTED):
        raise bad_option(
            "isolation.level", f"{isolation!r} is neither {READ_COMMITTED} nor {READ_UNCOMMITTED}"
        )
    min_partitions = None
    if "minpartitions" in options:
        min_partitions = _positive_int("minPartitions", options["minpartitions"])
    max_offsets = None
    if "maxoffsetspertrigger" in options:
        max_offsets = _positive_int("maxOffsetsPerTrigger", options["maxoffsetspertrigger"])
    fail_on_data_loss = _bool("failOnDataLoss", options.get("failondataloss", "true"))
    return SourceOptions(
        options.get("database.url") or None,
        subscription,
        starting,
        ending,
        timestamp,
        isolation == READ_COMMITTED,
        min_partitions,
        max_offsets,
        fail_on_data_loss,
    )


@dataclass(frozen=True)
class SinkOptions:
    database_url: str | None
    topic: str | None
    transaction_timeout_ms: int


def sink_options(
    raw: Mapping[str, str], max_transaction_timeout_ms: int = SINK_TRANSACTION_TIMEOUT_MS
) -> SinkOptions:
    """The writer's options checked; ``transaction.timeout.ms`` no longer than the
    coordinator allows (``KIP98_MAX_TRANSACTION_TIMEOUT_MS``), which would refuse every
    task's InitProducerId."""
    options = _lower(raw)
    _check_known(options, SINK_OPTIONS, "sink")
    topic = options.get("topic")
    if topic is not None and not topic.strip():
        raise bad_option("topic", "empty topic name")
    timeout = min(SINK_TRANSACTION_TIMEOUT_MS, max_transaction_timeout_ms)
    if "transaction.timeout.ms" in options:
        timeout = _positive_int("transaction.timeout.ms", options["transaction.timeout.ms"])
    if timeout > max_transaction_timeout_ms:
        raise bad_option(
            "transaction.timeout.ms",
            f"{timeout} is above the coordinator's maximum, {max_transaction_timeout_ms}",
        )
    return SinkOptions(options.get("database.url") or None, topic, timeout)
