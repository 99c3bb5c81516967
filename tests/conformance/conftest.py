"""Every test under tests/conformance runs one scenario against ``kip98 serve`` and Apache
Kafka 4.4: the fixtures (``kafka``, ``kip98_target``, ``targets``) are in
``tests/conformance/fixtures.py``, imported by tests/conftest.py so one Kafka serves the
whole test session.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/conformance carries the ``conformance`` mark."""
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.conformance)
