"""Name rules, as pure functions: Kafka's topic rules, plus reserved internal names."""

from __future__ import annotations

import re

from app.errors import KafkaError, KafkaException, fail

MAX_TOPIC_LENGTH = 249
MAX_PARTITIONS = 10_000
_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")
RESERVED_PREFIX = "__"


def validate_topic_name(name: object, allow_internal: bool = False) -> str:
    if not isinstance(name, str) or not name:
        raise fail(KafkaError.INVALID_TOPIC_EXCEPTION, "topic name must be a non-empty string")
    if name in (".", ".."):
        raise fail(KafkaError.INVALID_TOPIC_EXCEPTION, f"topic name cannot be {name!r}")
    if len(name) > MAX_TOPIC_LENGTH:
        raise fail(
            KafkaError.INVALID_TOPIC_EXCEPTION,
            f"topic name is {len(name)} characters; the limit is {MAX_TOPIC_LENGTH}",
        )
    if not _LEGAL.fullmatch(name):
        raise fail(
            KafkaError.INVALID_TOPIC_EXCEPTION,
            f"topic name {name!r} may contain only ASCII letters, digits, '.', '_' and '-'",
        )
    if name.startswith(RESERVED_PREFIX) and not allow_internal:
        raise fail(
            KafkaError.INVALID_TOPIC_EXCEPTION,
            f"topic names starting with {RESERVED_PREFIX!r} are reserved",
        )
    return name


def unify_collision_chars(name: str) -> str:
    """The name two colliding topic names share: '.' and '_' made one ('_'), as Kafka's
    ``Topic.unifyCollisionChars`` makes them."""
    return name.replace(".", "_")


def validate_num_partitions(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PARTITIONS:
        raise fail(
            KafkaError.INVALID_PARTITIONS,
            f"num_partitions must be an integer from 1 to {MAX_PARTITIONS}, got {n!r}",
        )
    return n


def could_exist(name: object) -> bool:
    """Whether a topic of this name could exist (a legal name, internal ones included): a
    lookup of any other needs no database to answer that it does not."""
    try:
        validate_topic_name(name, allow_internal=True)
    except KafkaException:
        return False
    return True
