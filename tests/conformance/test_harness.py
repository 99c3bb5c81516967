"""The harness itself, without brokers: ``same`` fails with a readable diff where the two
observations differ, ``documented_difference`` holds each broker to its documented
observation, and normalisation leaves what must match."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conformance.harness import Target, documented_difference, same
from tests.conformance.normalise import error_name, lso_relation, stems

KIP98, KAFKA = Target("kip98", "127.0.0.1:1"), Target("kafka", "127.0.0.1:2")


def scenario_kind(target: Target) -> Any:
    return {"kind": target.kind, "tuple": (1, 2)}


def scenario_names(target: Target) -> Any:
    return stems({"topic": target.name_for("orders"), "list": [target.name_for("g")]})


def test_same_shows_where_the_observations_differ() -> None:
    with pytest.raises(AssertionError) as failed:
        same(scenario_kind, KIP98, KAFKA)
    assert '- "kind": "kafka"' in str(failed.value)
    assert '+ "kind": "kip98"' in str(failed.value)


def test_same_compares_names_by_their_stems() -> None:
    same(scenario_names, KIP98, KAFKA)
    assert scenario_names(KIP98) == {"topic": "orders", "list": ["g"]}


def test_a_documented_difference_needs_its_section() -> None:
    with pytest.raises(AssertionError, match="no section"):
        documented_difference("no-such-slug", scenario_kind, KIP98, KAFKA,
                              kip98_expected={}, kafka_expected={})  # fmt: skip


def test_a_documented_difference_needs_its_section_to_name_the_test() -> None:
    with pytest.raises(AssertionError, match="names neither"):
        documented_difference("acks1-behind-acks-all", scenario_kind, KIP98, KAFKA,
                              kip98_expected={}, kafka_expected={})  # fmt: skip


def test_error_names() -> None:
    import confluent_kafka as ck

    assert error_name(45) == "OUT_OF_ORDER_SEQUENCE_NUMBER"
    assert error_name(0) == "NONE"
    assert error_name(ck.KafkaError(ck.KafkaError._FENCED)) == "_FENCED"
    assert error_name(ck.KafkaException(ck.KafkaError(90))) == "PRODUCER_FENCED"
    assert lso_relation(3, 5) == "lso<hw" and lso_relation(5, 5) == "lso==hw"


def test_kafkas_classpath_comes_from_the_cache_and_leaves_the_repository_alone() -> None:
    """The jars are fetched once into the cache (its stamp matching the pom); the
    repository keeps nothing of them."""
    from pathlib import Path

    from bench.kafka import KAFKA_VERSION, cache_dir, kafka_classpath
    from bench.kafka.fetch import POM, fetched

    classpath = kafka_classpath()
    assert fetched()
    jars = {Path(p).name for p in classpath.split(":")}
    assert {f"kafka_2.13-{KAFKA_VERSION}.jar", f"kafka-tools-{KAFKA_VERSION}.jar"} <= jars
    assert all(Path(p).parent == cache_dir() / "libs" for p in classpath.split(":"))
    assert sorted(p.name for p in POM.parent.iterdir() if p.name != "__pycache__") == [
        "__init__.py", "__main__.py", "broker.py", "fetch.py", "pom.xml"
    ]  # fmt: skip


def test_a_broker_whose_port_was_taken_starts_again_on_fresh_ports(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process taking a picked port before Kafka binds it costs a try, not the
    run; any other failure is reported at once, with the log's errors first."""
    from bench.kafka import KafkaBroker, KafkaStartError

    broker = KafkaBroker(workdir=tmp_path)
    tries: list[int] = []

    def bind_fails_once() -> None:
        tries.append(1)
        if len(tries) == 1:
            broker.log_path.write_text("[t] ERROR bind\nAddress already in use\n")
            raise KafkaStartError("exited")

    monkeypatch.setattr(broker, "_start_once", bind_fails_once)
    broker.start()
    assert len(tries) == 2

    def dies() -> None:
        tries.append(1)
        broker.log_path.write_text("[t] ERROR [x] no space left\n" + "[t] INFO noise\n" * 50)
        raise KafkaStartError("exited")

    monkeypatch.setattr(broker, "_start_once", dies)
    with pytest.raises(KafkaStartError):
        broker.start()
    assert len(tries) == 3

    from bench.kafka.broker import tail

    assert tail(broker.log_path, 5).splitlines()[:2] == ["errors:", "[t] ERROR [x] no space left"]
