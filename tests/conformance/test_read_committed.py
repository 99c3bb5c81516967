"""read_committed (KIP-98): the last stable offset, the aborted-transaction index, control
records, ListOffsets and OffsetFetch under both isolations, and the transaction and
producer state the admin APIs describe — written once and run against kip98 serve and
Apache Kafka."""

from __future__ import annotations

import time
from typing import Any

import confluent_kafka as ck

from tests.conformance.harness import Target, same, wait_until
from tests.conformance.normalise import batches, error_name, lso_relation, records, stems
from tests.conformance.requests import (
    EARLIEST,
    LATEST,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    RawTransaction,
    add_offsets,
    batch,
    describe_producers,
    describe_transactions,
    fetch,
    init_producer_id,
    list_offsets,
    offset_fetch,
    produce,
    txn_offset_commit,
)
from tests.helpers.wire_client import consume_all


def plain_record(target: Target, topic: str, value: str, partition: int = 0) -> None:
    producer = ck.Producer(target.config())
    producer.produce(topic, value.encode(), partition=partition)
    assert producer.flush(30) == 0


def offsets(target: Target, topic: str) -> dict[str, int]:
    """ListOffsets' earliest and latest under both isolations."""
    return {
        f"{name}_{iso}": list_offsets(target, topic, ts, level).offset
        for name, ts in (("earliest", EARLIEST), ("latest", LATEST))
        for iso, level in (("uncommitted", READ_UNCOMMITTED), ("committed", READ_COMMITTED))
    }


def fetched(target: Target, topic: str, isolation: int, offset: int = 0) -> dict[str, Any]:
    """A raw fetch's view: high watermark, LSO (and its relation), batches."""
    data = fetch(target, topic, offset, isolation)
    return {
        "error": error_name(data.error_code),
        "high_watermark": data.high_watermark,
        "last_stable_offset": data.last_stable_offset,
        "relation": lso_relation(data.last_stable_offset, data.high_watermark),
        "batches": batches(data.records),
    }


def scenario_lso_below_an_open_transaction(target: Target) -> Any:
    """An open transaction holds the last stable offset at its first record: read_committed
    fetches and ListOffsets stop there, read_uncommitted ones go to the high watermark;
    once it commits, LSO and high watermark meet again past its marker."""
    topic = target.create_topic("lso")
    plain_record(target, topic, "before")
    txn = RawTransaction(target)
    txn.open(topic, ["t1", "t2"])
    during = {
        "offsets": offsets(target, topic),
        "read_committed": fetched(target, topic, READ_COMMITTED),
        "read_uncommitted": fetched(target, topic, READ_UNCOMMITTED),
        "committed_at_lso": fetched(target, topic, READ_COMMITTED, offset=1),
    }
    assert error_name(txn.end(commit=True)) == "NONE"
    wait_until(lambda: list_offsets(target, topic, LATEST, READ_COMMITTED).offset == 4,
               "the LSO past the commit marker")  # fmt: skip
    after = {
        "offsets": offsets(target, topic),
        "read_committed": fetched(target, topic, READ_COMMITTED),
    }
    return {"during": during, "after": after}


def test_the_lso_stays_below_an_open_transaction(targets: tuple[Target, Target]) -> None:
    same(scenario_lso_below_an_open_transaction, *targets)


def aborted_index(target: Target, topic: str, offset: int, names: dict[int, str]) -> Any:
    """A read_committed fetch's aborted transactions, producer ids by name."""
    data = fetch(target, topic, offset, READ_COMMITTED)
    if data.aborted_transactions is None:
        return None
    return sorted(
        [names.get(a.producer_id, "other"), a.first_offset] for a in data.aborted_transactions
    )


def scenario_aborted_transaction_index(target: Target) -> Any:
    """Two producers interleaved on one partition, one aborting: a read_committed fetch
    lists the aborted transaction (its producer and first offset) for the client to drop;
    a fetch starting past it lists nothing; read_uncommitted gets no list."""
    topic = target.create_topic("aborted")
    aborting, committing = RawTransaction(target, "aborting"), RawTransaction(target, "committing")
    aborting.open(topic, ["x1"])  # offset 0
    committing.open(topic, ["c1"])  # offset 1
    assert aborting.produce(topic, ["x2"]).error_code.value == 0  # offset 2
    assert error_name(aborting.end(commit=False)) == "NONE"  # marker at 3
    # Kafka writes a transaction's markers after EndTxn answers: the next end waits for
    # the abort's marker, so that the markers' order is the ends' on both brokers.
    wait_until(lambda: list_offsets(target, topic, LATEST, READ_UNCOMMITTED).offset == 4,
               "the abort marker")  # fmt: skip
    assert error_name(committing.end(commit=True)) == "NONE"  # marker at 4
    wait_until(lambda: list_offsets(target, topic, LATEST, READ_COMMITTED).offset == 5,
               "both transactions ended")  # fmt: skip
    names = {aborting.producer_id: "aborting", committing.producer_id: "committing"}
    uncommitted = fetch(target, topic, 0, READ_UNCOMMITTED)
    return {
        "from_0": aborted_index(target, topic, 0, names),
        "from_2": aborted_index(target, topic, 2, names),
        "from_4": aborted_index(target, topic, 4, names),
        "read_uncommitted_list": uncommitted.aborted_transactions,
        "log": batches(uncommitted.records),
        "client_read_committed": read_values(target, topic, "read_committed", 1),
        "client_read_uncommitted": read_values(target, topic, "read_uncommitted", 3),
    }


def read_values(target: Target, topic: str, isolation: str, want: int) -> list[Any]:
    consumer = ck.Consumer(target.config(**{
        "group.id": target.name_for("reader"), "isolation.level": isolation,
        "enable.auto.commit": False,
    }))  # fmt: skip
    consumer.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
    try:
        return records(consume_all(consumer, want))
    finally:
        consumer.close()


def test_the_aborted_transaction_index(targets: tuple[Target, Target]) -> None:
    same(scenario_aborted_transaction_index, *targets)


def scenario_control_records(target: Target) -> Any:
    """Markers are batches of their own in the log: a raw fetch shows the COMMIT and ABORT
    control batches at their offsets under either isolation; a client never returns them
    as records, though they take offsets (its position moves past them)."""
    topic = target.create_topic("control")
    txn = RawTransaction(target)
    txn.open(topic, ["a"])
    assert error_name(txn.end(commit=True)) == "NONE"
    wait_until(lambda: list_offsets(target, topic, LATEST, READ_COMMITTED).offset == 2,
               "the commit marker")  # fmt: skip
    assert txn.add(topic).value == 0
    assert txn.produce(topic, ["b"]).error_code.value == 0
    assert error_name(txn.end(commit=False)) == "NONE"
    wait_until(lambda: list_offsets(target, topic, LATEST, READ_COMMITTED).offset == 4,
               "the abort marker")  # fmt: skip
    plain_record(target, topic, "after")
    consumer = ck.Consumer(target.config(**{
        "group.id": target.name_for("reader"), "isolation.level": "read_uncommitted",
        "enable.auto.commit": False,
    }))  # fmt: skip
    consumer.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
    try:
        got = consume_all(consumer, 3)
        position = consumer.position([ck.TopicPartition(topic, 0)])[0].offset
    finally:
        consumer.close()
    return {
        "read_uncommitted": fetched(target, topic, READ_UNCOMMITTED),
        "read_committed": fetched(target, topic, READ_COMMITTED),
        "client": [[m.offset(), m.value().decode()] for m in got],
        "client_position": position,
    }


def test_control_records_take_offsets_but_are_no_records(
    targets: tuple[Target, Target],
) -> None:
    same(scenario_control_records, *targets)


def scenario_offset_fetch_require_stable(target: Target) -> Any:
    """KIP-447: while a transactional offset commit is pending, OffsetFetch with
    requireStable answers UNSTABLE_OFFSET_COMMIT for the partition; without it, the last
    stable offset. Once committed, the new offset; an aborted one leaves the old."""
    topic = target.create_topic("stable")
    group = target.name_for("group")

    def pending(txn: RawTransaction, offset: int) -> None:
        assert error_name(add_offsets(target, txn.transactional_id, txn.producer_id,
                                      txn.epoch, group)) == "NONE"  # fmt: skip
        code = txn_offset_commit(target, txn.transactional_id, txn.producer_id, txn.epoch,
                                 group, topic, offset)  # fmt: skip
        assert error_name(code) == "NONE"

    def observe(require_stable: bool) -> list[Any]:
        _, part, offset = offset_fetch(target, group, topic, require_stable)
        return [error_name(part), offset]

    txn = RawTransaction(target)
    pending(txn, 5)
    first = {"stable": observe(True), "unstable_allowed": observe(False)}
    assert error_name(txn.end(commit=True)) == "NONE"
    wait_until(lambda: observe(True)[0] == "NONE", "the commit's offsets stable")
    committed = observe(True)
    pending(txn, 9)
    second = {"stable": observe(True), "unstable_allowed": observe(False)}
    assert error_name(txn.end(commit=False)) == "NONE"
    wait_until(lambda: observe(True)[0] == "NONE", "the abort's offsets settled")
    return {"pending": first, "committed": committed, "pending_again": second,
            "aborted": observe(True)}  # fmt: skip


def test_offset_fetch_require_stable(targets: tuple[Target, Target]) -> None:
    same(scenario_offset_fetch_require_stable, *targets)


def described(target: Target, transactional_id: str, first_epoch: int) -> Any:
    """The id's DescribeTransactions state; its start time as whether it has one (-1: an
    Empty id has none)."""
    [state] = describe_transactions(target, transactional_id)
    seen = {
        "error": error_name(state["error_code"]),
        "state": state["transaction_state"],
        "timeout_ms": state["transaction_timeout_ms"],
        "epoch": state["producer_epoch"] - first_epoch if state["producer_epoch"] >= 0 else None,
        "topics": sorted([stems(t), sorted(p)] for t, p in state["topics"]),
    }
    start = state["transaction_start_time_ms"]
    seen["started"] = start if start == -1 else start > 0
    return seen


def scenario_describe_transactions(target: Target) -> Any:
    """DescribeTransactions through a transactional id's life: Empty after
    InitProducerId, Ongoing with its partitions, CompleteCommit, Ongoing again,
    CompleteAbort; an id never initialised is TRANSACTIONAL_ID_NOT_FOUND."""
    topic = target.create_topic("describe", partitions=2)
    txn = RawTransaction(target, timeout_ms=45_000)
    seen = {"empty": described(target, txn.transactional_id, txn.epoch)}
    txn.open(topic, ["a"], partition=1)
    seen["ongoing"] = described(target, txn.transactional_id, txn.epoch)
    assert error_name(txn.end(commit=True)) == "NONE"
    seen["committed"] = wait_until(
        lambda: (d := described(target, txn.transactional_id, txn.epoch))["state"]
        != "PrepareCommit" and d, "the commit complete")  # fmt: skip
    txn.open(topic, ["b"], partition=0)
    assert error_name(txn.end(commit=False)) == "NONE"
    seen["aborted"] = wait_until(
        lambda: (d := described(target, txn.transactional_id, txn.epoch))["state"]
        != "PrepareAbort" and d, "the abort complete")  # fmt: skip
    [unknown] = describe_transactions(target, target.name_for("never"))
    seen["unknown"] = error_name(unknown["error_code"])
    return seen


def test_describe_transactions_states(targets: tuple[Target, Target]) -> None:
    same(scenario_describe_transactions, *targets)


def producer_states(target: Target, topic: str, names: dict[int, str]) -> Any:
    data = describe_producers(target, topic)
    return {
        "error": error_name(data.error_code),
        "producers": sorted(
            (
                [names.get(p.producer_id, "other"), p.last_sequence,
                 p.current_txn_start_offset if p.current_txn_start_offset >= 0 else None,
                 p.last_timestamp > 0]
                for p in data.active_producers
            ),
            key=str,
        ),
    }  # fmt: skip


def scenario_describe_producers(target: Target) -> Any:
    """DescribeProducers of a partition: each producer that wrote to it, with its last
    sequence and the first offset of its open transaction (none once it ended)."""
    topic = target.create_topic("producers")
    init = init_producer_id(target)
    idem = init.producer_id
    assert (
        produce(target, topic, batch(["a", "b"], idem, init.producer_epoch, 0)).error_code.value
        == 0
    )
    assert (
        produce(
            target, topic, batch(["c", "d", "e"], idem, init.producer_epoch, 2)
        ).error_code.value
        == 0
    )
    txn = RawTransaction(target)
    txn.open(topic, ["t1", "t2"])  # offsets 5, 6
    names = {idem: "idempotent", txn.producer_id: "transactional"}
    during = producer_states(target, topic, names)
    assert error_name(txn.end(commit=True)) == "NONE"
    wait_until(lambda: list_offsets(target, topic, LATEST, READ_COMMITTED).offset == 8,
               "the commit marker")  # fmt: skip
    return {"during": during, "after": producer_states(target, topic, names)}


def test_describe_producers(targets: tuple[Target, Target]) -> None:
    same(scenario_describe_producers, *targets)


def scenario_read_committed_client_waits_for_the_commit(target: Target) -> Any:
    """A librdkafka read_committed consumer reads the records before an open transaction,
    and the transaction's own records only once it commits."""
    topic = target.create_topic("client-lso")
    plain_record(target, topic, "before")
    txn = RawTransaction(target)
    txn.open(topic, ["t1"])
    consumer = ck.Consumer(target.config(**{
        "group.id": target.name_for("reader"), "isolation.level": "read_committed",
        "enable.auto.commit": False,
    }))  # fmt: skip
    consumer.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
    try:
        before = records(consume_all(consumer, 1))
        lso = consumer.get_watermark_offsets(ck.TopicPartition(topic, 0), cached=False)
        assert error_name(txn.end(commit=True)) == "NONE"
        after = records(consume_all(consumer, 1))
    finally:
        consumer.close()
    return {"before": before, "watermarks_during": list(lso), "after": after}


def test_a_read_committed_client_waits_for_the_commit(targets: tuple[Target, Target]) -> None:
    same(scenario_read_committed_client_waits_for_the_commit, *targets)


def scenario_read_committed_skips_an_aborted_tail(target: Target) -> Any:
    """A read_committed client over an aborted transaction followed by one record: it
    reads that record at its own offset, and its position ends past the log's end."""
    topic = target.create_topic("skip-aborted")
    txn = RawTransaction(target)
    txn.open(topic, ["x1", "x2"])
    assert error_name(txn.end(commit=False)) == "NONE"
    wait_until(lambda: list_offsets(target, topic, LATEST, READ_COMMITTED).offset == 3,
               "the abort marker")  # fmt: skip
    plain_record(target, topic, "after")
    consumer = ck.Consumer(target.config(**{
        "group.id": target.name_for("reader"), "isolation.level": "read_committed",
        "enable.auto.commit": False,
    }))  # fmt: skip
    consumer.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
    try:
        got = consume_all(consumer, 1)
        position = consumer.position([ck.TopicPartition(topic, 0)])[0].offset
    finally:
        consumer.close()
    return {"read": [[m.offset(), m.value().decode()] for m in got], "position": position}


def test_read_committed_skips_an_aborted_transaction(targets: tuple[Target, Target]) -> None:
    same(scenario_read_committed_skips_an_aborted_tail, *targets)


def scenario_list_offsets_by_time(target: Target) -> Any:
    """ListOffsets by timestamp (and the newest timestamp, -3, KIP-734) under both
    isolations while a transaction is open: read_committed finds no offset at or past the
    LSO; once committed, the marker is found by its timestamp like a record."""
    topic = target.create_topic("by-time")
    base = int(time.time() * 1000) - 60_000
    init = init_producer_id(target)
    first = batch(["early"], init.producer_id, init.producer_epoch, 0, timestamp=base)
    assert produce(target, topic, first).error_code.value == 0
    txn = RawTransaction(target)
    assert txn.add(topic).value == 0
    assert txn.produce(topic, ["late"], timestamp=base + 10_000).error_code.value == 0

    def lookup(timestamp: int, isolation: int, where: str = topic) -> list[Any]:
        answer = list_offsets(target, where, timestamp, isolation)
        found = answer.timestamp - base if answer.timestamp >= 0 else answer.timestamp
        # A marker's timestamp is when it was written: only whether it is later counts.
        return [error_name(answer.error_code), answer.offset, min(found, 60_000)]

    queries = {"t-1": base - 1, "t+5s": base + 5_000, "t+20s": base + 20_000, "max": -3}
    during = {
        name: {"uncommitted": lookup(ts, READ_UNCOMMITTED), "committed": lookup(ts, READ_COMMITTED)}
        for name, ts in queries.items()
    }
    assert error_name(txn.end(commit=True)) == "NONE"
    wait_until(lambda: list_offsets(target, topic, LATEST, READ_COMMITTED).offset == 3,
               "the commit marker")  # fmt: skip
    after = {name: lookup(ts, READ_COMMITTED) for name, ts in queries.items()}
    empty = target.create_topic("by-time-empty")
    nothing = {name: lookup(ts, READ_UNCOMMITTED, empty) for name, ts in queries.items()}
    return {"during": during, "after_commit": after, "empty": nothing}


def test_list_offsets_by_time_under_both_isolations(targets: tuple[Target, Target]) -> None:
    same(scenario_list_offsets_by_time, *targets)
