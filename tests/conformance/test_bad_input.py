"""Bad input, on both brokers: names a topic cannot have, a record over its size limit,
partitions there are not, acks Kafka does not know, versions not served, and frames that
are not requests. Each scenario also reads the partition's end afterwards: nothing of a
refused request is written."""

from __future__ import annotations

import struct
from typing import Any

from aiokafka.record.legacy_records import LegacyRecordBatchBuilder
from confluent_kafka import KafkaException
from confluent_kafka.admin import NewTopic

from tests.conformance.harness import Observation, Target, documented_difference, same
from tests.conformance.raw_calls import (
    API_VERSIONS,
    CREATE_TOPICS,
    FETCH,
    METADATA,
    PRODUCE,
    answered_within,
    batch,
    call,
    call_frame,
    error,
    flexible_frame,
    frame,
    log_end,
    offsets,
    produce,
    produced,
)

# Names no topic may have: a slash, the two dot names, one past the 249 characters.
BAD_NAMES = ("a/b", "..", ".", "a" * 250, "a b", "é")


def _created(target: Target, name: str, **topic: Any) -> str:
    """How a CreateTopics of ``name`` ends, as the admin client reports it."""
    new = NewTopic(name, topic.pop("num_partitions", 1), topic.pop("replication_factor", 1))
    admin = target.admin()
    try:
        admin.create_topics([new], **topic)[name].result(30)
    except KafkaException as exc:
        return str(exc.args[0].name())
    return "NO_ERROR"


def scenario_invalid_topic_names_are_refused_on_creation(target: Target) -> Observation:
    refused = {name[:12]: _created(target, name) for name in BAD_NAMES}
    listed = set(target.admin().list_topics(timeout=30).topics)
    return {"refused": refused, "created": sorted(n[:12] for n in BAD_NAMES if n in listed)}


def test_invalid_topic_names_are_refused_on_creation(targets: Any) -> None:
    same(scenario_invalid_topic_names_are_refused_on_creation, *targets)


def scenario_invalid_topic_names_in_metadata_are_not_created(target: Target) -> Observation:
    """A Metadata request that may create topics, naming ones no topic may have: each is
    answered INVALID_TOPIC_EXCEPTION and none is made."""
    asked = [{"name": n, "topic_id": None} for n in ("a/b", "..", "a" * 250)]
    answer = call(target, METADATA, 12, {
        "topics": asked, "allow_auto_topic_creation": True,
        "include_topic_authorized_operations": False,
    })  # fmt: skip
    return sorted((t.name[:12], error(t.error_code), len(t.partitions)) for t in answer.topics)


def test_invalid_topic_names_in_metadata_are_not_created(targets: Any) -> None:
    same(scenario_invalid_topic_names_in_metadata_are_not_created, *targets)


def scenario_a_record_over_max_message_bytes(target: Target) -> Observation:
    """A batch over the topic's ``max.message.bytes`` is refused whole, MESSAGE_TOO_LARGE;
    one under it is written after."""
    topic = target.create_topic("too-large", config={"max.message.bytes": "1000"})
    big = produced(produce(target, topic, 0, batch([b"x" * 2000])))
    end_after_big = log_end(target, topic)
    small = produced(produce(target, topic, 0, batch([b"y" * 100])))
    return {"big": [e for e, _ in big], "end_after_big": end_after_big,
            "small": small, "end": log_end(target, topic)}  # fmt: skip


def test_a_record_over_max_message_bytes(targets: Any) -> None:
    same(scenario_a_record_over_max_message_bytes, *targets)


def scenario_produce_to_a_partition_there_is_not(target: Target) -> Observation:
    """A Produce names no topic into being: an unknown topic, and an unknown partition of
    a topic there is, are UNKNOWN_TOPIC_OR_PARTITION; nothing is written or created."""
    topic = target.create_topic("two-parts", partitions=2)
    missing = target.name_for("never-made")
    answers = {
        "unknown_topic": [e for e, _ in produced(produce(target, missing, 0, batch([b"a"])))],
        "unknown_partition": [e for e, _ in produced(produce(target, topic, 2, batch([b"a"])))],
        "negative_partition": [e for e, _ in produced(produce(target, topic, -1, batch([b"a"])))],
    }
    listed = target.admin().list_topics(timeout=30).topics
    return {**answers, "created": missing in listed,
            "ends": [log_end(target, topic, p) for p in (0, 1)]}  # fmt: skip


def test_produce_to_a_partition_there_is_not(targets: Any) -> None:
    same(scenario_produce_to_a_partition_there_is_not, *targets)


def scenario_invalid_acks(target: Target) -> Observation:
    """acks other than -1, 0 and 1 is INVALID_REQUIRED_ACKS for every partition, nothing
    written."""
    topic = target.create_topic("acks")
    answers = {
        acks: [e for e, _ in produced(produce(target, topic, 0, batch([b"a"]), acks=acks))]
        for acks in (2, -2, 5)
    }
    return {"answers": answers, "end": log_end(target, topic)}


def test_invalid_acks(targets: Any) -> None:
    same(scenario_invalid_acks, *targets)


def _legacy_batch() -> bytes:
    """A message set of message format v1 (before record batches)."""
    builder = LegacyRecordBatchBuilder(1, 0, 2**20)
    builder.append(0, 1_700_000_000_000, None, b"v")
    return bytes(builder.build())


def scenario_produce_of_bytes_that_are_not_a_batch(target: Target) -> Observation:
    """A Produce whose records are empty, bytes holding no whole batch, a batch cut
    short, two batches, or a message set of format v1: each refused, nothing written."""
    topic = target.create_topic("no-records")
    whole = batch([b"a", b"b"])
    cases = {
        "empty": b"", "garbage": b"\x01" * 70, "cut_short": whole[:-3],
        "too_short_a_batch": b"\0" * 8 + b"\0\0\0\x05" + b"\0" * 60,
        "two_batches": whole + whole, "format_v1": _legacy_batch(),
    }  # fmt: skip
    answers = {
        name: [e for e, _ in produced(produce(target, topic, 0, records))]
        for name, records in cases.items()
    }
    return {"answers": answers, "end": log_end(target, topic)}


def test_produce_of_bytes_that_are_not_a_batch(targets: Any) -> None:
    same(scenario_produce_of_bytes_that_are_not_a_batch, *targets)


def scenario_produce_with_null_records(target: Target) -> Observation:
    """A Produce whose partition's records are null (the schema allows it): Kafka never
    answers it (the connection stays open, silent); kip98 answers INVALID_RECORD. Either
    way nothing is written. A silent Kafka is observed as no answer within a short wait."""
    topic = target.create_topic("null-records")
    body = call_frame(PRODUCE, 9, {
        "transactional_id": None, "acks": -1, "timeout": 30_000,
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": None}]}],
    })  # fmt: skip
    answer = answered_within(target, body, 5.0)
    return {"answered": answer is not None, "end": log_end(target, topic)}


def test_produce_with_null_records(targets: Any) -> None:
    documented_difference(
        "produce-null-records", scenario_produce_with_null_records, *targets,
        kip98_expected={"answered": True, "end": 0},
        kafka_expected={"answered": False, "end": 0},
    )  # fmt: skip


def scenario_a_corrupt_batch(target: Target) -> Observation:
    """A batch whose CRC does not match its bytes is CORRUPT_MESSAGE, nothing written."""
    topic = target.create_topic("corrupt")
    good = bytearray(batch([b"value"]))
    good[-1] ^= 0xFF  # the value's last byte: the CRC no longer holds
    answer = produced(produce(target, topic, 0, bytes(good)))
    return {"answer": [e for e, _ in answer], "end": log_end(target, topic)}


def test_a_corrupt_batch(targets: Any) -> None:
    same(scenario_a_corrupt_batch, *targets)


def scenario_list_offsets_of_a_partition_there_is_not(target: Target) -> Observation:
    topic = target.create_topic("one-part")
    return {"partition": offsets(target, topic, 1),
            "topic": offsets(target, target.name_for("never-made"), 0)}  # fmt: skip


def test_list_offsets_of_a_partition_there_is_not(targets: Any) -> None:
    same(scenario_list_offsets_of_a_partition_there_is_not, *targets)


def _fetch(target: Target, topic: str, partition: int, offset: int) -> list[Any]:
    """A Fetch (v12) of one partition from ``offset``: its error, high watermark, and
    whether records came."""
    answer = call(target, FETCH, 12, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1_000_000,
        "isolation_level": 0, "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": topic, "partitions": [{
            "partition": partition, "current_leader_epoch": -1, "fetch_offset": offset,
            "last_fetched_epoch": -1, "log_start_offset": -1,
            "partition_max_bytes": 100_000}]}],
        "forgotten_topics_data": [], "rack_id": "",
    })  # fmt: skip
    p = answer.responses[0].partitions[0]
    return [error(p.error_code), p.high_watermark, bool(p.records)]


def scenario_fetch_and_metadata_out_of_bounds(target: Target) -> Observation:
    """A Fetch past the high watermark or before the log start is OFFSET_OUT_OF_RANGE
    (no bounds given), at the high watermark empty; a partition there is not is
    UNKNOWN_TOPIC_OR_PARTITION; a Metadata request that may not create topics answers
    an unknown one UNKNOWN_TOPIC_OR_PARTITION and creates nothing."""
    topic = target.create_topic("fetch-bounds")
    produce(target, topic, 0, batch([b"a", b"b"]))
    missing = target.name_for("never-made")
    answer = call(target, METADATA, 12, {
        "topics": [{"name": missing, "topic_id": None}], "allow_auto_topic_creation": False,
        "include_topic_authorized_operations": False,
    })  # fmt: skip
    return {
        "beyond": _fetch(target, topic, 0, 5), "at_end": _fetch(target, topic, 0, 2),
        "negative": _fetch(target, topic, 0, -5), "from_start": _fetch(target, topic, 0, 0),
        "no_partition": _fetch(target, topic, 3, 0),
        "metadata": [error(t.error_code) for t in answer.topics],
        "created": missing in target.admin().list_topics(timeout=30).topics,
    }  # fmt: skip


def test_fetch_and_metadata_out_of_bounds(targets: Any) -> None:
    same(scenario_fetch_and_metadata_out_of_bounds, *targets)


def _create(target: Target, name: str) -> str:
    answer = call(target, CREATE_TOPICS, 7, {
        "topics": [{"name": name, "num_partitions": 1, "replication_factor": 1,
                    "assignments": [], "configs": []}],
        "timeout": 30_000, "validate_only": False,
    })  # fmt: skip
    return error(answer.topics[0].error_code)


def scenario_names_starting_with_two_underscores(target: Target) -> Observation:
    """A topic named with Kafka's internal prefix ``__``: Kafka creates it (an internal
    topic's own name is TOPIC_ALREADY_EXISTS); kip98 reserves the prefix."""
    name = "__" + target.name_for("underscored")
    return {"new": _create(target, name), "offsets_topic": _create(target, "__consumer_offsets")}


def test_names_starting_with_two_underscores(targets: Any) -> None:
    documented_difference(
        "reserved-topic-prefix", scenario_names_starting_with_two_underscores, *targets,
        kip98_expected={"new": "INVALID_TOPIC_EXCEPTION",
                        "offsets_topic": "INVALID_TOPIC_EXCEPTION"},
        kafka_expected={"new": "NONE", "offsets_topic": "TOPIC_ALREADY_EXISTS"},
    )  # fmt: skip


def _still_answers(target: Target) -> bool:
    """A new connection is answered (the broker is not harmed by what came before)."""
    answer = call(target, API_VERSIONS, 3, {"client_software_name": "t",
                                            "client_software_version": "1"})  # fmt: skip
    return bool(answer.error_code == 0 and answer.api_keys)


def _produce_body(topic: str) -> bytes:
    """A Produce v3 body (acks=1) of one batch to partition 0 of ``topic``."""
    records = batch([b"a"])
    name = topic.encode()
    return (
        b"\xff\xff"  # transactional id: null
        + (1).to_bytes(2, "big", signed=True)
        + (30_000).to_bytes(4, "big")
        + (1).to_bytes(4, "big")
        + len(name).to_bytes(2, "big")
        + name
        + (1).to_bytes(4, "big")
        + (0).to_bytes(4, "big")
        + len(records).to_bytes(4, "big")
        + records
    )


def scenario_a_version_not_served_closes_the_connection(target: Target) -> Observation:
    """A Produce of a version no broker has: the connection is closed, unanswered, and
    nothing is written; ApiVersions of a version past the broker's is answered in
    version 0 with UNSUPPORTED_VERSION and the versions there are."""
    topic = target.create_topic("versions")
    closed = target.raw_bytes(frame(PRODUCE, 99, _produce_body(topic))) is None
    # As a client sends it: ApiVersions v3 and later have the flexible request header.
    api_versions = target.raw_bytes(flexible_frame(API_VERSIONS, 99, b"\x02t\x021\0"))
    assert api_versions is not None
    code = int.from_bytes(api_versions[4:6], "big", signed=True)  # after the correlation id
    return {"produce_closed": closed, "api_versions": error(code),
            "api_versions_range": _api_versions_range(api_versions[6:]),
            "end": log_end(target, topic), "answers_after": _still_answers(target)}  # fmt: skip


def _api_versions_range(keys: bytes) -> list[int] | None:
    """The lowest version of ApiVersions itself in a v0 answer's list of keys (a plain
    array of key, lowest, highest): what a client needs to ask again."""
    count = int.from_bytes(keys[:4], "big")
    for i in range(count):
        key, low, _high = struct.unpack_from(">hhh", keys, 4 + 6 * i)
        if key == API_VERSIONS:
            return [low]
    return None


def test_a_version_not_served_closes_the_connection(targets: Any) -> None:
    same(scenario_a_version_not_served_closes_the_connection, *targets)


def scenario_a_request_that_cannot_be_read_closes_the_connection(target: Target) -> Observation:
    """Bytes that are not a request: a body cut short, garbage for a known API, an API key
    there is not, a header cut short, a size below zero or over socket.request.max.bytes
    (100 MiB). Each closes its connection unanswered; nothing is written and the broker
    answers the next connection."""
    topic = target.create_topic("garbage")
    whole = _produce_body(topic)
    frames = {
        "truncated_body": frame(PRODUCE, 3, whole[: len(whole) // 2]),
        "garbage_body": frame(PRODUCE, 3, b"\x7f" * 64),
        "garbage_flexible_body": flexible_frame(METADATA, 12, b"\xff" * 16),
        "unknown_api_key": frame(999, 0, b""),
        "short_header": b"\0\0\0\x03\0\0\0",
        "negative_size": b"\xff\xff\xff\xf0" + b"\0" * 16,
        "over_the_size_limit": struct.pack(">i", 200_000_000) + b"\0" * 16,
    }
    answered = {name: target.raw_bytes(f) is not None for name, f in frames.items()}
    return {"answered": answered, "end": log_end(target, topic),
            "answers_after": _still_answers(target)}  # fmt: skip


def test_a_request_that_cannot_be_read_closes_the_connection(targets: Any) -> None:
    same(scenario_a_request_that_cannot_be_read_closes_the_connection, *targets)
