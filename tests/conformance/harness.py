"""The conformance harness: each scenario is written once, as a function of a ``Target``,
and run against both ``kip98 serve`` and Apache Kafka; what a client observes there,
normalised (``tests/conformance/normalise.py``), must be equal.

A scenario never assumes a fresh broker (one Kafka serves the whole session): it names
every topic, group and transactional id through ``Target.name_for`` and normalises names
back to their stems before comparing.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import socket
import struct
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient, NewTopic

from tests.helpers.wire_client import exchange, read_frame

Observation = Any  # plain JSON-like data: dicts, lists, ints, strs, bools, None

DIFFERENCES = Path(__file__).resolve().parents[2] / "docs" / "kafka-differences.md"
# A unique suffix name_for adds to a stem, and normalise.stems takes off again.
SUFFIX = re.compile(r"_x[0-9a-f]{10}")


class Timeout(AssertionError):
    """A hang guard ran out: what a scenario waited for never happened."""


def wait_until(
    condition: Callable[[], Any], what: str, timeout: float = 60, every: float = 0.05
) -> Any:
    """``condition()``'s first truthy value; ``timeout`` is a hang guard, not a figure."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise Timeout(f"{what}: not within {timeout} s")
        time.sleep(every)


@dataclass(frozen=True)
class Target:
    """One broker a scenario runs against."""

    kind: str  # "kip98" or "kafka"
    bootstrap: str  # bootstrap.servers

    def config(self, **extra: Any) -> dict[str, Any]:
        """A confluent-kafka configuration reaching this broker; dotted keys through a
        dict: ``target.config(**{"enable.idempotence": True})``."""
        return {"bootstrap.servers": self.bootstrap, "broker.address.family": "v4", **extra}

    def admin(self) -> AdminClient:
        return AdminClient(self.config())

    def name_for(self, stem: str) -> str:
        """A fresh topic, group or transactional id name starting with ``stem``."""
        return f"{stem}_x{uuid.uuid4().hex[:10]}"

    def create_topic(
        self, stem: str, partitions: int = 1, config: dict[str, str] | None = None
    ) -> str:
        """Create a topic named from ``stem`` and wait until every partition has a leader
        that answers; its name."""
        name = self.name_for(stem)
        admin = self.admin()
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})],
            operation_timeout=30,
        )
        futures[name].result(60)

        def usable() -> bool:
            topic = admin.list_topics(name, timeout=10).topics.get(name)
            return (
                topic is not None
                and topic.error is None
                and len(topic.partitions) == partitions
                and all(p.leader >= 0 for p in topic.partitions.values())
            )

        wait_until(usable, f"topic {name} usable on {self.kind}")
        # A partition led in Metadata may still refuse a first write for a moment on
        # Kafka (its leader epoch not yet loaded): a list-offsets answer says it serves.
        tps = [ck.TopicPartition(name, p, ck.OFFSET_END) for p in range(partitions)]

        def answers() -> bool:
            try:
                consumer = ck.Consumer(self.config(**{"group.id": self.name_for("probe")}))
                try:
                    for tp in tps:
                        consumer.get_watermark_offsets(tp, timeout=5)
                finally:
                    consumer.close()
                return True
            except ck.KafkaException:
                return False

        wait_until(answers, f"topic {name} answering on {self.kind}")
        return name

    def raw(self, api_key: int, version: int, body: Any) -> Any:
        """One kio request and its decoded answer, on a fresh connection."""
        return exchange(self.bootstrap, api_key, version, body)

    def raw_bytes(self, frame: bytes) -> bytes | None:
        """Send ``frame`` as it is (size prefix included); the answer frame (without its
        size), or None if the broker closed the connection instead of answering."""
        host, port = self.bootstrap.split(":")
        with socket.create_connection((host, int(port)), 5) as s:
            s.settimeout(10)
            s.sendall(frame)
            try:
                answer = read_frame(s)
            except (ConnectionResetError, struct.error):
                return None
        return answer or None


def _render(observation: Observation) -> list[str]:
    return json.dumps(observation, indent=1, sort_keys=True, default=repr).splitlines()


def _json_shape(observation: Observation) -> Observation:
    """Tuples as lists, as JSON has them, so a tuple and a list of the same items match."""
    result: Observation = json.loads(json.dumps(observation, sort_keys=True, default=repr))
    return result


def run_both(
    scenario: Callable[[Target], Observation], kip98: Target, kafka: Target
) -> tuple[Observation, Observation]:
    """Each broker's normalised observation of ``scenario``: Kafka's first, so a scenario
    that fails on both shows Kafka's traceback (the reference) first."""
    on_kafka = _json_shape(scenario(kafka))
    on_kip98 = _json_shape(scenario(kip98))
    return on_kip98, on_kafka


def same(scenario: Callable[[Target], Observation], kip98: Target, kafka: Target) -> None:
    """Run the scenario on each broker and assert the two observations are equal."""
    on_kip98, on_kafka = run_both(scenario, kip98, kafka)
    if on_kip98 != on_kafka:
        diff = "\n".join(
            difflib.unified_diff(
                _render(on_kafka), _render(on_kip98), "kafka", "kip98", lineterm="", n=3
            )
        )
        raise AssertionError(
            f"{scenario.__name__}: kip98 observes what Kafka does not (- kafka, + kip98):\n{diff}"
        )


def difference_section(slug: str) -> str:
    """The section of docs/kafka-differences.md whose heading carries ``{#slug}`` or the
    slug itself; its text up to the next heading of the same or a higher level."""
    lines = DIFFERENCES.read_text().splitlines()
    for i, line in enumerate(lines):
        heading = re.match(r"^(#+)\s", line)
        if heading and (f"{{#{slug}}}" in line or slug in line):
            level = len(heading.group(1))
            end = next(
                (
                    j
                    for j in range(i + 1, len(lines))
                    if (m := re.match(r"^(#+)\s", lines[j])) and len(m.group(1)) <= level
                ),
                len(lines),
            )
            return "\n".join(lines[i:end])
    raise AssertionError(f"docs/kafka-differences.md has no section for {slug!r}")


def _current_test() -> str:
    """The running test's function name (pytest sets PYTEST_CURRENT_TEST)."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    return current.split("::")[-1].split(" ")[0].split("[")[0]


def documented_difference(
    slug: str,
    scenario: Callable[[Target], Observation],
    kip98: Target,
    kafka: Target,
    *,
    kip98_expected: Observation,
    kafka_expected: Observation,
) -> None:
    """A difference kip98 has on purpose: docs/kafka-differences.md has its section, the
    section names this test (or the scenario), and each broker observes what it says."""
    section = difference_section(slug)
    names = {n for n in (_current_test(), scenario.__name__) if n}
    assert any(n in section for n in names), (
        f"docs/kafka-differences.md's section {slug!r} names neither of {sorted(names)}"
    )
    on_kip98, on_kafka = run_both(scenario, kip98, kafka)
    assert on_kafka == _json_shape(kafka_expected), (
        f"{slug}: Kafka no longer observes what the section says:\n"
        + "\n".join(difflib.unified_diff(_render(_json_shape(kafka_expected)), _render(on_kafka),
                                         "documented", "kafka", lineterm=""))
    )  # fmt: skip
    assert on_kip98 == _json_shape(kip98_expected), (
        f"{slug}: kip98 no longer observes what the section says:\n"
        + "\n".join(difflib.unified_diff(_render(_json_shape(kip98_expected)), _render(on_kip98),
                                         "documented", "kip98", lineterm=""))
    )  # fmt: skip
