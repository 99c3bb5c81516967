"""Apache Kafka on demand: the reference the conformance suite (tests/conformance) and the
bench compare kip98 with.

Kafka's broker and tools come from Maven Central through a pinned pom (``pom.xml`` beside
this file) into a cache outside the repository (``KIP98_KAFKA_HOME``, default
``~/.cache/kip98/kafka-<version>``); nothing of Kafka is committed. ``KafkaBroker`` formats
KRaft storage and runs a single-node combined broker and controller on free loopback
ports; ``run_tool`` runs one of Kafka's tool classes on the same classpath.
"""

from bench.kafka.broker import KafkaBroker, KafkaStartError, run_tool
from bench.kafka.fetch import KAFKA_VERSION, KafkaFetchError, cache_dir, kafka_classpath

__all__ = [
    "KAFKA_VERSION",
    "KafkaBroker",
    "KafkaFetchError",
    "KafkaStartError",
    "cache_dir",
    "kafka_classpath",
    "run_tool",
]
