"""Idempotent producers (KIP-98, KIP-360): what Kafka answers a producer id's batches,
written once and run against kip98 serve and Apache Kafka."""

from __future__ import annotations

from typing import Any

from tests.conformance.harness import Target, same
from tests.conformance.normalise import batches, error_name
from tests.conformance.requests import batch, fetch, init_producer_id, produce


def scenario_duplicate_batch(target: Target) -> Any:
    """The same batch sent twice (a retry whose first answer was lost): the second is
    answered with the first's base offset, and the log holds one copy."""
    topic = target.create_topic("dup")
    init = init_producer_id(target)
    pid, epoch = init.producer_id, init.producer_epoch
    sent = batch(["a", "b"], pid, epoch, 0)
    first = produce(target, topic, sent)
    second = produce(target, topic, sent)
    data = fetch(target, topic)
    return {
        "init": [error_name(init.error_code), epoch],
        "first": [error_name(first.error_code), first.base_offset],
        "second": [error_name(second.error_code), second.base_offset],
        "log": batches(data.records),
        "high_watermark": data.high_watermark,
    }


def test_a_duplicate_batch_is_answered_with_its_first_offset(
    targets: tuple[Target, Target],
) -> None:
    same(scenario_duplicate_batch, *targets)
