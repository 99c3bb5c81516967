"""Transactions (KIP-98, KIP-447, KIP-890): what a transactional producer, its
coordinator and its readers observe, written once and run against kip98 serve and Apache
Kafka. librdkafka drives the ordinary paths; raw requests the ones a client only meets
when something else went wrong (an old epoch, a request out of turn)."""

from __future__ import annotations

from typing import Any

import confluent_kafka as ck

from tests.conformance.harness import Target, documented_difference, same, wait_until
from tests.conformance.normalise import batches, error_name, records, stems
from tests.conformance.requests import (
    LATEST,
    READ_COMMITTED,
    RawTransaction,
    add_offsets,
    add_partitions,
    add_partitions_answer,
    batch,
    end_txn,
    fetch,
    init_producer_id,
    join_group,
    list_offsets,
    offset_fetch,
    produce,
    txn_offset_commit,
)
from tests.helpers.wire_client import consume_all


def read_all(target: Target, topic: str, isolation: str, want: int) -> list[Any]:
    """The first ``want`` records of partition 0, read by a fresh consumer."""
    consumer = ck.Consumer(
        target.config(**{
            "group.id": target.name_for("reader"), "isolation.level": isolation,
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
        })
    )  # fmt: skip
    consumer.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
    try:
        return records(consume_all(consumer, want))
    finally:
        consumer.close()


def transactional(target: Target, transactional_id: str, **extra: Any) -> ck.Producer:
    producer = ck.Producer(target.config(**{"transactional.id": transactional_id, **extra}))
    producer.init_transactions(60)
    return producer


def failure(call: Any) -> Any:
    """What a client call raised: [error name, fatal, retriable, abortable], or "ok"."""
    try:
        call()
    except ck.KafkaException as e:
        error = e.args[0]
        return [error_name(error), error.fatal(), error.retriable(), error.txn_requires_abort()]
    return "ok"


def scenario_commit_and_abort(target: Target) -> Any:
    """A committed transaction, an aborted one and a committed one again: read_committed
    sees the committed records only, read_uncommitted all of them."""
    topic = target.create_topic("txn")
    producer = transactional(target, target.name_for("tid"))
    for outcome, values in (("commit", "ab"), ("abort", "cd"), ("commit", "e")):
        producer.begin_transaction()
        for v in values:
            producer.produce(topic, v.encode(), key=b"k", partition=0, headers={"h": b"1"})
        producer.flush(30)
        if outcome == "commit":
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    return {
        "read_committed": read_all(target, topic, "read_committed", 3),
        "read_uncommitted": read_all(target, topic, "read_uncommitted", 5),
    }


def test_read_committed_sees_committed_transactions_only(
    targets: tuple[Target, Target],
) -> None:
    same(scenario_commit_and_abort, *targets)


def scenario_fenced_by_a_new_instance(target: Target) -> Any:
    """A second producer of the same transactional id fences the first: the first's
    commit fails fatally, its open transaction is aborted, the second's commits."""
    topic = target.create_topic("fence")
    tid = target.name_for("tid")
    old = transactional(target, tid)
    old.begin_transaction()
    old.produce(topic, b"zombie", partition=0)
    old.flush(30)
    new = transactional(target, tid)
    new.begin_transaction()
    new.produce(topic, b"fresh", partition=0)
    new.commit_transaction(30)
    observed = failure(lambda: old.commit_transaction(30))
    return {"old_commit": observed, "read_committed": read_all(target, topic, "read_committed", 1)}


def test_a_new_instance_fences_the_old_one(targets: tuple[Target, Target]) -> None:
    same(scenario_fenced_by_a_new_instance, *targets)


def scenario_old_epoch_requests(target: Target) -> Any:
    """After a new InitProducerId of its transactional id, every request of the old
    epoch is refused: AddPartitionsToTxn, Produce, EndTxn, AddOffsetsToTxn."""
    topic = target.create_topic("old-epoch")
    old = RawTransaction(target)
    old.open(topic, ["a"])
    new = init_producer_id(target, old.transactional_id)
    return {
        "new": [error_name(new.error_code), new.producer_id == old.producer_id,
                new.producer_epoch - old.epoch],
        "add_partitions": error_name(old.add(topic)),
        "produce": error_name(old.produce(topic, ["b"]).error_code),
        "add_offsets": error_name(add_offsets(target, old.transactional_id, old.producer_id,
                                              old.epoch, target.name_for("g"))),
        "end_txn": error_name(old.end(commit=True)),
    }  # fmt: skip


def test_requests_of_an_old_epoch_are_refused(targets: tuple[Target, Target]) -> None:
    same(scenario_old_epoch_requests, *targets)


def scenario_init_during_an_open_transaction(target: Target) -> Any:
    """InitProducerId while the id's transaction is open aborts it; the new epoch is
    handed out once the abort is complete (CONCURRENT_TRANSACTIONS until then)."""
    topic = target.create_topic("init-open")
    txn = RawTransaction(target)
    txn.open(topic, ["a"])
    seen: list[str] = []

    def again() -> Any:
        answer = init_producer_id(target, txn.transactional_id, retry=False)
        seen.append(error_name(answer.error_code))
        return answer if answer.error_code.value == 0 else None

    done = wait_until(again, "a new epoch after the abort")
    return {
        "answers": sorted(set(seen)),
        "same_id": done.producer_id == txn.producer_id,
        "epoch_moved": done.producer_epoch > txn.epoch,
        "log": batches(fetch(target, topic).records),
    }


def test_init_producer_id_aborts_the_open_transaction(targets: tuple[Target, Target]) -> None:
    aborted = [
        {"base_offset": 0, "control": False, "transactional": True, "records": [[None, "a", []]]},
        {"base_offset": 1, "control": True, "transactional": True, "records": ["ABORT"]},
    ]
    outcome = {"same_id": True, "epoch_moved": True, "log": aborted}
    documented_difference(
        "init-aborts-within-the-request",
        scenario_init_during_an_open_transaction,
        *targets,
        kip98_expected={"answers": ["NONE"], **outcome},
        kafka_expected={"answers": ["CONCURRENT_TRANSACTIONS", "NONE"], **outcome},
    )


def scenario_end_txn_with_nothing_added(target: Target) -> Any:
    """EndTxn of a transactional id that has begun nothing (no partition, no offsets)."""
    txn = RawTransaction(target)
    return {
        "commit": error_name(txn.end(commit=True)),
        "abort": error_name(txn.end(commit=False)),
    }


def test_end_txn_with_nothing_added(targets: tuple[Target, Target]) -> None:
    same(scenario_end_txn_with_nothing_added, *targets)


def scenario_end_txn_retried(target: Target) -> Any:
    """A commit sent again once complete (its first answer lost) succeeds again; an abort
    of the transaction just committed is refused."""
    topic = target.create_topic("end-again")
    txn = RawTransaction(target)
    txn.open(topic, ["a"])
    first = error_name(txn.end(commit=True))

    def settled(commit: bool) -> Any:
        code = error_name(txn.end(commit=commit))
        return None if code == "CONCURRENT_TRANSACTIONS" else code

    return {
        "first": first,
        "commit_again": wait_until(lambda: settled(True), "a settled commit retry"),
        "abort_after_commit": wait_until(lambda: settled(False), "a settled abort"),
        "log": batches(fetch(target, topic).records),
    }


def test_end_txn_retried_after_it_completed(targets: tuple[Target, Target]) -> None:
    same(scenario_end_txn_retried, *targets)


def scenario_concurrent_transactions(target: Target) -> Any:
    """Right after EndTxn, the id's next requests are answered CONCURRENT_TRANSACTIONS
    until its markers are written, or go through: never anything else, and the next
    transaction then works."""
    topic = target.create_topic("concurrent")
    txn = RawTransaction(target)
    txn.open(topic, ["a"])
    assert error_name(txn.end(commit=True)) == "NONE"
    seen: list[str] = []

    def add() -> bool:
        code = error_name(add_partitions(target, txn.transactional_id, txn.producer_id,
                                         txn.epoch, topic)[0])  # fmt: skip
        seen.append(code)
        return code != "CONCURRENT_TRANSACTIONS"

    wait_until(add, "AddPartitionsToTxn after the commit")
    return {
        "answers_until_through": sorted(set(seen) - {"CONCURRENT_TRANSACTIONS"}),
        "only_concurrent_before": all(c == "CONCURRENT_TRANSACTIONS" for c in seen[:-1]),
        "produce": error_name(txn.produce(topic, ["b"]).error_code),
        "commit": error_name(txn.end(commit=True)),
    }


def test_concurrent_transactions_while_markers_are_written(
    targets: tuple[Target, Target],
) -> None:
    same(scenario_concurrent_transactions, *targets)


def scenario_transaction_timeout(target: Target) -> Any:
    """A transaction left open past its transaction.timeout.ms is aborted by its
    coordinator: read_committed moves past it, and the producer's late commit is fenced."""
    topic = target.create_topic("timeout")
    txn = RawTransaction(target, timeout_ms=1000)
    txn.open(topic, ["a", "b"])

    def stable() -> bool:
        lso = list_offsets(target, topic, LATEST, READ_COMMITTED).offset
        return bool(lso == 3)  # the two records and the abort marker

    wait_until(stable, "the coordinator aborting the timed-out transaction", timeout=120)
    late = wait_until(
        lambda: (c := error_name(txn.end(commit=True))) != "CONCURRENT_TRANSACTIONS" and c,
        "a settled late commit",
    )
    return {
        "late_commit": late,
        "log": batches(fetch(target, topic).records),
        "read_committed": batches(fetch(target, topic, isolation=READ_COMMITTED).records),
    }


def test_a_timed_out_transaction_is_aborted(targets: tuple[Target, Target]) -> None:
    same(scenario_transaction_timeout, *targets)


def scenario_client_transaction_timeout(target: Target) -> Any:
    """librdkafka's producer whose transaction outlives transaction.timeout.ms: its commit
    fails (the coordinator aborted the transaction), and nothing of it is read."""
    topic = target.create_topic("client-timeout")
    producer = transactional(target, target.name_for("tid"), **{"transaction.timeout.ms": 1000})
    producer.begin_transaction()
    producer.produce(topic, b"late", partition=0)
    producer.flush(30)
    wait_until(lambda: list_offsets(target, topic, LATEST, READ_COMMITTED).offset == 2,
               "the coordinator aborting the timed-out transaction", timeout=120)  # fmt: skip
    observed = failure(lambda: producer.commit_transaction(30))
    return {
        "commit": observed,
        "read_committed": batches(fetch(target, topic, isolation=1).records),
    }


def test_a_clients_timed_out_transaction_fails_its_commit(
    targets: tuple[Target, Target],
) -> None:
    same(scenario_client_transaction_timeout, *targets)


def scenario_invalid_transaction_timeout(target: Target) -> Any:
    """transaction.timeout.ms above the broker's transaction.max.timeout.ms (15 min) or
    not positive is refused with INVALID_TRANSACTION_TIMEOUT, by the raw request and by
    librdkafka's init_transactions."""
    raw = {
        str(ms): error_name(init_producer_id(target, target.name_for("tid"), ms).error_code)
        for ms in (900_001, 0, -5, 900_000)
    }
    producer = ck.Producer(target.config(**{
        "transactional.id": target.name_for("tid"), "transaction.timeout.ms": 900_001,
    }))  # fmt: skip
    return {"raw": raw, "client": failure(lambda: producer.init_transactions(30))}


def test_an_invalid_transaction_timeout_is_refused(targets: tuple[Target, Target]) -> None:
    same(scenario_invalid_transaction_timeout, *targets)


def scenario_produce_to_a_partition_not_added(target: Target) -> Any:
    """A transactional batch to a partition the transaction never added (KIP-890's
    verification) and a non-transactional batch of a producer whose transaction is open
    are refused, appending nothing."""
    topic = target.create_topic("not-added", partitions=2)
    txn = RawTransaction(target)
    txn.open(topic, ["a"], partition=0)
    not_added = txn.produce(topic, ["b"], partition=1)
    plain = produce(target, topic, batch(["c"], txn.producer_id, txn.epoch, 1), 0)
    return {
        "not_added": error_name(not_added.error_code),
        "non_transactional": error_name(plain.error_code),
        "partition_1": fetch(target, topic, partition=1).high_watermark,
    }


def test_batches_outside_the_transaction_are_refused(targets: tuple[Target, Target]) -> None:
    same(scenario_produce_to_a_partition_not_added, *targets)


def scenario_add_unknown_partition(target: Target) -> Any:
    """AddPartitionsToTxn naming a partition that does not exist: that one is
    UNKNOWN_TOPIC_OR_PARTITION, the others OPERATION_NOT_ATTEMPTED, nothing added."""
    topic = target.create_topic("add-unknown")
    txn = RawTransaction(target)
    answer = add_partitions_answer(
        target, txn.transactional_id, txn.producer_id, txn.epoch, topic, (0, 7)
    )
    return {"codes": answer, "commit": error_name(txn.end(commit=True))}


def test_adding_an_unknown_partition(targets: tuple[Target, Target]) -> None:
    same(scenario_add_unknown_partition, *targets)


def scenario_txn_offset_commit_generations(target: Target) -> Any:
    """KIP-447: a transactional offset commit carrying the group's member and generation
    is checked like a consumer's own commit: a wrong generation or an unknown member are
    refused; the right ones go through and count once the
    transaction commits."""
    topic = target.create_topic("txn-offsets")
    group = target.name_for("group")
    member, generation = join_group(target, group, topic)
    txn = RawTransaction(target)
    added = error_name(add_offsets(target, txn.transactional_id, txn.producer_id, txn.epoch, group))

    def commit(**kw: Any) -> str:
        return error_name(txn_offset_commit(target, txn.transactional_id, txn.producer_id,
                                            txn.epoch, group, topic, 5, **kw))  # fmt: skip

    observed = {
        "add_offsets": added,
        "stale_generation": commit(generation=generation - 1, member_id=member),
        "newer_generation": commit(generation=generation + 1, member_id=member),
        "unknown_member": commit(generation=generation, member_id="nobody"),
        "right": commit(generation=generation, member_id=member),
        "end": error_name(txn.end(commit=True)),
    }  # fmt: skip
    wait_until(lambda: offset_fetch(target, group, topic, True)[1].value == 0,
               "the committed offsets stable")  # fmt: skip
    observed["committed"] = offset_fetch(target, group, topic, True)[2]
    return observed


def test_txn_offset_commit_checks_the_generation(targets: tuple[Target, Target]) -> None:
    same(scenario_txn_offset_commit_generations, *targets)


def scenario_txn_offset_commit_without_add_offsets(target: Target) -> Any:
    """A transactional offset commit for a group the transaction never added."""
    topic = target.create_topic("txn-no-add")
    group = target.name_for("group")
    txn = RawTransaction(target)
    code = txn_offset_commit(
        target, txn.transactional_id, txn.producer_id, txn.epoch, group, topic, 1
    )
    return {"code": error_name(code)}


def test_txn_offset_commit_without_add_offsets(targets: tuple[Target, Target]) -> None:
    same(scenario_txn_offset_commit_without_add_offsets, *targets)


def scenario_consume_transform_produce(target: Target) -> Any:
    """librdkafka's exactly-once loop: records read from one topic, written to another
    and the consumer's offsets sent to the transaction; after the commit the output is
    readable and the group's offset is past the input."""
    source = target.create_topic("source")
    sink = target.create_topic("sink")
    plain = ck.Producer(target.config())
    for i in range(3):
        plain.produce(source, f"in{i}".encode(), partition=0)
    assert plain.flush(30) == 0
    group = target.name_for("copier")
    consumer = ck.Consumer(target.config(**{
        "group.id": group, "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
    }))  # fmt: skip
    consumer.subscribe([source])
    producer = transactional(target, target.name_for("copier-tid"))
    try:
        got = consume_all(consumer, 3)
        producer.begin_transaction()
        for m in got:
            producer.produce(sink, m.value().upper(), partition=0)
        producer.send_offsets_to_transaction(
            consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30
        )
        producer.commit_transaction(30)
        committed = consumer.committed([ck.TopicPartition(source, 0)], timeout=30)
    finally:
        consumer.close()
    return {
        "read": records(got),
        "committed": [tp.offset for tp in committed],
        "output": read_all(target, sink, "read_committed", 3),
    }


def test_consume_transform_produce(targets: tuple[Target, Target]) -> None:
    same(scenario_consume_transform_produce, *targets)


def scenario_abort_then_reuse(target: Target) -> Any:
    """librdkafka's abort_transaction after a failed-looking produce, then a fresh
    transaction on the same producer: only the second's records are read committed."""
    topic = target.create_topic("abort-reuse")
    producer = transactional(target, target.name_for("tid"))
    producer.begin_transaction()
    producer.produce(topic, b"dropped", partition=0)
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, b"kept", partition=0)
    producer.commit_transaction(30)
    wait_until(lambda: list_offsets(target, topic, LATEST, READ_COMMITTED).offset == 4,
               "the commit marker written")  # fmt: skip
    return {
        "read_committed": read_all(target, topic, "read_committed", 1),
        "log": batches(fetch(target, topic).records),
    }


def test_an_aborted_producer_goes_on(targets: tuple[Target, Target]) -> None:
    same(scenario_abort_then_reuse, *targets)


def scenario_wrong_producer_id(target: Target) -> Any:
    """Requests naming a producer id the transactional id does not have, and an EndTxn of
    an id never initialised, are refused (INVALID_PRODUCER_ID_MAPPING)."""
    topic = target.create_topic("wrong-pid")
    txn = RawTransaction(target)
    other = txn.producer_id + 1000
    return {
        "add_partitions": error_name(add_partitions(target, txn.transactional_id, other,
                                                    txn.epoch, topic)[0]),
        "add_offsets": error_name(add_offsets(target, txn.transactional_id, other, txn.epoch,
                                              target.name_for("g"))),
        "end_txn": error_name(end_txn(target, txn.transactional_id, other, txn.epoch, True)),
        "end_txn_unknown_id": error_name(end_txn(target, target.name_for("never"),
                                                 txn.producer_id, txn.epoch, True)),
    }  # fmt: skip


def test_a_wrong_producer_id_is_refused(targets: tuple[Target, Target]) -> None:
    same(scenario_wrong_producer_id, *targets)


def scenario_commit_across_partitions(target: Target) -> Any:
    """One transaction over three partitions of two topics: each partition gets its data
    and a COMMIT marker, and read_committed reads all of it."""
    first = target.create_topic("multi-a", partitions=2)
    second = target.create_topic("multi-b")
    producer = transactional(target, target.name_for("tid"))
    producer.begin_transaction()
    for topic, partition in ((first, 0), (first, 1), (second, 0)):
        producer.produce(topic, f"{partition}".encode(), partition=partition)
    producer.commit_transaction(30)
    # Kafka answers the commit once it is decided; its markers reach the partitions after.
    for topic, partition in ((first, 0), (first, 1), (second, 0)):
        wait_until(
            lambda t=topic, p=partition: (
                list_offsets(target, t, LATEST, READ_COMMITTED, p).offset == 2
            ),
            "the commit markers written",
        )
    logs = {
        f"{t}/{p}": batches(fetch(target, t, partition=p, isolation=READ_COMMITTED).records)
        for t, p in ((first, 0), (first, 1), (second, 0))
    }
    return stems(logs)


def test_a_commit_across_partitions(targets: tuple[Target, Target]) -> None:
    same(scenario_commit_across_partitions, *targets)


def scenario_list_transactions(target: Target) -> Any:
    """ListTransactions filtered by state: an open transaction is listed as Ongoing, one
    ended as CompleteCommit, an id that never began as Empty (among whatever else the
    broker holds, so only this scenario's ids are compared)."""
    from kio.schema.list_transactions.v1 import request as r

    topic = target.create_topic("list")
    ongoing, committed, empty = (RawTransaction(target, s) for s in ("open", "done", "idle"))
    ongoing.open(topic, ["a"])
    committed.open(topic, ["b"])
    assert error_name(committed.end(commit=True)) == "NONE"
    mine = {t.transactional_id for t in (ongoing, committed, empty)}

    def listed(*states: str) -> Any:
        answer = target.raw(66, 1, r.ListTransactionsRequest(state_filters=states))
        return {
            "error": error_name(answer.error_code),
            "unknown_filters": list(answer.unknown_state_filters),
            "ids": sorted([stems(t.transactional_id), t.transaction_state]
                          for t in answer.transaction_states if t.transactional_id in mine),
        }  # fmt: skip

    wait_until(lambda: ["done", "CompleteCommit"] in listed()["ids"], "the commit complete")
    return {
        "all": listed(),
        "ongoing": listed("Ongoing"),
        "complete": listed("CompleteCommit", "CompleteAbort"),
        "unknown_filter": listed("NoSuchState"),
    }


def test_list_transactions_by_state(targets: tuple[Target, Target]) -> None:
    same(scenario_list_transactions, *targets)
