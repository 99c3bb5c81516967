"""Topic configs: every config Kafka defines for a topic (its LogConfig), declared once with
Kafka's name, type, range and default, and what it does here. Pure rules.

Only overrides are stored (``topics.config``), as Kafka stores a topic's dynamic configs;
``effective`` lays them over the defaults. Values are accepted as Kafka's tools send them
(strings) or as Python values, checked by type and range as Kafka's ConfigDef checks them
(an unknown name, or a value out of range, is INVALID_CONFIG), and stored canonically
(numbers as numbers, booleans as booleans, lists as their comma-separated string) so SQL,
the cleaner and the data path read them without parsing again.

What each one does here (``TopicConfigDef.effect``): the cleaner's (``cleanup.policy``,
the retentions, the compaction lags) are honoured by the cleaner; ``max.message.bytes``,
``message.timestamp.type`` and ``compression.type`` by the append and the fetch (they are
kept on the partition rows too: ``partition_columns``); ``min.insync.replicas`` is kept for
acks=all with standbys (``min_insync_replicas``). The others govern what PostgreSQL does
for kip98 (segments, indexes, flushes, leader election, tiered storage): accepted, stored,
described, with no effect.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from app.errors import KafkaError, fail

CLEANUP_POLICY = "cleanup.policy"
RETENTION_MS = "retention.ms"
RETENTION_BYTES = "retention.bytes"
DELETE_RETENTION_MS = "delete.retention.ms"
MIN_COMPACTION_LAG_MS = "min.compaction.lag.ms"
MIN_CLEANABLE_DIRTY_RATIO = "min.cleanable.dirty.ratio"
MAX_MESSAGE_BYTES = "max.message.bytes"
MESSAGE_TIMESTAMP_TYPE = "message.timestamp.type"
COMPRESSION_TYPE = "compression.type"
MIN_INSYNC_REPLICAS = "min.insync.replicas"

DELETE = "delete"
COMPACT = "compact"
CREATE_TIME = "CreateTime"
LOG_APPEND_TIME = "LogAppendTime"
# compression.type's values: the producer's own (kept as sent), none, or a codec.
PRODUCER = "producer"
UNCOMPRESSED = "uncompressed"
CODECS = ("gzip", "snappy", "lz4", "zstd")

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1
# Kafka's broker message.max.bytes default, and a topic's max.message.bytes default.
DEFAULT_MAX_MESSAGE_BYTES = 1_048_588

# Kafka's ConfigEntry.ConfigType codes, as DescribeConfigs (v3+) gives them.
CONFIG_TYPES = {"boolean": 1, "string": 2, "int": 3, "short": 4, "long": 5, "double": 6,
                "list": 7}  # fmt: skip

HONOURED = "honoured"
NO_EFFECT = "accepted, no effect"


@dataclass(frozen=True)
class TopicConfigDef:
    """One of Kafka's topic configs: ``kind`` its ConfigDef type, ``parse`` its value
    checked (ValueError naming what is expected) and made canonical, ``effect`` what it
    does here, ``doc`` why, in a line."""

    name: str
    kind: str
    default: Any
    parse: Callable[[Any], Any]
    effect: str
    doc: str

    @property
    def config_type(self) -> int:
        return CONFIG_TYPES[self.kind]


def _text(raw: Any) -> str:
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise ValueError("expected a value")
    return str(raw).strip()


def _integer(low: int, high: int, minimum: int | None = None) -> Callable[[Any], int]:
    """Kafka's INT (``low``..``high`` = the int32 range) or LONG, at least ``minimum``."""
    floor = low if minimum is None else minimum

    def parse(raw: Any) -> int:
        if isinstance(raw, bool) or not isinstance(raw, int | str):
            raise ValueError("expected an integer")
        try:
            value = int(raw)
        except ValueError:
            raise ValueError("expected an integer") from None
        if not floor <= value <= high:
            raise ValueError(f"expected an integer from {floor} to {high}")
        return value

    return parse


def _int(minimum: int | None = None) -> Callable[[Any], int]:
    return _integer(INT_MIN, INT_MAX, minimum)


def _long(minimum: int | None = None) -> Callable[[Any], int]:
    return _integer(LONG_MIN, LONG_MAX, minimum)


def _levels(low: int, high: int, also: int | None = None) -> Callable[[Any], int]:
    """A compression level: ``low``..``high``, or ``also`` (gzip's -1, its default)."""
    within = _int(low)

    def parse(raw: Any) -> int:
        value = _int()(raw)
        if value == also:
            return value
        if value > high:
            raise ValueError(f"expected a level from {low} to {high}")
        return within(value)

    return parse


def _ratio(raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise ValueError("expected a number between 0 and 1")
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("expected a number between 0 and 1") from None
    if not 0.0 <= value <= 1.0:
        raise ValueError("expected a number between 0 and 1")
    return value


def _boolean(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    value = {"true": True, "false": False}.get(_text(raw).lower())
    if value is None:
        raise ValueError("expected true or false")
    return value


def _one_of(*allowed: str) -> Callable[[Any], str]:
    def parse(raw: Any) -> str:
        value = _text(raw)
        if value not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return value

    return parse


def _compression(raw: Any) -> str:
    """Kafka's BrokerCompressionType names; case as Kafka's (lower)."""
    return _one_of(PRODUCER, UNCOMPRESSED, *CODECS)(_text(raw).lower())


_POLICIES = {(DELETE,): DELETE, (COMPACT,): COMPACT, (COMPACT, DELETE): "compact,delete"}


def _policy(raw: Any) -> str:
    if not isinstance(raw, str):
        raise ValueError("expected a comma-separated list of delete and compact")
    parts = tuple(sorted({p.strip() for p in raw.split(",") if p.strip()}))
    if parts not in _POLICIES:
        raise ValueError("expected delete, compact or delete,compact")
    return _POLICIES[parts]


_THROTTLED = re.compile(r"\d+:\d+")


def _throttled_replicas(raw: Any) -> str:
    """Kafka's ThrottledReplicaListValidator: empty, ``*``, or partition:broker pairs."""
    items = [i.strip() for i in _text(raw).split(",") if i.strip()]
    if items == ["*"] or all(_THROTTLED.fullmatch(i) for i in items):
        return ",".join(items)
    raise ValueError("expected * or a list of partition:broker")


_DAY = 86_400_000
_WEEK = 7 * _DAY


def _defs() -> list[TopicConfigDef]:
    """Kafka's topic configs (LogConfig, TopicConfig, QuotaConfig), in its order. Kafka 4
    removed message.format.version (KIP-724): like any name it does not know, it is
    refused (INVALID_CONFIG)."""
    h, n = HONOURED, NO_EFFECT
    return [
        TopicConfigDef("segment.bytes", "int", 1_073_741_824, _int(14), n,
                       "records are rows, not segment files"),
        TopicConfigDef("segment.ms", "long", _WEEK, _long(1), n,
                       "records are rows, not segment files"),
        TopicConfigDef("segment.jitter.ms", "long", 0, _long(0), n,
                       "records are rows, not segment files"),
        TopicConfigDef("segment.index.bytes", "int", 10_485_760, _int(4), n,
                       "PostgreSQL's primary key is the offset index"),
        TopicConfigDef("flush.messages", "long", LONG_MAX, _long(1), n,
                       "every acknowledged write is committed by PostgreSQL"),
        TopicConfigDef("flush.ms", "long", LONG_MAX, _long(0), n,
                       "every acknowledged write is committed by PostgreSQL"),
        TopicConfigDef(RETENTION_BYTES, "long", -1, _long(), h,
                       "the cleaner moves the log start past records over the size"),
        TopicConfigDef(RETENTION_MS, "long", _WEEK, _long(-1), h,
                       "the cleaner moves the log start past records older than this"),
        TopicConfigDef(MAX_MESSAGE_BYTES, "int", DEFAULT_MAX_MESSAGE_BYTES, _int(0), h,
                       "a larger record batch is refused with MESSAGE_TOO_LARGE"),
        TopicConfigDef("index.interval.bytes", "int", 4096, _int(0), n,
                       "PostgreSQL's primary key is the offset index"),
        TopicConfigDef(DELETE_RETENTION_MS, "long", _DAY, _long(0), h,
                       "how long compaction keeps tombstones and empty markers"),
        TopicConfigDef(MIN_COMPACTION_LAG_MS, "long", 0, _long(0), h,
                       "records younger than this are not compacted"),
        TopicConfigDef("max.compaction.lag.ms", "long", LONG_MAX, _long(1), n,
                       "the cleaner compacts on its interval and dirty ratio"),
        TopicConfigDef("file.delete.delay.ms", "long", 60_000, _long(0), n,
                       "records are rows, deleted by the cleaner's statements"),
        TopicConfigDef(MIN_CLEANABLE_DIRTY_RATIO, "double", 0.5, _ratio, h,
                       "compaction runs once this share of the log is new"),
        TopicConfigDef(CLEANUP_POLICY, "list", DELETE, _policy, h,
                       "delete (retention), compact, or both"),
        TopicConfigDef("unclean.leader.election.enable", "boolean", False, _boolean, n,
                       "failover promotes a synchronous standby, never a stale one"),
        TopicConfigDef(MIN_INSYNC_REPLICAS, "int", 1, _int(1), h,
                       "kept for acks=all: the synchronous standbys a write needs"),
        TopicConfigDef(COMPRESSION_TYPE, "string", PRODUCER, _compression, h,
                       "fetched batches are compressed with this codec"),
        TopicConfigDef("compression.gzip.level", "int", -1, _levels(1, 9, also=-1), n,
                       "batches are compressed at the codec's default level"),
        TopicConfigDef("compression.lz4.level", "int", 9, _levels(1, 17), n,
                       "batches are compressed at the codec's default level"),
        TopicConfigDef("compression.zstd.level", "int", 3, _levels(-131_072, 22), n,
                       "batches are compressed at the codec's default level"),
        TopicConfigDef("preallocate", "boolean", False, _boolean, n,
                       "records are rows, not segment files"),
        TopicConfigDef(MESSAGE_TIMESTAMP_TYPE, "string", CREATE_TIME,
                       _one_of(CREATE_TIME, LOG_APPEND_TIME), h,
                       "LogAppendTime stamps each record with the time of its append"),
        TopicConfigDef("message.timestamp.difference.max.ms", "long", LONG_MAX, _long(0), n,
                       "a record's timestamp is kept as the producer gave it"),
        TopicConfigDef("message.timestamp.before.max.ms", "long", LONG_MAX, _long(0), n,
                       "a record's timestamp is kept as the producer gave it"),
        TopicConfigDef("message.timestamp.after.max.ms", "long", LONG_MAX, _long(0), n,
                       "a record's timestamp is kept as the producer gave it"),
        TopicConfigDef("leader.replication.throttled.replicas", "list", "",
                       _throttled_replicas, n, "replication is PostgreSQL's, unthrottled"),
        TopicConfigDef("follower.replication.throttled.replicas", "list", "",
                       _throttled_replicas, n, "replication is PostgreSQL's, unthrottled"),
        TopicConfigDef("message.downconversion.enable", "boolean", True, _boolean, n,
                       "every client reads message format v2"),
        TopicConfigDef("remote.storage.enable", "boolean", False, _boolean, n,
                       "the log is in PostgreSQL, with no tiered storage"),
        TopicConfigDef("local.retention.ms", "long", -2, _long(-2), n,
                       "the log is in PostgreSQL, with no tiered storage"),
        TopicConfigDef("local.retention.bytes", "long", -2, _long(-2), n,
                       "the log is in PostgreSQL, with no tiered storage"),
        TopicConfigDef("remote.log.copy.disable", "boolean", False, _boolean, n,
                       "the log is in PostgreSQL, with no tiered storage"),
        TopicConfigDef("remote.log.delete.on.disable", "boolean", False, _boolean, n,
                       "the log is in PostgreSQL, with no tiered storage"),
    ]  # fmt: skip


TOPIC_CONFIGS: dict[str, TopicConfigDef] = {d.name: d for d in _defs()}
DEFAULTS: dict[str, Any] = {name: d.default for name, d in TOPIC_CONFIGS.items()}
KNOWN_KEYS = tuple(TOPIC_CONFIGS)
# The configs whose value is a list (Kafka's ConfigDef.Type.LIST): IncrementalAlterConfigs
# may append to them and subtract from them.
LIST_KEYS = tuple(name for name, d in TOPIC_CONFIGS.items() if d.kind == "list")


def validate_topic_config(config: Any) -> dict[str, Any]:
    """Canonical overrides, or INVALID_CONFIG naming the first bad key or value."""
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise fail(KafkaError.INVALID_CONFIG, f"topic config must be a dict, got {config!r}")
    out: dict[str, Any] = {}
    for key, raw in config.items():
        known = TOPIC_CONFIGS.get(key) if isinstance(key, str) else None
        if known is None:
            raise fail(KafkaError.INVALID_CONFIG, f"unknown topic config {key!r}")
        try:
            out[key] = known.parse(raw)
        except ValueError as exc:
            raise fail(KafkaError.INVALID_CONFIG, f"invalid {key}={raw!r}: {exc}") from None
    return out


def value_text(value: Any) -> str:
    """A config's value as Kafka's tools show it (true/false, not True/False)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True)
class CleanupConfig:
    """The effective cleaning settings of one topic."""

    delete: bool
    compact: bool
    retention_ms: int
    retention_bytes: int
    delete_retention_ms: int
    min_compaction_lag_ms: int
    min_cleanable_dirty_ratio: float = 0.5

    @classmethod
    def of(cls, overrides: Mapping[str, Any] | None) -> CleanupConfig:
        c = effective(overrides)
        policies = set(c[CLEANUP_POLICY].split(","))
        return cls(
            delete=DELETE in policies,
            compact=COMPACT in policies,
            retention_ms=c[RETENTION_MS],
            retention_bytes=c[RETENTION_BYTES],
            delete_retention_ms=c[DELETE_RETENTION_MS],
            min_compaction_lag_ms=c[MIN_COMPACTION_LAG_MS],
            min_cleanable_dirty_ratio=c[MIN_CLEANABLE_DIRTY_RATIO],
        )


@dataclass(frozen=True)
class PartitionColumns:
    """The configs an append or a fetch of the topic's partitions obeys, as the partition
    rows keep them (``partitions`` columns of the same names): max.message.bytes (None:
    the broker's message.max.bytes), whether records are stamped with their append time,
    and the codec fetched batches are compressed with."""

    max_message_bytes: int | None
    log_append_time: bool
    compression_type: str

    def as_params(self) -> dict[str, Any]:
        return {
            "max_message_bytes": self.max_message_bytes,
            "log_append_time": self.log_append_time,
            "compression_type": self.compression_type,
        }


def partition_columns(overrides: Mapping[str, Any] | None) -> PartitionColumns:
    c = effective(overrides)
    return PartitionColumns(
        (overrides or {}).get(MAX_MESSAGE_BYTES),
        c[MESSAGE_TIMESTAMP_TYPE] == LOG_APPEND_TIME,
        c[COMPRESSION_TYPE],
    )


def min_insync_replicas(overrides: Mapping[str, Any] | None) -> int:
    """The topic's min.insync.replicas: how many in-sync copies an acks=all write needs
    (Kafka's count includes the leader's own)."""
    value: int = effective(overrides)[MIN_INSYNC_REPLICAS]
    return value


def effective(overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """Defaults with the stored overrides on top (unknown stored keys are ignored)."""
    out = dict(DEFAULTS)
    out.update({k: v for k, v in (overrides or {}).items() if k in DEFAULTS})
    return out


def altered(
    current: Mapping[str, Any],
    set_: Any,
    delete: Any = (),
    append: Mapping[str, Any] | None = None,
    subtract: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """kafka-configs.sh --add-config / --delete-config: the overrides after the change.
    ``append``/``subtract`` (KIP-339's list operations) then add items to a list config's
    value, or take them out, as it is after the sets and deletes."""
    changes = validate_topic_config(set_)
    removed = list(delete or ())
    for key in removed:
        if key not in TOPIC_CONFIGS:
            raise fail(KafkaError.INVALID_CONFIG, f"unknown topic config {key!r}")
    # A stored config Kafka no longer has (message.format.version, which Kafka 4 removed
    # with message formats v0 and v1: KIP-724) is dropped by the change, as Kafka drops it.
    out = {k: v for k, v in current.items() if k not in removed and k in TOPIC_CONFIGS}
    out.update(changes)
    lists: dict[str, list[str]] = {}
    for ops, adding in ((append, True), (subtract, False)):
        for key, raw in (ops or {}).items():
            if key not in LIST_KEYS:
                raise fail(
                    KafkaError.INVALID_CONFIG,
                    f"{key!r} is not a list config: nothing can be appended or subtracted",
                )
            now = lists[key] if key in lists else _items(key, effective(out)[key])
            given = _items(key, raw)
            lists[key] = (
                now + [i for i in given if i not in now]
                if adding
                else [i for i in now if i not in given]
            )
    out.update(validate_topic_config({k: ",".join(v) for k, v in lists.items()}))
    return out


def _items(key: str, raw: Any) -> list[str]:
    if not isinstance(raw, str):
        raise fail(KafkaError.INVALID_CONFIG, f"invalid {key}={raw!r}: expected a list")
    return [i.strip() for i in raw.split(",") if i.strip()]
