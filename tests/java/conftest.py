"""Kafka's Java clients against kip98 serve and, for comparison, Apache Kafka: the programs
are built once per session (or found built), each test starts them as subprocesses.

The brokers are the conformance suite's: a ``kip98 serve`` per test over a fresh database,
configured as the session's Kafka broker is (tests/conformance/conftest.py).
"""

from __future__ import annotations

import pytest

from tests.conformance.conftest import kafka, kafka_target, kip98_target, targets
from tests.java.build import build

__all__ = ["java_classpath", "kafka", "kafka_target", "kip98_target", "targets"]


@pytest.fixture(scope="session")
def java_classpath() -> str:
    """The programs' ``java -cp``, built by Maven unless already built from these sources."""
    return build()
