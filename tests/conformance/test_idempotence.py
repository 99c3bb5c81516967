"""Idempotent producers (KIP-98, KIP-360): what Kafka answers a producer id's batches,
written once and run against kip98 serve and Apache Kafka. Most go as raw requests: a
client never sends a batch twice or out of order on purpose."""

from __future__ import annotations

from typing import Any

import confluent_kafka as ck

from tests.conformance.harness import Target, documented_difference, same
from tests.conformance.normalise import batches, error_name
from tests.conformance.requests import batch, fetch, init_producer_id, produce
from tests.helpers.wire_client import consume_all

MAX_SEQUENCE = 2**31 - 1


def answer(produced: Any) -> list[Any]:
    """A produce answer as [error name, base offset] (-1 on an error)."""
    return [error_name(produced.error_code), produced.base_offset]


def idempotent(target: Target) -> tuple[int, int, Any]:
    """A fresh idempotent producer id: (id, epoch, what InitProducerId answered)."""
    init = init_producer_id(target)
    return init.producer_id, init.producer_epoch, [error_name(init.error_code), init.producer_epoch]


def log(target: Target, topic: str) -> Any:
    data = fetch(target, topic)
    return {"batches": batches(data.records), "high_watermark": data.high_watermark}


def scenario_duplicate_batch(target: Target) -> Any:
    """The same batch sent twice (a retry whose first answer was lost): the second is
    answered with the first's base offset, and the log holds one copy."""
    topic = target.create_topic("dup")
    pid, epoch, init = idempotent(target)
    sent = batch(["a", "b"], pid, epoch, 0)
    return {
        "init": init,
        "first": answer(produce(target, topic, sent)),
        "second": answer(produce(target, topic, sent)),
        "log": log(target, topic),
    }


def test_a_duplicate_batch_is_answered_with_its_first_offset(
    targets: tuple[Target, Target],
) -> None:
    same(scenario_duplicate_batch, *targets)


def scenario_duplicate_of_an_earlier_batch(target: Target) -> Any:
    """A retry of a batch that is not the producer's last (one of the five a partition
    remembers): answered with that batch's own base offset, nothing appended."""
    topic = target.create_topic("dup-earlier")
    pid, epoch, _ = idempotent(target)
    sent = [batch([f"r{i}", f"s{i}"], pid, epoch, 2 * i) for i in range(3)]
    first = [answer(produce(target, topic, b)) for b in sent]
    again = answer(produce(target, topic, sent[1]))
    return {"first": first, "again": again, "high_watermark": log(target, topic)["high_watermark"]}


def test_a_retry_of_an_earlier_batch_is_answered_with_its_offset(
    targets: tuple[Target, Target],
) -> None:
    same(scenario_duplicate_of_an_earlier_batch, *targets)


def scenario_sequence_gap(target: Target) -> Any:
    """A batch whose first sequence skips ahead of the last one written is refused with
    OUT_OF_ORDER_SEQUENCE_NUMBER and appends nothing; the next in order still goes."""
    topic = target.create_topic("gap")
    pid, epoch, _ = idempotent(target)
    return {
        "first": answer(produce(target, topic, batch(["a", "b"], pid, epoch, 0))),
        "gap": answer(produce(target, topic, batch(["x"], pid, epoch, 5))),
        "in_order": answer(produce(target, topic, batch(["c"], pid, epoch, 2))),
        "log": log(target, topic),
    }


def test_a_sequence_gap_is_out_of_order(targets: tuple[Target, Target]) -> None:
    same(scenario_sequence_gap, *targets)


def scenario_sequence_behind(target: Target) -> Any:
    """A batch whose sequence lies behind the last one but is no retry of a remembered
    batch (its range overlaps differently) is refused as out of order."""
    topic = target.create_topic("behind")
    pid, epoch, _ = idempotent(target)
    return {
        "first": answer(produce(target, topic, batch(["a", "b", "c"], pid, epoch, 0))),
        "behind": answer(produce(target, topic, batch(["x"], pid, epoch, 1))),
        "high_watermark": log(target, topic)["high_watermark"],
    }


def test_a_sequence_behind_the_last_is_refused(targets: tuple[Target, Target]) -> None:
    same(scenario_sequence_behind, *targets)


def scenario_first_batch_not_at_zero(target: Target) -> Any:
    """A partition that has never seen the producer takes its first batch at any
    sequence (its earlier batches may have been deleted by retention); the next follows
    on from it."""
    topic = target.create_topic("first-seq")
    pid, epoch, _ = idempotent(target)
    return {
        "first": answer(produce(target, topic, batch(["a"], pid, epoch, 7))),
        "next": answer(produce(target, topic, batch(["b"], pid, epoch, 8))),
        "gap": answer(produce(target, topic, batch(["c"], pid, epoch, 10))),
    }


def test_a_partition_takes_a_new_producers_first_sequence(
    targets: tuple[Target, Target],
) -> None:
    same(scenario_first_batch_not_at_zero, *targets)


def scenario_sequence_wrap(target: Target) -> Any:
    """Sequences wrap at 2^31-1 to 0: a batch straddling the wrap is accepted, the next
    goes on from the wrapped sequence, and a retry of the straddling batch is a
    duplicate."""
    topic = target.create_topic("wrap")
    pid, epoch, _ = idempotent(target)
    straddling = batch(["a", "b", "c"], pid, epoch, MAX_SEQUENCE - 1)
    return {
        "straddling": answer(produce(target, topic, straddling)),
        "after_wrap": answer(produce(target, topic, batch(["d"], pid, epoch, 1))),
        "retry": answer(produce(target, topic, batch(["d"], pid, epoch, 1))),
        "log": log(target, topic),
    }


def test_sequences_wrap_to_zero(targets: tuple[Target, Target]) -> None:
    same(scenario_sequence_wrap, *targets)


def scenario_stale_epoch(target: Target) -> Any:
    """Once a partition has seen a producer's newer epoch, a batch of an older epoch is
    refused (INVALID_PRODUCER_EPOCH, which a client aborts on and retries, KIP-588)."""
    topic = target.create_topic("stale-epoch")
    pid, epoch, _ = idempotent(target)
    return {
        "newer": answer(produce(target, topic, batch(["a"], pid, epoch + 1, 0))),
        "older": answer(produce(target, topic, batch(["b"], pid, epoch, 1))),
        "high_watermark": log(target, topic)["high_watermark"],
    }


def test_an_older_epoch_is_refused(targets: tuple[Target, Target]) -> None:
    same(scenario_stale_epoch, *targets)


def scenario_new_epoch_not_at_zero(target: Target) -> Any:
    """A producer's new epoch starts its sequences again at 0: a first batch of the new
    epoch at any other sequence is out of order."""
    topic = target.create_topic("new-epoch")
    pid, epoch, _ = idempotent(target)
    return {
        "first": answer(produce(target, topic, batch(["a"], pid, epoch, 0))),
        "new_epoch_at_3": answer(produce(target, topic, batch(["b"], pid, epoch + 1, 3))),
        "new_epoch_at_0": answer(produce(target, topic, batch(["c"], pid, epoch + 1, 0))),
        "high_watermark": log(target, topic)["high_watermark"],
    }


def test_a_new_epoch_starts_at_sequence_zero(targets: tuple[Target, Target]) -> None:
    same(scenario_new_epoch_not_at_zero, *targets)


def scenario_idempotent_init_with_an_id(target: Target) -> Any:
    """InitProducerId without a transactional id, naming the producer's current id and
    epoch (KIP-360's bump): an idempotent producer is given a usable id and epoch whose
    batches start again at sequence 0."""
    topic = target.create_topic("bump")
    pid, epoch, _ = idempotent(target)
    first = answer(produce(target, topic, batch(["a"], pid, epoch, 0)))
    bumped = init_producer_id(target, producer_id=pid, epoch=epoch)
    after = answer(
        produce(target, topic, batch(["b"], bumped.producer_id, bumped.producer_epoch, 0))
    )
    return {"first": first, "bump": error_name(bumped.error_code), "after": after}


def test_an_idempotent_producer_bumps_through_init_producer_id(
    targets: tuple[Target, Target],
) -> None:
    same(scenario_idempotent_init_with_an_id, *targets)


def scenario_batches_in_flight(target: Target) -> Any:
    """librdkafka's idempotent producer with five requests in flight, one record a
    batch: every record lands once, in order."""
    topic = target.create_topic("in-flight")
    producer = ck.Producer(
        target.config(**{
            "enable.idempotence": True, "max.in.flight.requests.per.connection": 5,
            "linger.ms": 0, "batch.num.messages": 1,
        })
    )  # fmt: skip
    reports: list[Any] = []
    for i in range(200):
        producer.produce(topic, f"v{i}".encode(), partition=0,
                         on_delivery=lambda err, msg: reports.append((error_name(err), msg.offset())))  # fmt: skip
        producer.poll(0)
    assert producer.flush(60) == 0
    consumer = ck.Consumer(target.config(**{"group.id": target.name_for("g")}))
    consumer.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
    try:
        values = [m.value().decode() for m in consume_all(consumer, 200)]
    finally:
        consumer.close()
    return {
        "errors": sorted({e for e, _ in reports}),
        "offsets_in_order": [o for _, o in reports] == list(range(200)),
        "values": values == [f"v{i}" for i in range(200)],
    }


def test_batches_in_flight_land_once_in_order(targets: tuple[Target, Target]) -> None:
    same(scenario_batches_in_flight, *targets)


def scenario_idempotent_batch_without_acks_all(target: Target) -> Any:
    """An idempotent batch produced with acks=1: what the broker answers (a client never
    sends it: idempotence requires acks=all)."""
    topic = target.create_topic("acks1")
    pid, epoch, _ = idempotent(target)
    return {"acks_1": answer(produce(target, topic, batch(["a"], pid, epoch, 0), acks=1))}


def test_an_idempotent_batch_with_acks_1(targets: tuple[Target, Target]) -> None:
    documented_difference(
        "idempotent-batches-need-acks-all",
        scenario_idempotent_batch_without_acks_all,
        *targets,
        kip98_expected={"acks_1": ["INVALID_REQUIRED_ACKS", -1]},
        kafka_expected={"acks_1": ["NONE", 0]},
    )


def scenario_transactional_batch_without_transactional_id(target: Target) -> Any:
    """A batch flagged transactional in a Produce request that names no transactional id
    is refused, nothing appended."""
    topic = target.create_topic("no-tid")
    pid, epoch, _ = idempotent(target)
    refused = produce(target, topic, batch(["a"], pid, epoch, 0, transactional=True))
    return {"answer": answer(refused), "high_watermark": log(target, topic)["high_watermark"]}


def test_a_transactional_batch_needs_a_transactional_id(targets: tuple[Target, Target]) -> None:
    same(scenario_transactional_batch_without_transactional_id, *targets)


def scenario_transactional_bump(target: Target) -> Any:
    """KIP-360 for a transactional id: InitProducerId naming the current producer id and
    epoch bumps the epoch (same id); naming an older epoch or another producer id is
    refused, and the id's state is unchanged."""
    tid = target.name_for("bump")
    first = init_producer_id(target, tid)
    pid, epoch = first.producer_id, first.producer_epoch
    bumped = init_producer_id(target, tid, producer_id=pid, epoch=epoch)
    stale = init_producer_id(target, tid, producer_id=pid, epoch=epoch)
    other = init_producer_id(target, tid, producer_id=pid + 1000, epoch=bumped.producer_epoch)
    again = init_producer_id(target, tid, producer_id=pid, epoch=bumped.producer_epoch)
    return {
        "bumped": [error_name(bumped.error_code), bumped.producer_id == pid,
                   bumped.producer_epoch - epoch],
        "stale_epoch": error_name(stale.error_code),
        "other_producer_id": error_name(other.error_code),
        "current_again": [error_name(again.error_code), again.producer_id == pid,
                          again.producer_epoch - epoch],
    }  # fmt: skip


def test_a_transactional_id_bumps_through_init_producer_id(
    targets: tuple[Target, Target],
) -> None:
    same(scenario_transactional_bump, *targets)
