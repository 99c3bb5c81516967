"""Topic configs that govern cleaning: Kafka's names, defaults and validation, as pure rules.

Only overrides are stored (``topics.config``), as Kafka stores a topic's dynamic configs;
``effective`` lays them over the defaults. Values are accepted as Kafka's tools send them
(strings) or as Python values, and stored canonically (policy as a string, numbers as
integers) so SQL and the cleaner read them without parsing again.
"""

from __future__ import annotations

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

DELETE = "delete"
COMPACT = "compact"
_POLICIES = {
    (DELETE,): DELETE,
    (COMPACT,): COMPACT,
    (COMPACT, DELETE): "compact,delete",
}

DEFAULTS: dict[str, Any] = {
    CLEANUP_POLICY: DELETE,
    RETENTION_MS: 604_800_000,  # 7 days (Kafka: log.retention.hours=168)
    RETENTION_BYTES: -1,  # no size limit
    DELETE_RETENTION_MS: 86_400_000,  # 1 day
    MIN_COMPACTION_LAG_MS: 0,
    MIN_CLEANABLE_DIRTY_RATIO: 0.5,
}


def _policy(raw: Any) -> str:
    if not isinstance(raw, str):
        raise ValueError("expected a comma-separated list of delete and compact")
    parts = tuple(sorted({p.strip() for p in raw.split(",") if p.strip()}))
    if parts not in _POLICIES:
        raise ValueError("expected delete, compact or delete,compact")
    return _POLICIES[parts]


def _long(minimum: int) -> Callable[[Any], int]:
    def parse(raw: Any) -> int:
        if isinstance(raw, bool) or not isinstance(raw, int | str):
            raise ValueError("expected an integer")
        try:
            value = int(raw)
        except ValueError:
            raise ValueError("expected an integer") from None
        if value < minimum or value > 2**63 - 1:
            raise ValueError(f"expected an integer >= {minimum}")
        return value

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


_PARSERS: dict[str, Callable[[Any], Any]] = {
    CLEANUP_POLICY: _policy,
    RETENTION_MS: _long(-1),  # -1: keep forever
    RETENTION_BYTES: _long(-1),
    DELETE_RETENTION_MS: _long(0),
    MIN_COMPACTION_LAG_MS: _long(0),
    MIN_CLEANABLE_DIRTY_RATIO: _ratio,
}
KNOWN_KEYS = tuple(_PARSERS)
# The configs whose value is a list (Kafka's ConfigDef.Type.LIST): IncrementalAlterConfigs
# may append to them and subtract from them.
LIST_KEYS = (CLEANUP_POLICY,)


def validate_topic_config(config: Any) -> dict[str, Any]:
    """Canonical overrides, or INVALID_CONFIG naming the first bad key or value."""
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise fail(KafkaError.INVALID_CONFIG, f"topic config must be a dict, got {config!r}")
    out: dict[str, Any] = {}
    for key, raw in config.items():
        parser = _PARSERS.get(key) if isinstance(key, str) else None
        if parser is None:
            raise fail(
                KafkaError.INVALID_CONFIG,
                f"unknown topic config {key!r} (known: {', '.join(KNOWN_KEYS)})",
            )
        try:
            out[key] = parser(raw)
        except ValueError as exc:
            raise fail(KafkaError.INVALID_CONFIG, f"invalid {key}={raw!r}: {exc}") from None
    return out


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
        if key not in _PARSERS:
            raise fail(KafkaError.INVALID_CONFIG, f"unknown topic config {key!r}")
    out = {k: v for k, v in current.items() if k not in removed}
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
