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


_PARSERS: dict[str, Callable[[Any], Any]] = {
    CLEANUP_POLICY: _policy,
    RETENTION_MS: _long(-1),  # -1: keep forever
    RETENTION_BYTES: _long(-1),
    DELETE_RETENTION_MS: _long(0),
    MIN_COMPACTION_LAG_MS: _long(0),
}
KNOWN_KEYS = tuple(_PARSERS)


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
        )


def effective(overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """Defaults with the stored overrides on top (unknown stored keys are ignored)."""
    out = dict(DEFAULTS)
    out.update({k: v for k, v in (overrides or {}).items() if k in DEFAULTS})
    return out


def altered(current: Mapping[str, Any], set_: Any, delete: Any = ()) -> dict[str, Any]:
    """kafka-configs.sh --add-config / --delete-config: the overrides after the change."""
    changes = validate_topic_config(set_)
    removed = list(delete or ())
    for key in removed:
        if key not in _PARSERS:
            raise fail(KafkaError.INVALID_CONFIG, f"unknown topic config {key!r}")
    out = {k: v for k, v in current.items() if k not in removed}
    out.update(changes)
    return out
