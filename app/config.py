"""Client configuration: confluent-kafka style dicts with dotted keys, checked up front.

Every setting lives in one declarative table (type, default, allowed range or choices,
which client kinds use it), so validation, defaults and documentation cannot drift apart.
Values may arrive as strings ("5", "true") because librdkafka accepts them that way and
configs are often read from files or the environment.

The behaviour follows librdkafka where it is observable: an unknown key or a bad value
is an ``_INVALID_ARG`` error naming the key; a key that belongs to another client kind
(``group.id`` given to a producer) is accepted and ignored with a warning, so one shared
dict can configure both ends of a pipeline. Idempotence defaults to on, as in the Java
client since Kafka 3.0, which also supplies the rule for conflicting settings: an
explicit request for idempotence (or a ``transactional.id``) makes a conflict an error,
while an implicit default quietly gives way.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from app.errors import KafkaError, KafkaException, fail

log = logging.getLogger(__name__)

INT32_MAX = 2**31 - 1

PRODUCER = "producer"
CONSUMER = "consumer"
ADMIN = "admin"
KINDS = frozenset({PRODUCER, CONSUMER, ADMIN})
_ALL = KINDS
_P = frozenset({PRODUCER})
_C = frozenset({CONSUMER})


class Type(enum.Enum):
    STR = "string"
    INT = "integer"
    BOOL = "boolean"
    ENUM = "enum"
    CALLABLE = "callable"


@dataclass(frozen=True)
class Setting:
    """One configuration key: how to coerce it, its default, and what values are allowed.

    ``choices`` maps each accepted spelling (lower case) to the canonical value stored,
    which is how synonyms such as ``smallest`` for ``earliest`` collapse to one value.
    ``multi`` enum settings take a comma-separated list of choices.
    """

    name: str
    type: Type
    default: Any = None
    kinds: frozenset[str] = _ALL
    minimum: int | None = None
    maximum: int | None = None
    choices: Mapping[str, Any] = field(default_factory=dict)
    multi: bool = False
    aliases: tuple[str, ...] = ()
    ignored: bool = False
    doc: str = ""


def _choices(*names: str, **synonyms: Any) -> dict[str, Any]:
    table: dict[str, Any] = {name: name for name in names}
    table.update(synonyms)
    return table


_SETTINGS: tuple[Setting, ...] = (
    # --- every client -------------------------------------------------------------
    Setting("database.url", Type.STR, doc="SQLAlchemy URL; overrides KIP98_DATABASE_URL."),
    Setting("client.id", Type.STR, "rdkafka"),
    Setting("principal", Type.STR, doc="Identity that ACLs are checked against."),
    Setting("bootstrap.servers", Type.STR, ignored=True, aliases=("metadata.broker.list",)),
    Setting("debug", Type.STR, ignored=True),
    Setting("statistics.interval.ms", Type.INT, 0, minimum=0, maximum=86_400_000),
    Setting("error_cb", Type.CALLABLE),
    Setting("logger", Type.CALLABLE),
    Setting("stats_cb", Type.CALLABLE),
    Setting("throttle_cb", Type.CALLABLE),
    Setting("request.timeout.ms", Type.INT, 30_000, minimum=1, maximum=900_000),
    Setting(
        "allow.auto.create.topics",
        Type.BOOL,
        kinds=_P | _C,
        doc="Ask the broker to create an unknown topic (KIP98_AUTO_CREATE_TOPICS must allow "
        "it): true by default for a producer, false for a consumer, as in librdkafka.",
    ),
    Setting("retry.backoff.ms", Type.INT, 100, minimum=1, maximum=300_000),
    # --- producer -----------------------------------------------------------------
    Setting("transactional.id", Type.STR, kinds=_P),
    Setting("enable.idempotence", Type.BOOL, True, kinds=_P),
    Setting("transaction.timeout.ms", Type.INT, 60_000, kinds=_P, minimum=1000, maximum=INT32_MAX),
    Setting(
        "linger.ms",
        Type.INT,
        5,
        kinds=_P,
        minimum=0,
        maximum=900_000,
        aliases=("queue.buffering.max.ms",),
    ),
    Setting("batch.num.messages", Type.INT, 10_000, kinds=_P, minimum=1, maximum=1_000_000),
    Setting("batch.size", Type.INT, 1_000_000, kinds=_P, minimum=1, maximum=INT32_MAX),
    Setting(
        "message.max.bytes", Type.INT, 1_000_000, kinds=_P, minimum=1000, maximum=1_000_000_000
    ),
    Setting(
        "acks",
        Type.ENUM,
        -1,
        kinds=_P,
        choices={"all": -1, "-1": -1, "1": 1, "0": 0},
        aliases=("request.required.acks",),
    ),
    Setting(
        "retries",
        Type.INT,
        INT32_MAX,
        kinds=_P,
        minimum=0,
        maximum=INT32_MAX,
        aliases=("message.send.max.retries",),
    ),
    Setting(
        "message.timeout.ms",
        Type.INT,
        300_000,
        kinds=_P,
        minimum=0,
        maximum=INT32_MAX,
        aliases=("delivery.timeout.ms",),
    ),
    Setting(
        "queue.buffering.max.messages", Type.INT, 100_000, kinds=_P, minimum=1, maximum=INT32_MAX
    ),
    Setting(
        "queue.buffering.max.kbytes", Type.INT, 1_048_576, kinds=_P, minimum=1, maximum=INT32_MAX
    ),
    # 1, not Kafka's 5: one request in flight carries every partition's ready batches in
    # one DB transaction, which already shares a commit among partitions; more lanes add
    # requests and pay only where a commit's flush is slow (docs/design.md §7).
    Setting(
        "max.in.flight.requests.per.connection",
        Type.INT,
        1,
        kinds=_P,
        minimum=1,
        maximum=1_000_000,
        aliases=("max.in.flight",),
    ),
    Setting(
        "partitioner",
        Type.ENUM,
        "murmur2_random",
        kinds=_P,
        choices=_choices("murmur2_random", "murmur2", "consistent_random", "consistent", "random"),
    ),
    Setting(
        "compression.type",
        Type.ENUM,
        "none",
        kinds=_P,
        choices=_choices("none", "gzip", "snappy", "lz4", "zstd"),
        aliases=("compression.codec",),
        ignored=True,
        doc="Records are stored uncompressed in PostgreSQL rows; accepted for compatibility.",
    ),
    Setting("on_delivery", Type.CALLABLE, kinds=_P, aliases=("delivery_cb",)),
    # --- consumer -----------------------------------------------------------------
    Setting(
        "database.replica.url",
        Type.STR,
        kinds=_C,
        doc="A standby's SQLAlchemy URL: records are fetched there (fetch from follower).",
    ),
    Setting("group.id", Type.STR, kinds=_C),
    Setting("group.instance.id", Type.STR, kinds=_C),
    Setting(
        "isolation.level",
        Type.ENUM,
        "read_committed",
        kinds=_C,
        choices=_choices("read_committed", "read_uncommitted"),
    ),
    Setting("enable.auto.commit", Type.BOOL, True, kinds=_C),
    Setting("auto.commit.interval.ms", Type.INT, 5000, kinds=_C, minimum=0, maximum=86_400_000),
    Setting("enable.auto.offset.store", Type.BOOL, True, kinds=_C),
    Setting(
        "auto.offset.reset",
        Type.ENUM,
        "latest",
        kinds=_C,
        choices=_choices(
            "earliest",
            "latest",
            "error",
            smallest="earliest",
            beginning="earliest",
            largest="latest",
            end="latest",
        ),
    ),
    Setting("enable.partition.eof", Type.BOOL, False, kinds=_C),
    Setting("session.timeout.ms", Type.INT, 45_000, kinds=_C, minimum=1, maximum=3_600_000),
    Setting("heartbeat.interval.ms", Type.INT, 3000, kinds=_C, minimum=1, maximum=3_600_000),
    Setting("max.poll.interval.ms", Type.INT, 300_000, kinds=_C, minimum=1, maximum=86_400_000),
    Setting("fetch.max.bytes", Type.INT, 52_428_800, kinds=_C, minimum=0, maximum=2_147_483_135),
    Setting(
        "max.partition.fetch.bytes",
        Type.INT,
        1_048_576,
        kinds=_C,
        minimum=1,
        maximum=1_000_000_000,
        aliases=("fetch.message.max.bytes",),
    ),
    Setting("fetch.min.bytes", Type.INT, 1, kinds=_C, minimum=1, maximum=100_000_000),
    Setting("fetch.wait.max.ms", Type.INT, 500, kinds=_C, minimum=0, maximum=300_000),
    Setting(
        "partition.assignment.strategy",
        Type.ENUM,
        "range",
        kinds=_C,
        choices=_choices("range", "roundrobin", "cooperative-sticky"),
        multi=True,
    ),
    Setting("on_commit", Type.CALLABLE, kinds=_C),
)

SETTINGS: Mapping[str, Setting] = MappingProxyType({s.name: s for s in _SETTINGS})
ALIASES: Mapping[str, str] = MappingProxyType(
    {alias: s.name for s in _SETTINGS for alias in s.aliases}
)


def settings_for(kind: str) -> dict[str, Setting]:
    """The settings a client of ``kind`` uses, by canonical name."""
    return {name: s for name, s in SETTINGS.items() if kind in s.kinds}


def _invalid(key: str, value: object, why: str) -> KafkaException:
    return fail(
        KafkaError._INVALID_ARG,
        f'Invalid value "{value}" for configuration property "{key}": {why}',
    )


_TRUE = frozenset({"true", "t", "1"})
_FALSE = frozenset({"false", "f", "0"})


def _coerce_int(key: str, setting: Setting, value: object) -> int:
    if isinstance(value, bool):
        raise _invalid(key, value, "expected an integer")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str):
        try:
            number = int(value.strip(), 10)
        except ValueError:
            raise _invalid(key, value, "expected an integer") from None
    else:
        raise _invalid(key, value, f"expected an integer, not {type(value).__name__}")
    lo, hi = setting.minimum, setting.maximum
    if (lo is not None and number < lo) or (hi is not None and number > hi):
        raise fail(
            KafkaError._INVALID_ARG,
            f'Configuration property "{key}" value {number} is outside allowed range {lo}..{hi}',
        )
    return number


def _coerce_bool(key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
    raise _invalid(key, value, "expected true or false")


def _coerce_enum(key: str, setting: Setting, value: object) -> Any:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise _invalid(key, value, "expected a string")
    words = (
        [w.strip().lower() for w in str(value).split(",")]
        if setting.multi
        else [str(value).strip().lower()]
    )
    chosen: list[Any] = []
    for word in words:
        if word not in setting.choices:
            allowed = ", ".join(setting.choices)
            raise _invalid(key, value, f"expected one of: {allowed}")
        canonical = setting.choices[word]
        if canonical not in chosen:
            chosen.append(canonical)
    return ",".join(chosen) if setting.multi else chosen[0]


def _coerce(key: str, setting: Setting, value: object) -> Any:
    if setting.type is Type.INT:
        return _coerce_int(key, setting, value)
    if setting.type is Type.BOOL:
        return _coerce_bool(key, value)
    if setting.type is Type.ENUM:
        return _coerce_enum(key, setting, value)
    if setting.type is Type.CALLABLE:
        if not callable(value):
            raise _invalid(key, value, "expected a callable")
        return value
    if not isinstance(value, str):
        raise _invalid(key, value, f"expected a string, not {type(value).__name__}")
    if "\x00" in value:
        # PostgreSQL text cannot hold NUL: refuse it here, not as a driver error later.
        raise _invalid(key, value.replace("\x00", "\\0"), "must not contain NUL")
    return value


class ClientConfig(Mapping[str, Any]):
    """A validated, read-only config: every key of the client kind, defaults filled in.

    Lookups accept aliases (``delivery.timeout.ms`` reads ``message.timeout.ms``).
    ``is_set`` tells an explicit setting from a default, which some rules depend on.
    """

    __slots__ = ("_explicit", "_ignored", "_kind", "_values")

    def __init__(
        self,
        kind: str,
        values: Mapping[str, Any],
        explicit: frozenset[str],
        ignored: tuple[str, ...] = (),
    ) -> None:
        self._kind = kind
        self._values = MappingProxyType(dict(values))
        self._explicit = explicit
        self._ignored = ignored

    @property
    def kind(self) -> str:
        return self._kind

    @property
    def ignored(self) -> tuple[str, ...]:
        """Keys given but without effect here (compatibility keys, other kinds' keys)."""
        return self._ignored

    def _name(self, key: str) -> str:
        return ALIASES.get(key, key)

    def __getitem__(self, key: str) -> Any:
        return self._values[self._name(key)]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._name(key) in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def is_set(self, key: str) -> bool:
        """Whether the user gave this key (or an alias of it), as opposed to a default."""
        return self._name(key) in self._explicit

    def get_int(self, key: str) -> int:
        value = self[key]
        assert isinstance(value, int) and not isinstance(value, bool), key
        return value

    def get_bool(self, key: str) -> bool:
        value = self[key]
        assert isinstance(value, bool), key
        return value

    def get_str(self, key: str) -> str | None:
        value = self[key]
        assert value is None or isinstance(value, str), key
        return value

    def get_callable(self, key: str) -> Callable[..., Any] | None:
        value = self[key]
        assert value is None or callable(value), key
        return value

    def __repr__(self) -> str:
        shown = {k: v for k, v in self._values.items() if k in self._explicit}
        return f"ClientConfig({self._kind!r}, {shown!r})"


def parse_config(kind: str, config: Mapping[str, Any] | None) -> ClientConfig:
    """Validate a user's config dict for a client of ``kind`` (producer, consumer, admin)."""
    if kind not in KINDS:
        raise fail(KafkaError._INVALID_ARG, f"unknown client kind {kind!r}")
    if config is None:
        config = {}
    if not isinstance(config, Mapping):
        raise fail(KafkaError._INVALID_ARG, "config must be a dict")
    known = settings_for(kind)
    values: dict[str, Any] = {name: s.default for name, s in known.items()}
    explicit: set[str] = set()
    ignored: list[str] = []
    for key, raw in config.items():
        if not isinstance(key, str):
            raise fail(
                KafkaError._INVALID_ARG, f"configuration property names must be str: {key!r}"
            )
        name = ALIASES.get(key, key)
        setting = SETTINGS.get(name)
        if setting is None:
            raise fail(KafkaError._INVALID_ARG, f'No such configuration property: "{key}"')
        if raw is None:
            if setting.default is not None:
                raise _invalid(key, raw, "a value is required")
            value = None
        else:
            value = _coerce(key, setting, raw)
        if kind not in setting.kinds:
            log.warning(
                'Configuration property "%s" is a %s property and will be ignored by this %s',
                key,
                "/".join(sorted(setting.kinds)),
                kind,
            )
            ignored.append(key)
            continue
        if setting.ignored:
            ignored.append(key)
        values[name] = value
        if raw is not None:
            explicit.add(name)
        else:
            explicit.discard(name)
    if values.get("allow.auto.create.topics", False) is None:
        values["allow.auto.create.topics"] = kind == PRODUCER
    if kind == PRODUCER:
        _check_producer(values, explicit)
    if kind == CONSUMER:
        _check_consumer(values)
    return ClientConfig(kind, values, frozenset(explicit), tuple(ignored))


def _check_producer(values: dict[str, Any], explicit: set[str]) -> None:
    """Cross-key rules, modelled on the Java producer's and librdkafka's checks."""
    transactional = values["transactional.id"] is not None
    if transactional and not values["enable.idempotence"]:
        raise fail(
            KafkaError._INVALID_ARG,
            '"transactional.id" requires "enable.idempotence" to be true',
        )
    if values["enable.idempotence"]:
        insisted = transactional or "enable.idempotence" in explicit
        conflicts = []
        if values["acks"] != -1:
            conflicts.append('"acks" must be "all" when idempotence is enabled')
        if values["max.in.flight.requests.per.connection"] > 5:
            conflicts.append(
                '"max.in.flight.requests.per.connection" must be at most 5 '
                "when idempotence is enabled"
            )
        if values["retries"] == 0:
            conflicts.append('"retries" must be greater than 0 when idempotence is enabled')
        if conflicts and insisted:
            raise fail(KafkaError._INVALID_ARG, "; ".join(conflicts))
        if conflicts:
            log.warning("enable.idempotence turned off: %s", "; ".join(conflicts))
            values["enable.idempotence"] = False
    if transactional and values["message.timeout.ms"] > values["transaction.timeout.ms"]:
        if "message.timeout.ms" in explicit:
            raise fail(
                KafkaError._INVALID_ARG,
                '"message.timeout.ms" must be <= "transaction.timeout.ms" for a '
                "transactional producer",
            )
        # A record may not outlive the transaction that carries it.
        values["message.timeout.ms"] = values["transaction.timeout.ms"]
    timeout = values["message.timeout.ms"]
    if timeout and values["linger.ms"] >= timeout:
        raise fail(
            KafkaError._INVALID_ARG,
            '"message.timeout.ms" must be greater than "linger.ms"',
        )


def _check_consumer(values: dict[str, Any]) -> None:
    if values["heartbeat.interval.ms"] >= values["session.timeout.ms"]:
        raise fail(
            KafkaError._INVALID_ARG,
            '"heartbeat.interval.ms" must be lower than "session.timeout.ms"',
        )
