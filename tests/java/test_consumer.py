"""Kafka's Java consumer under read_committed against kip98 and Kafka: never an aborted or
open record, endOffsets and seekToEnd stop at the LSO."""

from __future__ import annotations

from typing import Any

from tests.conformance.harness import Target, same
from tests.java.build import run


def test_read_committed_stops_at_the_lso(
    targets: tuple[Target, Target], java_classpath: str
) -> None:
    def scenario(target: Target) -> Any:
        topic = target.create_topic("jrc")
        txid = target.name_for("jtx")
        return run(java_classpath, "Consumers", target.bootstrap, "read-committed", topic, txid)

    same(scenario, *targets)
