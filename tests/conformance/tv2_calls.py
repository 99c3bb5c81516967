"""Raw requests of KIP-890's transaction version 2, as Kafka 4's Java producer sends them
with ``transaction.version`` 2 finalized: InitProducerId v5, Produce v12 (its partitions
added by the produce itself), EndTxn v5 (the epoch bumped at every end, the answer
carrying the next identity), TxnOffsetCommit v5 (the group's offsets added by the commit),
and AddPartitionsToTxn v5 (a partition leader's). kio entities sent with ``Target.raw``,
one fresh connection each; the conformance scenarios and the wire tests share them."""

from __future__ import annotations

import datetime
from typing import Any

from tests.conformance.harness import Target
from tests.conformance.normalise import error_name
from tests.conformance.requests import batch, describe_transactions, find_coordinator_ready, retried


def init5(target: Target, transactional_id: str, timeout_ms: int = 60_000) -> Any:
    """InitProducerId v5, retried while the coordinator is loading or completing."""
    from kio.schema.init_producer_id.v5 import request as r

    find_coordinator_ready(target, transactional_id)
    body = r.InitProducerIdRequest(
        transactional_id=transactional_id,
        transaction_timeout=datetime.timedelta(milliseconds=timeout_ms),
    )
    return retried(lambda: target.raw(22, 5, body), lambda a: a.error_code)


def produce_at(
    target: Target, version: int, topic: str, records: bytes, transactional_id: str | None,
    partition: int = 0,
) -> Any:  # fmt: skip
    """Produce of ``version`` (3-12) of one batch; the partition's answer."""
    import importlib

    p = importlib.import_module(f"kio.schema.produce.v{version}.request")
    body = p.ProduceRequest(
        transactional_id=transactional_id, acks=-1, timeout=datetime.timedelta(seconds=30),
        topic_data=(p.TopicProduceData(name=topic, partition_data=(
            p.PartitionProduceData(index=partition, records=records),)),),
    )  # fmt: skip
    return target.raw(0, version, body).responses[0].partition_responses[0]


def end5(target: Target, transactional_id: str, producer_id: int, epoch: int, commit: bool) -> Any:
    """EndTxn v5; the whole answer (error, producer id, epoch)."""
    from kio.schema.end_txn.v5 import request as r

    body = r.EndTxnRequest(
        transactional_id=transactional_id, producer_id=producer_id, producer_epoch=epoch,
        committed=commit,
    )  # fmt: skip
    return target.raw(26, 5, body)


def txn_offset_commit5(
    target: Target, transactional_id: str, producer_id: int, epoch: int, group: str,
    topic: str, offset: int,
) -> str:  # fmt: skip
    """TxnOffsetCommit v5 of partition 0's offset, with no group metadata; its error."""
    from kio.schema.txn_offset_commit.v5 import request as r

    body = r.TxnOffsetCommitRequest(
        transactional_id=transactional_id, group_id=group, producer_id=producer_id,
        producer_epoch=epoch, generation_id=-1, member_id="", group_instance_id=None,
        topics=(r.TxnOffsetCommitRequestTopic(name=topic, partitions=(
            r.TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=offset,
                                              committed_metadata=""),)),),
    )  # fmt: skip
    return error_name(target.raw(28, 5, body).topics[0].partitions[0].error_code)


def add_partitions5(
    target: Target, transactional_id: str, producer_id: int, epoch: int, topic: str,
    verify_only: bool,
) -> Any:  # fmt: skip
    """AddPartitionsToTxn v5 (a partition leader's) of partition 0; the top error and the
    partition's error."""
    from kio.schema.add_partitions_to_txn.v5 import request as r

    body = r.AddPartitionsToTxnRequest(transactions=(r.AddPartitionsToTxnTransaction(
        transactional_id=transactional_id, producer_id=producer_id, producer_epoch=epoch,
        verify_only=verify_only, topics=(r.AddPartitionsToTxnTopic(name=topic, partitions=(0,)),),
    ),))  # fmt: skip
    answer = target.raw(24, 5, body)
    codes = [
        error_name(p.partition_error_code)
        for t in answer.results_by_transaction
        for topic in t.topic_results
        for p in topic.results_by_partition
    ]
    return [error_name(answer.error_code), codes]


class Tv2Transaction:
    """A transactional producer on transaction version 2, in raw requests: its id, its
    identity as the last answer gave it, and its next sequence per partition (reset when
    the epoch moves, as Kafka's producer resets them)."""

    def __init__(self, target: Target, stem: str = "tv2", timeout_ms: int = 60_000) -> None:
        self.target = target
        self.transactional_id = target.name_for(stem)
        init = init5(target, self.transactional_id, timeout_ms)
        assert init.error_code.value == 0, init
        self.first_producer_id = init.producer_id
        self.producer_id, self.epoch = init.producer_id, init.producer_epoch
        self.sequences: dict[tuple[str, int], int] = {}

    def produce(
        self, topic: str, values: list[str], version: int = 12, epoch: int | None = None
    ) -> str:
        """A transactional batch of ``values`` on partition 0; its error name."""
        sequence = self.sequences.get((topic, 0), 0)
        records = batch(
            values, self.producer_id, self.epoch if epoch is None else epoch, sequence,
            transactional=True,
        )  # fmt: skip
        answer = produce_at(self.target, version, topic, records, self.transactional_id)
        if answer.error_code.value == 0:
            self.sequences[(topic, 0)] = sequence + len(values)
        return error_name(answer.error_code)

    def end(self, commit: bool, epoch: int | None = None) -> dict[str, Any]:
        """EndTxn v5, retried while the coordinator completes the last one; the error and,
        when it succeeded, the epoch it moved to (relative to the one sent) and whether
        the producer id stayed. The identity answered is taken for the next transaction."""
        sent = self.epoch if epoch is None else epoch
        answer = retried(
            lambda: end5(self.target, self.transactional_id, self.producer_id, sent, commit),
            lambda a: a.error_code,
        )
        if answer.error_code.value != 0:
            return {"error": error_name(answer.error_code)}
        same_id = answer.producer_id == self.producer_id
        moved = answer.producer_epoch - sent
        if (answer.producer_id, answer.producer_epoch) != (self.producer_id, self.epoch):
            self.sequences.clear()
        self.producer_id, self.epoch = answer.producer_id, answer.producer_epoch
        return {"error": "NONE", "same_producer_id": same_id, "epoch_moved_by": moved}

    def described(self) -> dict[str, Any]:
        """DescribeTransactions of the id: its state, epoch relative to the first, and its
        partitions (names by stem)."""
        d = describe_transactions(self.target, self.transactional_id)[0]
        return {
            "state": d["transaction_state"],
            "epoch": d["producer_epoch"],
            "same_producer_id": d["producer_id"] == self.first_producer_id,
            "topics": [[t, p] for t, p in d["topics"]],
        }
