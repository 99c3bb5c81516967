"""Client configs are checked the way confluent-kafka/librdkafka check them."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.config import (
    ADMIN,
    CONSUMER,
    INT32_MAX,
    PRODUCER,
    SETTINGS,
    ClientConfig,
    Type,
    parse_config,
    settings_for,
)
from app.errors import KafkaError, KafkaException


def _error(kind: str, config: dict[str, Any]) -> str:
    with pytest.raises(KafkaException) as info:
        parse_config(kind, config)
    err = info.value.args[0]
    assert err.code() == KafkaError._INVALID_ARG
    text: str = err.str()
    return text


# --- defaults ----------------------------------------------------------------------------


def test_producer_defaults() -> None:
    cfg = parse_config(PRODUCER, {})
    assert cfg.kind == PRODUCER
    assert cfg["enable.idempotence"] is True
    assert cfg["transaction.timeout.ms"] == 60_000
    assert cfg["linger.ms"] == 5
    assert cfg["batch.num.messages"] == 10_000
    assert cfg["batch.size"] == 1_000_000
    assert cfg["message.max.bytes"] == 1_000_000
    assert cfg["acks"] == -1
    assert cfg["retries"] == INT32_MAX
    assert cfg["retry.backoff.ms"] == 100
    assert cfg["message.timeout.ms"] == 300_000
    assert cfg["queue.buffering.max.messages"] == 100_000
    assert cfg["request.timeout.ms"] == 30_000
    assert cfg["max.in.flight.requests.per.connection"] == 1
    assert cfg["partitioner"] == "murmur2_random"
    assert cfg["compression.type"] == "none"
    assert cfg["transactional.id"] is None
    assert cfg["database.url"] is None
    assert cfg["client.id"] == "rdkafka"
    assert "group.id" not in cfg
    assert not cfg.is_set("linger.ms")


def test_consumer_defaults() -> None:
    cfg = parse_config(CONSUMER, None)
    assert cfg["isolation.level"] == "read_committed"
    assert cfg["enable.auto.commit"] is True
    assert cfg["auto.commit.interval.ms"] == 5000
    assert cfg["auto.offset.reset"] == "latest"
    assert cfg["enable.partition.eof"] is False
    assert cfg["session.timeout.ms"] == 45_000
    assert cfg["heartbeat.interval.ms"] == 3000
    assert cfg["max.poll.interval.ms"] == 300_000
    assert cfg["fetch.max.bytes"] == 52_428_800
    assert cfg["max.partition.fetch.bytes"] == 1_048_576
    assert cfg["fetch.min.bytes"] == 1
    assert cfg["fetch.wait.max.ms"] == 500
    assert cfg["enable.auto.offset.store"] is True
    assert cfg["partition.assignment.strategy"] == "range"
    assert cfg["group.id"] is None and cfg["group.instance.id"] is None
    assert cfg["on_commit"] is None
    assert "transactional.id" not in cfg


def test_admin_has_only_common_keys() -> None:
    cfg = parse_config(ADMIN, {"database.url": "postgresql+psycopg://x/y", "client.id": "adm"})
    assert cfg["database.url"] == "postgresql+psycopg://x/y"
    assert cfg["client.id"] == "adm"
    assert set(cfg) == {n for n, s in SETTINGS.items() if ADMIN in s.kinds}
    assert "linger.ms" not in cfg and "group.id" not in cfg


def test_defaults_satisfy_their_own_rules() -> None:
    for name, setting in SETTINGS.items():
        if setting.type is Type.INT:
            lo = setting.minimum if setting.minimum is not None else setting.default
            hi = setting.maximum if setting.maximum is not None else setting.default
            assert lo <= setting.default <= hi, name


# --- coercion ----------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "expected"), [(7, 7), ("7", 7), (" 7 ", 7), ("0", 0)])
def test_int_coercion(raw: object, expected: int) -> None:
    assert parse_config(PRODUCER, {"linger.ms": raw})["linger.ms"] == expected


@pytest.mark.parametrize("raw", ["five", "5ms", 5.0, 2.5, True, [5], ""])
def test_int_rejects_non_integers(raw: object) -> None:
    assert "linger.ms" in _error(PRODUCER, {"linger.ms": raw})


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (True, True),
        (False, False),
        ("true", True),
        ("TRUE", True),
        ("t", True),
        ("1", True),
        (1, True),
        ("false", False),
        ("False", False),
        ("f", False),
        ("0", False),
        (0, False),
    ],
)
def test_bool_coercion(raw: object, expected: bool) -> None:
    assert parse_config(CONSUMER, {"enable.auto.commit": raw})["enable.auto.commit"] is expected


@pytest.mark.parametrize("raw", ["yes", "2", 2, 1.0, None])
def test_bool_rejects_other_values(raw: object) -> None:
    assert "enable.partition.eof" in _error(CONSUMER, {"enable.partition.eof": raw})


def test_string_keys_must_be_strings() -> None:
    assert "client.id" in _error(PRODUCER, {"client.id": 5})
    assert parse_config(PRODUCER, {"transactional.id": "tx-1"})["transactional.id"] == "tx-1"


def test_none_resets_an_optional_string() -> None:
    cfg = parse_config(PRODUCER, {"transactional.id": None})
    assert cfg["transactional.id"] is None
    assert not cfg.is_set("transactional.id")


def test_callables() -> None:
    def cb(*args: object) -> None:
        return None

    cfg = parse_config(PRODUCER, {"error_cb": cb, "stats_cb": cb, "logger": cb, "on_delivery": cb})
    assert cfg.get_callable("error_cb") is cb
    assert cfg["on_delivery"] is cb
    assert parse_config(CONSUMER, {"on_commit": cb})["on_commit"] is cb
    assert "error_cb" in _error(PRODUCER, {"error_cb": "not callable"})


# --- choices -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("earliest", "earliest"),
        ("smallest", "earliest"),
        ("beginning", "earliest"),
        ("latest", "latest"),
        ("largest", "latest"),
        ("end", "latest"),
        ("error", "error"),
        ("EARLIEST", "earliest"),
    ],
)
def test_auto_offset_reset_synonyms(raw: str, expected: str) -> None:
    assert parse_config(CONSUMER, {"auto.offset.reset": raw})["auto.offset.reset"] == expected


def test_choice_errors_name_the_key_and_the_choices() -> None:
    text = _error(CONSUMER, {"isolation.level": "serializable"})
    assert "isolation.level" in text and "read_committed" in text
    assert "auto.offset.reset" in _error(CONSUMER, {"auto.offset.reset": "middle"})
    assert "partitioner" in _error(PRODUCER, {"partitioner": "fnv9"})
    assert "compression.type" in _error(PRODUCER, {"compression.type": "brotli"})


def test_isolation_levels() -> None:
    for level in ("read_committed", "read_uncommitted"):
        assert parse_config(CONSUMER, {"isolation.level": level})["isolation.level"] == level


@pytest.mark.parametrize(("raw", "expected"), [("all", -1), ("-1", -1), (-1, -1), ("ALL", -1)])
def test_acks_all_spellings(raw: object, expected: int) -> None:
    assert parse_config(PRODUCER, {"acks": raw})["acks"] == expected


@pytest.mark.parametrize("raw", [0, 1, "0", "1"])
def test_acks_without_idempotence(raw: int | str) -> None:
    cfg = parse_config(PRODUCER, {"acks": raw, "enable.idempotence": False})
    assert cfg["acks"] == int(raw)


def test_acks_rejects_other_values() -> None:
    assert "acks" in _error(PRODUCER, {"acks": 2})
    assert "acks" in _error(PRODUCER, {"acks": "some"})


@pytest.mark.parametrize(
    "name", ["murmur2", "murmur2_random", "consistent_random", "consistent", "random"]
)
def test_partitioner_choices(name: str) -> None:
    assert parse_config(PRODUCER, {"partitioner": name})["partitioner"] == name


def test_compression_is_accepted_but_recorded_as_ignored() -> None:
    for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
        cfg = parse_config(PRODUCER, {"compression.type": codec})
        assert cfg["compression.type"] == codec
        assert "compression.type" in cfg.ignored


def test_assignment_strategy_list() -> None:
    cfg = parse_config(CONSUMER, {"partition.assignment.strategy": "Range, roundrobin,range"})
    assert cfg["partition.assignment.strategy"] == "range,roundrobin"
    cfg = parse_config(CONSUMER, {"partition.assignment.strategy": "cooperative-sticky"})
    assert cfg["partition.assignment.strategy"] == "cooperative-sticky"
    assert "partition.assignment.strategy" in _error(
        CONSUMER, {"partition.assignment.strategy": "range,sticky"}
    )


# --- ranges ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "key", "value"),
    [
        (PRODUCER, "linger.ms", -1),
        (PRODUCER, "linger.ms", 900_001),
        (PRODUCER, "transaction.timeout.ms", 0),
        (PRODUCER, "transaction.timeout.ms", 999),
        (PRODUCER, "transaction.timeout.ms", 2**31),
        (PRODUCER, "batch.num.messages", 0),
        (PRODUCER, "batch.num.messages", 1_000_001),
        (PRODUCER, "message.max.bytes", 999),
        (PRODUCER, "message.max.bytes", 1_000_000_001),
        (PRODUCER, "max.in.flight.requests.per.connection", 0),
        (CONSUMER, "session.timeout.ms", 0),
        (CONSUMER, "session.timeout.ms", 3_600_001),
        (CONSUMER, "fetch.min.bytes", 0),
    ],
)
def test_out_of_range(kind: str, key: str, value: int) -> None:
    text = _error(kind, {key: value})
    assert key in text and "range" in text


def test_range_edges_are_inclusive() -> None:
    cfg = parse_config(
        PRODUCER,
        {"linger.ms": 0, "transaction.timeout.ms": 1000, "message.max.bytes": 1000},
    )
    assert cfg["linger.ms"] == 0
    cfg = parse_config(
        PRODUCER,
        {"transaction.timeout.ms": INT32_MAX, "linger.ms": "900000", "message.timeout.ms": 900_001},
    )
    assert cfg["linger.ms"] == 900_000


@given(st.integers(min_value=0, max_value=900_000))
def test_any_linger_in_range_is_accepted(value: int) -> None:
    cfg = parse_config(PRODUCER, {"linger.ms": str(value), "message.timeout.ms": 1_000_000})
    assert cfg.get_int("linger.ms") == value


@given(st.integers().filter(lambda v: v < 1 or v > 3_600_000))
def test_any_session_timeout_out_of_range_is_rejected(value: int) -> None:
    with pytest.raises(KafkaException):
        parse_config(CONSUMER, {"session.timeout.ms": value})


# --- unknown keys, other kinds' keys, aliases ---------------------------------------------


def test_unknown_key_is_named() -> None:
    text = _error(PRODUCER, {"linger.msec": 5})
    assert '"linger.msec"' in text


def test_broker_setting_is_not_a_client_key() -> None:
    assert "producer.id.expiration.ms" in _error(PRODUCER, {"producer.id.expiration.ms": 1})
    assert "transaction.max.timeout.ms" in _error(PRODUCER, {"transaction.max.timeout.ms": 1})


def test_non_string_key_is_rejected() -> None:
    _error(PRODUCER, {5: 5})  # type: ignore[dict-item]


def test_bad_kind_and_bad_config_type() -> None:
    with pytest.raises(KafkaException):
        parse_config("broker", {})
    with pytest.raises(KafkaException):
        parse_config(PRODUCER, [("linger.ms", 5)])  # type: ignore[arg-type]


def test_other_kinds_key_is_ignored_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="app.config"):
        cfg = parse_config(PRODUCER, {"group.id": "g", "linger.ms": 1})
    assert "group.id" not in cfg
    assert cfg.ignored == ("group.id",)
    assert "group.id" in caplog.text
    # Still validated: a bad value is an error even where the key is ignored.
    assert "isolation.level" in _error(PRODUCER, {"isolation.level": "dirty"})


def test_compatibility_keys_are_accepted() -> None:
    cfg = parse_config(CONSUMER, {"bootstrap.servers": "localhost:9092", "debug": "all"})
    assert set(cfg.ignored) == {"bootstrap.servers", "debug"}
    assert cfg["bootstrap.servers"] == "localhost:9092"


def test_aliases() -> None:
    cfg = parse_config(PRODUCER, {"delivery.timeout.ms": 120_000, "queue.buffering.max.ms": 10})
    assert cfg["message.timeout.ms"] == 120_000
    assert cfg["delivery.timeout.ms"] == 120_000
    assert cfg["linger.ms"] == 10
    assert cfg.is_set("delivery.timeout.ms") and cfg.is_set("message.timeout.ms")
    assert "delivery.timeout.ms" in _error(PRODUCER, {"delivery.timeout.ms": -5})


def test_config_is_read_only_mapping() -> None:
    cfg = parse_config(PRODUCER, {"linger.ms": 1})
    assert isinstance(cfg, ClientConfig)
    with pytest.raises(TypeError):
        cfg["linger.ms"] = 2  # type: ignore[index]
    with pytest.raises(AttributeError):
        cfg.foo = 1  # type: ignore[attr-defined]
    assert len(cfg) == len(settings_for(PRODUCER))
    assert "linger.ms" in repr(cfg)


def test_typed_accessors() -> None:
    cfg = parse_config(PRODUCER, {"transactional.id": "tx", "enable.idempotence": "true"})
    assert cfg.get_str("transactional.id") == "tx"
    assert cfg.get_bool("enable.idempotence") is True
    assert cfg.get_int("linger.ms") == 5


# --- cross-key rules ---------------------------------------------------------------------


def test_transactional_id_requires_idempotence() -> None:
    text = _error(PRODUCER, {"transactional.id": "tx", "enable.idempotence": "false"})
    assert "transactional.id" in text and "enable.idempotence" in text
    assert parse_config(PRODUCER, {"transactional.id": "tx"})["enable.idempotence"] is True


def test_explicit_idempotence_conflicts_are_errors() -> None:
    assert "acks" in _error(PRODUCER, {"enable.idempotence": True, "acks": 1})
    assert "max.in.flight" in _error(
        PRODUCER, {"enable.idempotence": True, "max.in.flight.requests.per.connection": 6}
    )
    assert "retries" in _error(PRODUCER, {"enable.idempotence": True, "retries": 0})
    assert "acks" in _error(PRODUCER, {"transactional.id": "tx", "acks": 0})


def test_implicit_idempotence_gives_way() -> None:
    cfg = parse_config(PRODUCER, {"acks": 1})
    assert cfg["enable.idempotence"] is False
    cfg = parse_config(PRODUCER, {"max.in.flight.requests.per.connection": 10})
    assert cfg["enable.idempotence"] is False
    cfg = parse_config(PRODUCER, {"max.in.flight.requests.per.connection": 5})
    assert cfg["enable.idempotence"] is True


def test_transactional_message_timeout_is_capped_by_transaction_timeout() -> None:
    cfg = parse_config(PRODUCER, {"transactional.id": "tx", "transaction.timeout.ms": 10_000})
    assert cfg["message.timeout.ms"] == 10_000
    text = _error(
        PRODUCER,
        {"transactional.id": "tx", "transaction.timeout.ms": 10_000, "message.timeout.ms": 20_000},
    )
    assert "message.timeout.ms" in text and "transaction.timeout.ms" in text
    # Without a transactional.id the two are independent.
    cfg = parse_config(PRODUCER, {"transaction.timeout.ms": 10_000})
    assert cfg["message.timeout.ms"] == 300_000


def test_linger_must_be_below_message_timeout() -> None:
    assert "linger.ms" in _error(PRODUCER, {"linger.ms": 5000, "message.timeout.ms": 5000})
    assert parse_config(PRODUCER, {"linger.ms": 5000, "message.timeout.ms": 0})


def test_heartbeat_must_be_below_session_timeout() -> None:
    text = _error(CONSUMER, {"session.timeout.ms": 3000})
    assert "heartbeat.interval.ms" in text and "session.timeout.ms" in text
    assert parse_config(CONSUMER, {"session.timeout.ms": 6000, "heartbeat.interval.ms": 2000})
