"""KIP-890's transaction version 2 on the wire, as Kafka 4's producers speak it with
``transaction.version`` 2 finalized: Produce v12 adds its partition to the transaction,
EndTxn v5 bumps the epoch at every end and answers with the next identity, TxnOffsetCommit
v5 adds the group's offsets, a timed-out transaction's late EndTxn is taken as Kafka takes
it, and a producer of the first version works beside one of the second. Raw requests
(``tv2_calls``), run against kip98 serve and Apache Kafka 4.4."""

from __future__ import annotations

from typing import Any

from tests.conformance.harness import Target, same, wait_until
from tests.conformance.normalise import batches, error_name, stems
from tests.conformance.requests import (
    LATEST,
    READ_COMMITTED,
    RawTransaction,
    describe_transactions,
    fetch,
    list_offsets,
    offset_fetch,
)
from tests.conformance.tv2_calls import Tv2Transaction, add_partitions5, txn_offset_commit5


def completed(txn: Tv2Transaction, state: str) -> dict[str, Any]:
    """The id described once its transaction reached ``state`` (Kafka writes the markers
    after answering EndTxn; kip98 before)."""
    return wait_until(
        lambda: (d := txn.described())["state"] == state and d, f"the transaction {state}"
    )


def settled(target: Target, transactional_id: str, state: str) -> None:
    """Until the id's transaction reached ``state``: its markers are written."""
    wait_until(
        lambda: describe_transactions(target, transactional_id)[0]["transaction_state"] == state,
        f"the transaction {state}",
    )


def scenario_end_txn_v5_bumps_the_epoch(target: Target) -> Any:
    """Every end bumps the epoch (the producer id kept), the next transaction runs on the
    epoch answered, the old epoch is refused, and a retried EndTxn is answered with the
    identity already given."""
    topic = target.create_topic("tv2-end")
    txn = Tv2Transaction(target)
    steps: dict[str, Any] = {"first_produce": txn.produce(topic, ["a"])}
    steps["ongoing"] = txn.described()
    old = txn.epoch
    steps["commit"] = txn.end(commit=True)
    steps["committed"] = completed(txn, "CompleteCommit")
    steps["commit_retried"] = txn.end(commit=True, epoch=old)
    steps["abort_at_the_old_epoch"] = txn.end(commit=False, epoch=old)
    steps["produce_at_the_old_epoch"] = txn.produce(topic, ["stale"], epoch=old)
    steps["second_produce"] = txn.produce(topic, ["b"])
    steps["abort"] = txn.end(commit=False)
    steps["aborted"] = completed(txn, "CompleteAbort")
    steps["third_produce"] = txn.produce(topic, ["c"])
    steps["commit_again"] = txn.end(commit=True)
    completed(txn, "CompleteCommit")
    steps["read_committed"] = batches(fetch(target, topic, isolation=READ_COMMITTED).records)
    return stems(steps)


def test_end_txn_v5_bumps_the_epoch_at_every_end(targets: tuple[Target, Target]) -> None:
    same(scenario_end_txn_v5_bumps_the_epoch, *targets)


def scenario_produce_adds_its_partition(target: Target) -> Any:
    """Produce v12 adds its partition to the transaction (no AddPartitionsToTxn); v11, of
    the first version, does not: a partition never added is refused."""
    topic = target.create_topic("tv2-add", partitions=1)
    other = target.create_topic("tv2-v11")
    txn = Tv2Transaction(target)
    observed: dict[str, Any] = {
        "v12": txn.produce(topic, ["a"]),
        "v12_again": txn.produce(topic, ["b"]),
        "v11_not_added": txn.produce(other, ["x"], version=11),
        "described": txn.described(),
    }
    observed["end"] = txn.end(commit=False)
    return stems(observed)


def test_produce_v12_adds_its_partition(targets: tuple[Target, Target]) -> None:
    same(scenario_produce_adds_its_partition, *targets)


def scenario_txn_offset_commit_v5_adds_the_offsets(target: Target) -> Any:
    """TxnOffsetCommit v5 needs no AddOffsetsToTxn: the offsets commit with the
    transaction, and are read once it completes."""
    topic = target.create_topic("tv2-offsets")
    group = target.name_for("group")
    txn = Tv2Transaction(target)
    observed: dict[str, Any] = {"produce": txn.produce(topic, ["a"])}
    observed["offset_commit"] = txn_offset_commit5(
        target, txn.transactional_id, txn.producer_id, txn.epoch, group, topic, 7
    )
    observed["end"] = txn.end(commit=True)
    completed(txn, "CompleteCommit")

    def fetched() -> Any:
        top, part, offset = offset_fetch(target, group, topic, require_stable=True)
        return error_name(part) != "UNSTABLE_OFFSET_COMMIT" and [error_name(top), offset]

    observed["fetched"] = wait_until(fetched, "the committed offset")
    return stems(observed)


def test_txn_offset_commit_v5_adds_the_offsets(targets: tuple[Target, Target]) -> None:
    same(scenario_txn_offset_commit_v5_adds_the_offsets, *targets)


def scenario_timeout_abort_of_a_v2_producer(target: Target) -> Any:
    """The coordinator aborts a transaction left open past its timeout, bumping the epoch:
    the old epoch's produce is refused, its commit is INVALID_TXN_STATE, its abort is taken
    as a retry of the coordinator's and answered with the new identity, on which the
    producer goes on."""
    topic = target.create_topic("tv2-timeout")
    txn = Tv2Transaction(target, timeout_ms=1000)
    old = txn.epoch
    observed: dict[str, Any] = {"produce": txn.produce(topic, ["late"])}
    observed["aborted"] = completed(txn, "CompleteAbort")
    observed["produce_at_the_old_epoch"] = txn.produce(topic, ["zombie"], epoch=old)
    observed["commit"] = txn.end(commit=True, epoch=old)
    observed["abort"] = txn.end(commit=False, epoch=old)
    observed["next_produce"] = txn.produce(topic, ["next"])
    observed["next_commit"] = txn.end(commit=True)
    completed(txn, "CompleteCommit")
    wait_until(
        lambda: (
            list_offsets(target, topic, LATEST, READ_COMMITTED).offset
            == list_offsets(target, topic, LATEST).offset
        ),
        "the last commit's marker",
    )
    observed["read_committed"] = batches(fetch(target, topic, isolation=READ_COMMITTED).records)
    return stems(observed)


def test_a_timed_out_v2_transaction_is_aborted_as_kafka_aborts_it(
    targets: tuple[Target, Target],
) -> None:
    same(scenario_timeout_abort_of_a_v2_producer, *targets)


def scenario_v1_and_v2_producers_together(target: Target) -> Any:
    """A producer of the first version (AddPartitionsToTxn, EndTxn v3: its epoch kept)
    and one of the second (Produce v12, EndTxn v5: its epoch bumped) on one partition,
    their transactions interleaved: each ends as asked, readers see the committed ones."""
    topic = target.create_topic("tv2-mixed")
    v1 = RawTransaction(target, "v1")
    v2 = Tv2Transaction(target, "v2")
    v1.open(topic, ["v1-a"])
    observed: dict[str, Any] = {"v2_produce": v2.produce(topic, ["v2-a"])}
    observed["v1_commit"] = error_name(v1.end(commit=True))
    settled(target, v1.transactional_id, "CompleteCommit")
    observed["v2_abort"] = v2.end(commit=False)
    completed(v2, "CompleteAbort")
    v1.open(topic, ["v1-b"])
    observed["v2_produce_again"] = v2.produce(topic, ["v2-b"])
    observed["v2_commit"] = v2.end(commit=True)
    completed(v2, "CompleteCommit")
    observed["v1_abort"] = error_name(v1.end(commit=False))
    settled(target, v1.transactional_id, "CompleteAbort")
    wait_until(
        lambda: (
            list_offsets(target, topic, LATEST, READ_COMMITTED).offset
            == list_offsets(target, topic, LATEST).offset
        ),
        "both transactions' markers",
    )
    observed["v1_epoch_kept"] = v1.epoch == v1.init.producer_epoch
    observed["v2"] = v2.described()
    observed["read_committed"] = batches(fetch(target, topic, isolation=READ_COMMITTED).records)
    return stems(observed)


def test_v1_and_v2_producers_side_by_side(targets: tuple[Target, Target]) -> None:
    same(scenario_v1_and_v2_producers_together, *targets)


def scenario_a_partition_leaders_add_partitions(target: Target) -> Any:
    """AddPartitionsToTxn v5, a partition leader's: a verification of a partition not in
    the transaction, its addition, the verification again, one at an old epoch."""
    topic = target.create_topic("tv2-leader")
    txn = Tv2Transaction(target)
    tid, pid, epoch = txn.transactional_id, txn.producer_id, txn.epoch
    observed = {
        "verify_before": add_partitions5(target, tid, pid, epoch, topic, verify_only=True),
        "add": add_partitions5(target, tid, pid, epoch, topic, verify_only=False),
        "verify_after": add_partitions5(target, tid, pid, epoch, topic, verify_only=True),
        "verify_old_epoch": add_partitions5(target, tid, pid, epoch - 1, topic, verify_only=True),
        "described": txn.described(),
        "end": txn.end(commit=False),
    }
    return stems(observed)


def test_add_partitions_v5_as_a_partition_leader_sends_it(
    targets: tuple[Target, Target],
) -> None:
    same(scenario_a_partition_leaders_add_partitions, *targets)
