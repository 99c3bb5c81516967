"""Kafka's Java clients against kip98 serve and, for comparison, Apache Kafka: the programs
are built once per session (or found built), each test starts them as subprocesses.

The brokers are the conformance suite's: a ``kip98 serve`` per test over a fresh database,
configured as the session's Kafka broker is (tests/conformance/fixtures.py, one Kafka
for the whole session, shared with the conformance suite).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.java.build import build

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here runs against Apache Kafka too: the ``conformance`` mark, so
    ``-m conformance`` runs them and ``-m "not conformance"`` leaves them out."""
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.conformance)


@pytest.fixture(scope="session")
def java_classpath() -> str:
    """The programs' ``java -cp``, built by Maven unless already built from these sources."""
    return build()
