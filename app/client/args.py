"""Argument checks shared by the client APIs, so a wrong argument is a KafkaException
(``_INVALID_ARG``) naming it, never an AttributeError or a database error from deep inside.

PostgreSQL text cannot hold NUL, and no Kafka name may contain one, so a name with NUL is
refused here instead of failing as a driver error on its way to the database.
"""

from __future__ import annotations

from app.client.message import TopicPartition
from app.errors import KafkaError, KafkaException, fail


def _invalid(what: str, why: str) -> KafkaException:
    return fail(KafkaError._INVALID_ARG, f"{what}: {why}")


def name_arg(value: object, what: str) -> str:
    """A non-empty str without NUL (topic, group id, transactional id, state)."""
    if not isinstance(value, str) or not value:
        raise _invalid(what, f"expected a non-empty str, got {type(value).__name__}")
    if "\x00" in value:
        raise _invalid(what, "must not contain NUL")
    return value


def names_arg(value: object, what: str) -> list[str]:
    if not isinstance(value, list | tuple):
        raise _invalid(what, f"expected a list of str, got {type(value).__name__}")
    return [name_arg(v, what) for v in value]


def int_arg(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _invalid(what, f"expected an int, got {type(value).__name__}")
    return value


def partition_arg(value: object, what: str) -> TopicPartition:
    if not isinstance(value, TopicPartition):
        raise _invalid(what, f"expected a TopicPartition, got {type(value).__name__}")
    name_arg(value.topic, f"{what} topic")
    return value


def partitions_arg(value: object, what: str) -> list[TopicPartition]:
    if not isinstance(value, list | tuple):
        raise _invalid(what, f"expected a list of TopicPartition, got {type(value).__name__}")
    return [partition_arg(v, what) for v in value]
