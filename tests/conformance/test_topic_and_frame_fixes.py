"""Conformance: CreateTopics' replication factor and colliding names, a request with a null
where its schema has none, ApiVersions of a version not served."""

from __future__ import annotations

import struct
from typing import Any

from tests.conformance.harness import Observation, Target, same
from tests.conformance.normalise import stems
from tests.conformance.raw_calls import (
    API_VERSIONS,
    CREATE_TOPICS,
    METADATA,
    PRODUCE,
    call,
    error,
    flexible_frame,
    frame,
    log_end,
)


def _create(target: Target, name: str, rf: int = 1, partitions: int = 1) -> Any:
    """CreateTopics (v7) of one topic: its answer."""
    return call(target, CREATE_TOPICS, 7, {
        "topics": [{"name": name, "num_partitions": partitions, "replication_factor": rf,
                    "assignments": [], "configs": []}],
        "timeout": 30_000, "validate_only": False,
    }).topics[0]  # fmt: skip


def _exists(target: Target, topic: str) -> bool:
    return topic in target.admin().list_topics(timeout=30).topics


def _still_answers(target: Target) -> bool:
    answer = call(target, API_VERSIONS, 3, {"client_software_name": "t",
                                            "client_software_version": "1"})  # fmt: skip
    return bool(answer.error_code == 0 and answer.api_keys)


def scenario_replication_factor_zero_or_below_minus_one(target: Target) -> Observation:
    """A replication factor of 0 or -2 is INVALID_REPLICATION_FACTOR and creates nothing;
    -1 (the broker's default) creates the topic. A name taken comes first."""
    answers = {}
    for rf in (0, -2, -1):
        name = target.name_for(f"rf{rf}")
        answer = _create(target, name, rf=rf)
        answers[str(rf)] = {"error": error(answer.error_code),
                            "message": answer.error_message, "created": _exists(target, name)}  # fmt: skip
    taken = target.create_topic("rf-taken")
    answers["taken"] = {"error": error(_create(target, taken, rf=0).error_code)}
    zero_partitions = _create(target, target.name_for("rf-parts"), rf=0, partitions=0)
    answers["zero_partitions"] = {"error": error(zero_partitions.error_code)}
    return answers


def test_replication_factor_zero_or_below_minus_one(targets: Any) -> None:
    same(scenario_replication_factor_zero_or_below_minus_one, *targets)


def scenario_names_colliding_on_dot_and_underscore(target: Target) -> Observation:
    """After ``<n>.a``, ``<n>_a`` is INVALID_TOPIC_EXCEPTION naming the topic it collides
    with, and is not created; ``<n>.a`` again is TOPIC_ALREADY_EXISTS; ``<n>-a`` is
    another topic."""
    base = target.name_for("collide")
    dotted, underscored, dashed = f"{base}.a", f"{base}_a", f"{base}-a"
    first = _create(target, dotted)
    second = _create(target, underscored)
    again = _create(target, dotted)
    other = _create(target, dashed)
    return stems({
        "first": error(first.error_code),
        "second": [error(second.error_code), second.error_message],
        "second_created": _exists(target, underscored),
        "again": error(again.error_code),
        "dashed": error(other.error_code),
    })  # fmt: skip


def test_names_colliding_on_dot_and_underscore(targets: Any) -> None:
    same(scenario_names_colliding_on_dot_and_underscore, *targets)


def scenario_auto_creation_of_a_colliding_name(target: Target) -> Observation:
    """Metadata asking for ``<n>_a`` (auto-creation on) after ``<n>.a`` exists: not
    created."""
    base = target.name_for("autocollide")
    dotted, underscored = f"{base}.a", f"{base}_a"
    assert _create(target, dotted).error_code == 0
    answer = call(target, METADATA, 12, {
        "topics": [{"name": underscored}], "allow_auto_topic_creation": True,
        "include_topic_authorized_operations": False,
    })  # fmt: skip
    return {"error": error(answer.topics[0].error_code),
            "created": _exists(target, underscored)}  # fmt: skip


def test_auto_creation_of_a_colliding_name(targets: Any) -> None:
    same(scenario_auto_creation_of_a_colliding_name, *targets)


def scenario_a_null_where_the_schema_has_none(target: Target) -> Observation:
    """A Produce v3 whose topics array (non-nullable) has length -1: it cannot be read, so
    its connection closes unanswered, and the broker goes on answering."""
    topic = target.create_topic("null-array")
    closed = target.raw_bytes(frame(PRODUCE, 3, b"\xff" * 64)) is None
    return {"closed": closed, "end": log_end(target, topic),
            "answers_after": _still_answers(target)}  # fmt: skip


def test_a_null_where_the_schema_has_none(targets: Any) -> None:
    same(scenario_a_null_where_the_schema_has_none, *targets)


def _v0_keys(answer: bytes) -> list[tuple[int, int]]:
    """A v0 ApiVersions answer's keys (key, lowest): after the correlation id and the
    error code, a plain array of (key, lowest, highest)."""
    count = struct.unpack_from(">i", answer, 6)[0]
    return [struct.unpack_from(">hh", answer, 10 + 6 * i) for i in range(count)]


def scenario_api_versions_of_a_version_not_served(target: Target) -> Observation:
    """ApiVersions v99 with the flexible header a client sends from v3 on: a v0 answer,
    UNSUPPORTED_VERSION, listing ApiVersions alone. With a v1 header (no tagged fields),
    which v99's header version cannot read: the connection closes unanswered."""
    flexible = target.raw_bytes(flexible_frame(API_VERSIONS, 99, b"\x02t\x021\0"))
    assert flexible is not None
    code = struct.unpack_from(">h", flexible, 4)[0]
    keys = [k for k, _low in _v0_keys(flexible)]
    plain = target.raw_bytes(frame(API_VERSIONS, 99, b""))
    return {"flexible": [error(code), keys], "v1_header_closed": plain is None,
            "answers_after": _still_answers(target)}  # fmt: skip


def test_api_versions_of_a_version_not_served(targets: Any) -> None:
    same(scenario_api_versions_of_a_version_not_served, *targets)
