"""The two brokers every scenario runs against: one Apache Kafka 4.4 per test session, and
one ``kip98 serve`` per test, configured alike. tests/conftest.py imports these fixtures,
so the conformance suite and the Java clients' tests (tests/java) share the one Kafka.

The Kafka broker (bench.kafka) comes up once, its jars fetched by Maven on a machine's
first run (scripts/setup does it beforehand); its working directory, with ``broker.log``,
is kept under pytest's temporary directory for reading after a failure. The kip98 side is
a ``kip98 serve`` over the test's fresh database (tests/conftest.py's ``db_url``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from bench.kafka import KafkaBroker
from tests.conformance.harness import Target
from tests.helpers.wire_client import serving

# kip98 serve configured as the Kafka broker is (bench.kafka.broker.DEFAULT_SETTINGS):
# topics created on first use with one partition, groups formed at once, a coordinator
# pass every second.
KIP98_SIDE = {
    "KIP98_AUTO_CREATE_TOPICS": "true",
    "KIP98_NUM_PARTITIONS": "1",
    "KIP98_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
    "KIP98_GROUP_MIN_SESSION_TIMEOUT_MS": "6000",  # Kafka's default
    "KIP98_COORDINATOR_INTERVAL_MS": "1000",
    "KIP98_SERVE_COORDINATOR_LOOP": "true",
}


class RunningKafka:
    """A Kafka broker someone else runs (``KIP98_CONFORMANCE_KAFKA=host:port``), reused
    across test sessions while writing scenarios."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker | RunningKafka]:
    """Apache Kafka 4.4, one broker+controller for the whole session."""
    running = os.environ.get("KIP98_CONFORMANCE_KAFKA")
    if running:
        warm_up(Target("kafka", running))
        yield RunningKafka(running)
        return
    broker = KafkaBroker(workdir=tmp_path_factory.mktemp("kafka"))
    broker.start()
    try:
        warm_up(Target("kafka", broker.bootstrap))
        yield broker
    finally:
        broker.stop()


def warm_up(target: Target) -> None:
    """Kafka creates its transaction and offsets logs on first use and answers
    COORDINATOR_LOAD_IN_PROGRESS until they are loaded; kip98 has them from the start.
    The coordinators of a transactional id and of a group, and a producer id, asked for first, so no scenario meets that."""
    from tests.conformance.requests import find_coordinator, init_producer_id, retried

    transactional_id = target.name_for("warm-up")
    for key, key_type in ((transactional_id, 1), (target.name_for("warm-up"), 0)):
        found = retried(lambda k=key, t=key_type: find_coordinator(target, k, t),
                        lambda a: a.error_code)  # fmt: skip
        assert found.error_code.value == 0, found
    init = init_producer_id(target, transactional_id)
    assert init.error_code.value == 0, init


@pytest.fixture
def kip98_target(db_url: str) -> Iterator[Target]:
    with serving(db_url, env=KIP98_SIDE) as address:
        yield Target("kip98", address)


@pytest.fixture
def kafka_target(kafka: KafkaBroker | RunningKafka) -> Target:
    return Target("kafka", kafka.bootstrap)


@pytest.fixture
def targets(kip98_target: Target, kafka_target: Target) -> tuple[Target, Target]:
    """``(kip98, kafka)``, as ``same`` and ``documented_difference`` take them."""
    return kip98_target, kafka_target
