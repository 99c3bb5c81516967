"""The feature levels ApiVersions v3+ gives (KIP-584), which Kafka's Admin reads back as
DescribeFeatures, and Kafka 4 clients read to choose a protocol.

kip98 lists the two features its clients act on, under Kafka 4.4's names:

- ``group.version`` 0-1, finalized 1: the consumer group protocol (KIP-848) is served;
- ``transaction.version`` 0-2, finalized 2: KIP-890's transaction version 2, which Kafka
  4 producers then speak (Produce v12+ adding its partitions, EndTxn v5+ bumping the epoch
  at every transaction's end, TxnOffsetCommit v5+ adding the group's offsets; level 1
  changes only Kafka's own transaction log records).

``KIP98_FEATURES`` (``group.version=0``) pins a lower finalized level, as Kafka's
``kafka-features downgrade`` does: with ``group.version`` 0 ConsumerGroupHeartbeat and
ConsumerGroupDescribe answer UNSUPPORTED_VERSION, as Kafka's do; with
``transaction.version=1`` Kafka 4 producers keep the first transaction protocol (their
builders cap EndTxn at v4, Produce at v11), while the versions served stay as they are,
as Kafka's broker serves them whatever the level. Kafka leaves a feature
finalized at level 0 out of the finalized list; so does kip98. The finalized epoch is the
time the process read its settings, so a node restarted with a new level is seen as newer
by a client that cached the old one (Kafka's is the metadata log offset).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from app.errors import KafkaError, fail

GROUP_VERSION = "group.version"
TRANSACTION_VERSION = "transaction.version"

# name -> (lowest supported, highest supported): what this kip98 serves.
SUPPORTED: dict[str, tuple[int, int]] = {
    GROUP_VERSION: (0, 1),
    TRANSACTION_VERSION: (0, 2),
}


@dataclass(frozen=True)
class Features:
    finalized: dict[str, int]
    epoch: int

    def level(self, name: str) -> int:
        return self.finalized.get(name, 0)

    @property
    def consumer_protocol(self) -> bool:
        """Whether KIP-848's consumer groups are served (Kafka's GroupVersion 1)."""
        return self.level(GROUP_VERSION) >= 1


def parse_features(text: str) -> dict[str, int]:
    """The finalized levels with ``text``'s pins applied: every supported feature at its
    highest level unless pinned lower. An unknown name or a level outside the supported
    range is refused, naming the setting."""
    levels = {name: high for name, (_, high) in SUPPORTED.items()}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or name not in SUPPORTED or not raw.strip().lstrip("-").isdigit():
            raise fail(
                KafkaError.INVALID_CONFIG,
                f"KIP98_FEATURES: {item!r} is not NAME=LEVEL of {sorted(SUPPORTED)}",
            )
        low, high = SUPPORTED[name]
        level = int(raw)
        if not low <= level <= high:
            raise fail(
                KafkaError.INVALID_CONFIG,
                f"KIP98_FEATURES: {name} level {level} is outside the supported {low}-{high}",
            )
        levels[name] = level
    return levels


def features_from(text: str) -> Features:
    return Features(parse_features(text), int(time.time() * 1000))


def api_versions_features(features: Features, version: int) -> dict[str, object]:
    """The feature fields of an ApiVersions answer of ``version``: before v4 a supported
    feature whose lowest level is 0 is left out, as Kafka's answer leaves it out."""
    supported = [
        {"name": name, "min_version": low, "max_version": high}
        for name, (low, high) in SUPPORTED.items()
        if version >= 4 or low > 0
    ]
    finalized = [
        {"name": name, "min_version_level": level, "max_version_level": level}
        for name, level in features.finalized.items()
        if level > 0
    ]
    return {
        "supported_features": supported,
        "finalized_features_epoch": features.epoch,
        "finalized_features": finalized,
    }


_cached: dict[str, Features] = {}


def features_of(settings_text: str) -> Features:
    """The process's features for its ``KIP98_FEATURES`` (read once, so its epoch stays)."""
    found = _cached.get(settings_text)
    if found is None:
        found = _cached[settings_text] = features_from(settings_text)
    return found
