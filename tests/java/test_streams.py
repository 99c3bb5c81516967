"""Kafka Streams under exactly_once_v2 against kip98 and Apache Kafka, its instances
killed mid-stream (tests/java/src/main/java/kip98/streams/CountApp.java).

Two instances of a stateful application (a re-keying step, so a repartition topic, then a
count with a compacted changelog and a windowed count), one standby each. The input goes
in rounds; after each round the test waits for the output to move, SIGKILLs one instance
and starts it again (a rebalance, the restarted instance restoring its stores from the
changelogs read_committed, its transactional id fencing the dead one's open
transaction). A read_committed reader must then see each word's counts 1, 2, ..., n
exactly once and in order, ending at the input's counts, on either broker. What Streams
asked of the broker is checked too: its internal topics with the configs it gave them, and
the repartition topic purged by DeleteRecords.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter, defaultdict
from functools import partial
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import ConfigResource, ConfigSource, ResourceType

from tests.conformance.harness import Target, run_both, wait_until
from tests.java.processes import JavaProcess

WORDS = [f"w{i}" for i in range(5)]
ROUNDS = 4
PER_ROUND = 400  # records per round, so 1600 in all over 5 words
KILLS = 3  # one after each round but the last
PARTITIONS = 3
GUARD = 240.0  # seconds: a hang guard for each wait, never a figure


class Instance(JavaProcess):
    """One CountApp process; its INFO log (Streams' own) in a file per life."""

    main = "kip98.streams.CountApp"

    def log_file(self) -> Path:
        return self.log.with_name(f"{self.log.name}-start{self.starts}.log")

    def jvm_options(self) -> list[str]:
        return [
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
            f"-Dorg.slf4j.simpleLogger.logFile={self.log_file()}",
        ]

    def logs(self) -> list[Path]:
        return [self.out_file(), self.log_file()]


class Output:
    """The output topics as a read_committed reader sees them, in order per key."""

    def __init__(self, target: Target, topics: list[str]) -> None:
        self.consumer = ck.Consumer(
            target.config(**{
                "group.id": target.name_for("reader"),
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            })
        )  # fmt: skip
        self.consumer.assign([ck.TopicPartition(t, 0, ck.OFFSET_BEGINNING) for t in topics])
        self.updates: dict[str, dict[str, list[int]]] = {t: defaultdict(list) for t in topics}
        self.seen = 0

    def poll(self) -> int:
        for message in self.consumer.consume(1000, timeout=0.2):
            if message.error() is not None:
                raise ck.KafkaException(message.error())
            topic, key, value = message.topic(), message.key(), message.value()
            assert topic is not None and key is not None and value is not None
            self.updates[topic][key.decode()].append(int(value.decode()))
            self.seen += 1
        return self.seen


def produce_round(target: Target, topic: str, first: int, base_ms: int) -> Counter[str]:
    """``PER_ROUND`` records numbered from ``first``: key the number, value a word, record
    time 10 ms apart (so a few 10-second windows); the count of each word sent."""
    producer = ck.Producer(target.config(**{"enable.idempotence": True, "linger.ms": 5}))
    sent: Counter[str] = Counter()
    for n in range(first, first + PER_ROUND):
        word = WORDS[(n * 7 + n // 3) % len(WORDS)]
        producer.produce(topic, key=str(n), value=word, timestamp=base_ms + n * 10)
        sent[word] += 1
    assert producer.flush(60) == 0
    return sent


def run_application(target: Target, classpath: str, workdir: Path) -> dict[str, Any]:
    source = target.create_topic("words", partitions=PARTITIONS)
    counts, windows = target.create_topic("counts"), target.create_topic("windows")
    app = target.name_for("wordcount")
    instances = [
        Instance(classpath, [target.bootstrap, app, source, counts, windows, str(workdir / f"state{i}")],
                 workdir / f"instance{i}")
        for i in range(2)
    ]  # fmt: skip
    output = Output(target, [counts, windows])
    expected: Counter[str] = Counter()
    # Record times from now (older ones would fall to the topics' retention).
    base_ms = int(time.time() * 1000)

    def progressed(beyond: int) -> bool:
        for instance in instances:
            instance.check_alive()
        return output.poll() > beyond

    def moving(beyond: int) -> bool:
        """Progress past ``beyond``, or the output complete for the input so far (two
        updates per record, its count and its window's), when the round was done before
        the kill: then the next round shows the restarted group's progress."""
        return progressed(beyond) or output.seen >= 2 * sum(expected.values())

    try:
        for instance in instances:
            instance.start()
        for round_ in range(ROUNDS):
            before = output.poll()
            expected += produce_round(target, source, round_ * PER_ROUND, base_ms)
            wait_until(partial(progressed, before), f"output beyond {before}", GUARD)
            if round_ < KILLS:
                victim = instances[round_ % 2]
                victim.kill()
                victim.start()
                moved = output.poll()
                wait_until(partial(moving, moved), f"output beyond {moved}", GUARD)

        def done() -> bool:
            """Every word at its input count, in the counts and summed over its windows
            (the two topics are read separately, so each is waited for)."""
            progressed(-1)
            latest = {w: u[-1] for w, u in output.updates[counts].items()}
            windowed: Counter[str] = Counter()
            for window, updates in output.updates[windows].items():
                windowed[window.split("@")[0]] += updates[-1]
            return latest == dict(expected) and windowed == expected

        wait_until(done, "final counts", GUARD)
        internal = internal_topics(target, app)
        purged = wait_until(lambda: repartition_purged(target, app), "repartition purged", GUARD)
    finally:
        for instance in instances:
            instance.stop()
        output.consumer.close()

    count_updates = output.updates[counts]
    window_updates = output.updates[windows]
    for word, updates in count_updates.items():
        assert updates == list(range(1, len(updates) + 1)), (word, updates)
    for window, updates in window_updates.items():
        assert updates == list(range(1, len(updates) + 1)), (window, updates)
    per_word: Counter[str] = Counter()
    for window, updates in window_updates.items():
        per_word[window.split("@")[0]] += updates[-1]
    assert per_word == expected
    return {
        "counts": {w: len(u) for w, u in sorted(count_updates.items())},
        "internal": internal,
        "purged": purged,
        "starts": [i.starts for i in instances],
    }


def internal_topics(target: Target, app: str) -> dict[str, dict[str, Any]]:
    """Streams' internal topics: partitions, the configs Streams gives each kind, and all
    the configs it set (those DescribeConfigs names topic overrides), to be the same on
    both brokers."""
    names = {
        "repartition": f"{app}-rekeyed-repartition",
        "counts-changelog": f"{app}-counts-changelog",
        "windows-changelog": f"{app}-windows-changelog",
    }
    admin = target.admin()
    metadata = admin.list_topics(timeout=30).topics
    result: dict[str, dict[str, Any]] = {}
    for kind, name in names.items():
        assert name in metadata, (name, sorted(t for t in metadata if t.startswith(app)))
        resource = ConfigResource(ResourceType.TOPIC, name)
        configs = admin.describe_configs([resource])[resource].result(30)
        result[kind] = {
            "partitions": len(metadata[name].partitions),
            "cleanup.policy": configs["cleanup.policy"].value,
        }
        if kind == "repartition":
            result[kind]["retention.ms"] = configs["retention.ms"].value
        result[kind]["overrides"] = {
            key: entry.value
            for key, entry in sorted(configs.items())
            if ConfigSource(entry.source) == ConfigSource.DYNAMIC_TOPIC_CONFIG
        }
    return result


def repartition_purged(target: Target, app: str) -> bool:
    """Whether DeleteRecords moved the repartition topic's log start on some partition."""
    consumer = ck.Consumer(target.config(**{"group.id": target.name_for("probe")}))
    try:
        topic = f"{app}-rekeyed-repartition"
        starts = [
            consumer.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=10)[0]
            for p in range(PARTITIONS)
        ]
        return any(start > 0 for start in starts)
    finally:
        consumer.close()


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_streams_exactly_once_through_kills(
    targets: tuple[Target, Target], java_classpath: str, tmp_path: Path
) -> None:
    """The same application, input and kills on each broker: exactly-once updates in order
    on each (run_application asserts them), and the same final counts, internal topics
    and purge from both."""

    def scenario(target: Target) -> Any:
        return run_application(target, java_classpath, tmp_path / target.kind)

    observed, on_kafka = run_both(scenario, *targets)
    assert observed == on_kafka
    assert sum(observed["counts"].values()) == ROUNDS * PER_ROUND
    internal = {kind: {k: v for k, v in topic.items() if k != "overrides"}
                for kind, topic in observed["internal"].items()}  # fmt: skip
    assert internal == {
        "repartition": {"partitions": PARTITIONS, "cleanup.policy": "delete", "retention.ms": "-1"},
        "counts-changelog": {"partitions": PARTITIONS, "cleanup.policy": "compact"},
        "windows-changelog": {"partitions": PARTITIONS, "cleanup.policy": "compact,delete"},
    }
    assert observed["purged"]
    assert observed["starts"] == [1 + (KILLS + 1) // 2, 1 + KILLS // 2]


def test_streams_never_uses_the_consumer_group_protocol(java_classpath: str) -> None:
    """Kafka Streams 4.4 takes ``group.protocol`` classic (its default) or streams
    (KIP-1071), refuses consumer, and gives its main consumer classic even when told
    otherwise: the Streams test above runs on the classic protocol on both brokers
    (docs/kafka-differences.md, consumer groups)."""
    check = Path(__file__).resolve().parent / "checks" / "StreamsGroupProtocol.java"
    result = subprocess.run(
        ["java", "-cp", java_classpath, str(check)], capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    said = json.loads(result.stdout.strip().splitlines()[-1])
    assert said == {"default": "classic", "consumer": "ConfigException", "main_consumer": "classic"}
