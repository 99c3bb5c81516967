"""Message and TopicPartition behave like confluent-kafka's."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.client import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    OFFSET_STORED,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from app.client.message import (
    FetchedMessage,
    decode_headers,
    encode_headers,
    normalize_headers,
    to_bytes,
)


def _code(info: pytest.ExceptionInfo[KafkaException]) -> int:
    return info.value.args[0].code()


def test_constants() -> None:
    assert (OFFSET_BEGINNING, OFFSET_END, OFFSET_STORED, OFFSET_INVALID) == (-2, -1, -1000, -1001)
    assert (TIMESTAMP_NOT_AVAILABLE, TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME) == (0, 1, 2)


# --- to_bytes ----------------------------------------------------------------------------


def test_to_bytes_accepts_bytes_str_none() -> None:
    assert to_bytes("key", b"\x00\xff") == b"\x00\xff"
    assert to_bytes("key", "héllo") == "héllo".encode()
    assert to_bytes("key", None) is None
    assert to_bytes("value", bytearray(b"ab")) == b"ab"
    assert to_bytes("value", memoryview(b"cd")) == b"cd"


@pytest.mark.parametrize("bad", [1, 1.5, object(), ["a"], {"a": 1}, True])
def test_to_bytes_rejects_other_types_naming_the_argument(bad: object) -> None:
    with pytest.raises(KafkaException) as info:
        to_bytes("value", bad)
    assert _code(info) == KafkaError._INVALID_ARG
    assert "value" in info.value.args[0].str()


# --- headers -----------------------------------------------------------------------------


def test_headers_from_list_and_dict() -> None:
    assert normalize_headers([("a", b"1"), ("b", "2"), ("c", None), ("a", b"3")]) == [
        ("a", b"1"),
        ("b", b"2"),
        ("c", None),
        ("a", b"3"),
    ]
    assert normalize_headers({"x": "y", "z": None}) == [("x", b"y"), ("z", None)]
    assert normalize_headers(None) == []


@pytest.mark.parametrize(
    "bad",
    [
        [(1, b"v")],
        [("k", 5)],
        [("k",)],
        ["kv"],
        "k=v",
        b"k=v",
        5,
    ],
)
def test_bad_headers_are_invalid_arg(bad: object) -> None:
    with pytest.raises(KafkaException) as info:
        normalize_headers(bad)  # type: ignore[arg-type]
    assert _code(info) == KafkaError._INVALID_ARG


def test_encode_headers_is_json_with_base64_values() -> None:
    encoded = encode_headers([("k", b"\x00\x01"), ("n", None), ("s", "txt")])
    assert encoded == [
        {"key": "k", "value": "AAE="},
        {"key": "n", "value": None},
        {"key": "s", "value": "dHh0"},
    ]
    assert json.loads(json.dumps(encoded)) == encoded
    assert encode_headers(None) == []


def test_decode_headers_accepts_json_text_and_none() -> None:
    text = json.dumps([{"key": "k", "value": "AAE="}, {"key": "n", "value": None}])
    assert decode_headers(text) == [("k", b"\x00\x01"), ("n", None)]
    assert decode_headers(None) == []
    assert decode_headers("null") == []


@pytest.mark.parametrize("bad", [[{"value": None}], [{"key": "k", "value": "!!"}], [5]])
def test_decode_headers_rejects_malformed_storage(bad: object) -> None:
    with pytest.raises(KafkaException) as info:
        decode_headers(bad)  # type: ignore[arg-type]
    assert _code(info) == KafkaError._BAD_MSG


header_lists = st.lists(
    st.tuples(st.text(max_size=10), st.one_of(st.none(), st.binary(max_size=20)))
)


@given(header_lists)
def test_headers_round_trip(headers: list[tuple[str, bytes | None]]) -> None:
    stored = json.dumps(encode_headers(headers))
    assert decode_headers(stored) == headers


# --- Message -----------------------------------------------------------------------------


def test_message_accessors() -> None:
    msg = Message(
        topic="t",
        partition=2,
        offset=40,
        key=b"k",
        value=b"hello",
        headers=[("h", "v")],
        timestamp=1234,
        timestamp_type=TIMESTAMP_CREATE_TIME,
        leader_epoch=3,
    )
    assert msg.topic() == "t"
    assert msg.partition() == 2
    assert msg.offset() == 40
    assert msg.key() == b"k"
    assert msg.value() == b"hello"
    assert msg.headers() == [("h", b"v")]
    assert msg.timestamp() == (TIMESTAMP_CREATE_TIME, 1234)
    assert msg.error() is None
    assert msg.leader_epoch() == 3
    assert msg.latency() is None
    assert msg.len() == 5 == len(msg)
    assert "t" in repr(msg)


def test_message_defaults_and_error_event() -> None:
    err = KafkaError(KafkaError._PARTITION_EOF)
    msg = Message(topic="t", partition=0, offset=7, error=err)
    assert msg.error() == KafkaError._PARTITION_EOF
    assert msg.value() is None and msg.key() is None
    assert msg.headers() is None
    assert msg.timestamp() == (TIMESTAMP_NOT_AVAILABLE, -1)
    assert len(msg) == 0
    assert "error" in repr(msg)


def test_message_constructor_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        Message("t")  # type: ignore[call-arg]


def test_message_headers_returns_a_copy_and_setters_coerce() -> None:
    msg = Message(topic="t", headers={"a": b"1"})
    got = msg.headers()
    assert got is not None
    got.append(("b", b"2"))
    assert msg.headers() == [("a", b"1")]
    msg.set_value("v")
    msg.set_key("k")
    msg.set_headers([])
    assert (msg.value(), msg.key(), msg.headers()) == (b"v", b"k", None)
    with pytest.raises(KafkaException):
        msg.set_value(3)


# --- FetchedMessage (a consumed record, headers decoded lazily) --------------------------


def fetched(headers: str | None) -> FetchedMessage:
    return FetchedMessage("t", 3, (41, 1234, b"k", b"val", headers, 9))


def test_fetched_message_is_a_message_with_the_same_accessors() -> None:
    msg = fetched(None)
    assert isinstance(msg, Message)
    assert (msg.topic(), msg.partition(), msg.offset()) == ("t", 3, 41)
    assert (msg.key(), msg.value(), msg.len()) == (b"k", b"val", 3)
    assert msg.timestamp() == (TIMESTAMP_CREATE_TIME, 1234)
    assert msg.error() is None and msg.leader_epoch() is None and msg.latency() is None
    assert msg.headers() is None
    assert repr(msg).startswith("Message(topic='t', partition=3, offset=41")


@pytest.mark.parametrize("stored", [None, "[]", "null"])
def test_fetched_message_without_headers_reports_none(stored: str | None) -> None:
    assert fetched(stored).headers() is None


def test_fetched_message_decodes_headers_when_asked_and_returns_copies() -> None:
    headers = [("a", b"\x00\x01"), ("n", None), ("a", b"2")]
    msg = fetched(json.dumps(encode_headers(headers)))
    got = msg.headers()
    assert got == headers == Message(headers=headers).headers()
    assert got is not None
    got.append(("x", b"y"))
    assert msg.headers() == headers


def test_fetched_message_setters_replace_stored_headers_and_payload() -> None:
    msg = fetched(json.dumps(encode_headers([("a", b"1")])))
    msg.set_headers({"b": "2"})
    assert msg.headers() == [("b", b"2")]
    msg.set_headers(None)
    assert msg.headers() is None
    msg.set_key("kk")
    msg.set_value(b"vv")
    assert (msg.key(), msg.value()) == (b"kk", b"vv")


def test_fetched_message_with_malformed_stored_headers_fails_only_on_headers() -> None:
    msg = fetched(json.dumps([{"key": "k", "value": "!!"}]))
    assert msg.value() == b"val"
    with pytest.raises(KafkaException) as info:
        msg.headers()
    assert _code(info) == KafkaError._BAD_MSG


@given(header_lists)
def test_fetched_headers_equal_what_a_message_built_from_them_returns(
    headers: list[tuple[str, bytes | None]],
) -> None:
    stored = json.dumps(encode_headers(headers)) if headers else None
    assert fetched(stored).headers() == Message(headers=headers).headers()


# --- TopicPartition ----------------------------------------------------------------------


def test_topic_partition_defaults() -> None:
    tp = TopicPartition("t")
    assert (tp.topic, tp.partition, tp.offset, tp.metadata, tp.error) == (
        "t",
        -1,
        OFFSET_INVALID,
        None,
        None,
    )
    assert tp.leader_epoch is None


def test_topic_partition_equality_ignores_offset() -> None:
    a = TopicPartition("t", 1, 5)
    b = TopicPartition("t", 1, 9, metadata="m")
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1
    assert a != TopicPartition("t", 2, 5)
    assert a != ("t", 1)


def test_topic_partition_ordering() -> None:
    tps = [TopicPartition("b", 0), TopicPartition("a", 10), TopicPartition("a", 2)]
    assert [(tp.topic, tp.partition) for tp in sorted(tps)] == [("a", 2), ("a", 10), ("b", 0)]
    assert TopicPartition("a", 1) < TopicPartition("a", 2) <= TopicPartition("a", 2)
    assert TopicPartition("b", 0) > TopicPartition("a", 9) >= TopicPartition("a", 9)


def test_topic_partition_attributes_are_mutable_and_repr_readable() -> None:
    tp = TopicPartition("orders", 3)
    tp.offset = 42
    tp.error = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PARTITION)
    text = repr(tp)
    assert "orders" in text and "partition=3" in text and "offset=42" in text
    assert "UNKNOWN_TOPIC_OR_PARTITION" in text
    assert str(tp) == text


def test_topic_partition_rejects_non_str_topic() -> None:
    with pytest.raises(KafkaException) as info:
        TopicPartition(5)  # type: ignore[arg-type]
    assert _code(info) == KafkaError._INVALID_ARG
