"""Raw requests for the corner cases no client sends on purpose (a batch twice, a sequence
out of order, an epoch from the past): kio entities built here, sent with
``Target.raw``, one fresh connection each. Versions are ones both brokers serve."""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import Any

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from tests.conformance.harness import Target

READ_UNCOMMITTED, READ_COMMITTED = 0, 1
EARLIEST, LATEST = -2, -1


def batch(
    values: list[str],
    producer_id: int = -1,
    epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    keys: list[str | None] | None = None,
    timestamp: int | None = None,
) -> bytes:
    """One record batch (magic 2, uncompressed) of ``values``, stamped ``timestamp`` (ms)
    or now."""
    builder = DefaultRecordBatchBuilder(
        2, 0, int(transactional), producer_id, epoch, base_sequence, 1 << 20
    )
    now = int(time.time() * 1000) if timestamp is None else timestamp
    for i, value in enumerate(values):
        key = keys[i] if keys else None
        builder.append(i, now, key.encode() if key is not None else None, value.encode(), [])
    return bytes(builder.build())


def produce(
    target: Target,
    topic: str,
    records: bytes,
    partition: int = 0,
    transactional_id: str | None = None,
    acks: int = -1,
) -> Any:
    """Produce v9 of one batch; the partition's answer (error_code, base_offset, …)."""
    from kio.schema.produce.v9 import request as p

    body = p.ProduceRequest(
        transactional_id=transactional_id,
        acks=acks,
        timeout=datetime.timedelta(seconds=30),
        topic_data=(
            p.TopicProduceData(
                name=topic,
                partition_data=(p.PartitionProduceData(index=partition, records=records),),
            ),
        ),
    )
    return target.raw(0, 9, body).responses[0].partition_responses[0]


# Answers a client retries by itself, with the same request: a coordinator still loading
# its log (Kafka, just after it started) or finishing a transaction's markers.
RETRIABLE = frozenset({14, 15, 16, 51})  # COORDINATOR_LOAD_IN_PROGRESS, _NOT_AVAILABLE,
# NOT_COORDINATOR, CONCURRENT_TRANSACTIONS


def retried(call: Callable[[], Any], code: Callable[[Any], Any], timeout: float = 60) -> Any:
    """``call()``'s answer once its error code is not one a client retries."""
    deadline = time.monotonic() + timeout
    while True:
        answer = call()
        if int(code(answer).value) not in RETRIABLE or time.monotonic() >= deadline:
            return answer
        time.sleep(0.1)


def init_producer_id(
    target: Target,
    transactional_id: str | None = None,
    timeout_ms: int = 60_000,
    producer_id: int = -1,
    epoch: int = -1,
    retry: bool = True,
) -> Any:
    """InitProducerId v4 (KIP-360: an existing id and epoch may be given); retried while
    the answer is one a client retries, unless ``retry`` is False."""
    from kio.schema.init_producer_id.v4 import request as r

    body = r.InitProducerIdRequest(
        transactional_id=transactional_id,
        transaction_timeout=datetime.timedelta(milliseconds=timeout_ms),
        producer_id=producer_id,
        producer_epoch=epoch,
    )
    if not retry:
        return target.raw(22, 4, body)
    return retried(lambda: target.raw(22, 4, body), lambda a: a.error_code)


def find_coordinator(target: Target, key: str, key_type: int = 1) -> Any:
    """FindCoordinator v3 (key_type 0 a group, 1 a transactional id)."""
    from kio.schema.find_coordinator.v3 import request as r

    return target.raw(10, 3, r.FindCoordinatorRequest(key=key, key_type=key_type))


def add_partitions(
    target: Target, transactional_id: str, producer_id: int, epoch: int, topic: str,
    partitions: tuple[int, ...] = (0,),
) -> Any:  # fmt: skip
    """AddPartitionsToTxn v3; the error of each partition, in order."""
    from kio.schema.add_partitions_to_txn.v3 import request as r

    body = r.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=transactional_id,
        v3_and_below_producer_id=producer_id,
        v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=(r.AddPartitionsToTxnTopic(name=topic, partitions=partitions),),
    )
    answer = target.raw(24, 3, body)
    by_index = {
        p.partition_index: p.partition_error_code
        for t in answer.results_by_topic_v3_and_below
        for p in t.results_by_partition
    }
    return [by_index[p] for p in partitions]


def add_partitions_answer(
    target: Target, transactional_id: str, producer_id: int, epoch: int, topic: str,
    partitions: tuple[int, ...],
) -> dict[str, str]:  # fmt: skip
    """AddPartitionsToTxn v3's answer as {partition: error name}."""
    from tests.conformance.normalise import error_name

    codes = add_partitions(target, transactional_id, producer_id, epoch, topic, partitions)
    return {str(p): error_name(c) for p, c in zip(partitions, codes, strict=True)}


def add_offsets(
    target: Target, transactional_id: str, producer_id: int, epoch: int, group: str
) -> Any:
    """AddOffsetsToTxn v3; its error code."""
    from kio.schema.add_offsets_to_txn.v3 import request as r

    body = r.AddOffsetsToTxnRequest(
        transactional_id=transactional_id, producer_id=producer_id, producer_epoch=epoch,
        group_id=group,
    )  # fmt: skip
    return target.raw(25, 3, body).error_code


def end_txn(
    target: Target, transactional_id: str, producer_id: int, epoch: int, commit: bool
) -> Any:
    """EndTxn v3; its error code."""
    from kio.schema.end_txn.v3 import request as r

    body = r.EndTxnRequest(
        transactional_id=transactional_id, producer_id=producer_id, producer_epoch=epoch,
        committed=commit,
    )  # fmt: skip
    return target.raw(26, 3, body).error_code


def txn_offset_commit(
    target: Target, transactional_id: str, producer_id: int, epoch: int, group: str,
    topic: str, offset: int, generation: int = -1, member_id: str = "",
    group_instance_id: str | None = None, partition: int = 0,
) -> Any:  # fmt: skip
    """TxnOffsetCommit v3 of one partition's offset; that partition's error code."""
    from kio.schema.txn_offset_commit.v3 import request as r

    body = r.TxnOffsetCommitRequest(
        transactional_id=transactional_id, group_id=group, producer_id=producer_id,
        producer_epoch=epoch, generation_id=generation, member_id=member_id,
        group_instance_id=group_instance_id,
        topics=(r.TxnOffsetCommitRequestTopic(name=topic, partitions=(
            r.TxnOffsetCommitRequestPartition(partition_index=partition, committed_offset=offset,
                                              committed_metadata=""),)),),
    )  # fmt: skip
    return target.raw(28, 3, body).topics[0].partitions[0].error_code


def offset_fetch(
    target: Target, group: str, topic: str, require_stable: bool, partition: int = 0
) -> Any:
    """OffsetFetch v7; (error code of the request, error of the partition, offset)."""
    from kio.schema.offset_fetch.v7 import request as r

    body = r.OffsetFetchRequest(
        group_id=group, require_stable=require_stable,
        topics=(r.OffsetFetchRequestTopic(name=topic, partition_indexes=(partition,)),),
    )  # fmt: skip
    answer = target.raw(9, 7, body)
    part = answer.topics[0].partitions[0]
    return answer.error_code, part.error_code, part.committed_offset


def fetch(
    target: Target, topic: str, offset: int = 0, isolation: int = READ_UNCOMMITTED,
    partition: int = 0, max_bytes: int = 1 << 20,
) -> Any:  # fmt: skip
    """Fetch v12 of one partition, answered at once; the partition's data."""
    from kio.schema.fetch.v12 import request as r

    body = r.FetchRequest(
        max_wait=datetime.timedelta(milliseconds=0), min_bytes=0, max_bytes=max_bytes,
        isolation_level=isolation, session_id=0, session_epoch=-1,
        topics=(r.FetchTopic(topic=topic, partitions=(r.FetchPartition(
            partition=partition, fetch_offset=offset, partition_max_bytes=max_bytes),)),),
        forgotten_topics_data=(),
    )  # fmt: skip
    return target.raw(1, 12, body).responses[0].partitions[0]


def list_offsets(
    target: Target, topic: str, timestamp: int, isolation: int = READ_UNCOMMITTED,
    partition: int = 0,
) -> Any:  # fmt: skip
    """ListOffsets v7 of one partition; its answer (error_code, offset, …)."""
    from kio.schema.list_offsets.v7 import request as r

    body = r.ListOffsetsRequest(
        replica_id=-1, isolation_level=isolation,
        topics=(r.ListOffsetsTopic(name=topic, partitions=(
            r.ListOffsetsPartition(partition_index=partition, timestamp=timestamp),)),),
    )  # fmt: skip
    return target.raw(2, 7, body).topics[0].partitions[0]


def describe_transactions(target: Target, *transactional_ids: str) -> list[dict[str, Any]]:
    """DescribeTransactions v0, each id's state as a dict. Decoded here: kio refuses the
    -1 start time of a transaction not under way."""
    from kio.schema.describe_transactions.v0 import request as r

    from tests.helpers.wire_client import request_frame

    frame = request_frame(65, 0, r.DescribeTransactionsRequest(transactional_ids=transactional_ids))
    answer = target.raw_bytes(frame)
    assert answer is not None, "DescribeTransactions: the connection closed"
    read = _Flexible(answer)
    read.int(4)  # correlation id
    read.tags()  # response header v1
    read.int(4)  # throttle time
    states = []
    for _ in range(read.varint() - 1):
        state = {
            "error_code": read.int(2),
            "transactional_id": read.string(),
            "transaction_state": read.string(),
            "transaction_timeout_ms": read.int(4),
            "transaction_start_time_ms": read.int(8),
            "producer_id": read.int(8),
            "producer_epoch": read.int(2),
        }
        topics = []
        for _ in range(read.varint() - 1):
            topic = read.string()
            partitions = [read.int(4) for _ in range(read.varint() - 1)]
            read.tags()
            topics.append((topic, partitions))
        read.tags()
        state["topics"] = topics
        states.append(state)
    return states


class _Flexible:
    """Reads a flexible (compact) Kafka message's primitives in order."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def int(self, size: int) -> int:
        value = int.from_bytes(self.data[self.at : self.at + size], "big", signed=True)
        self.at += size
        return value

    def varint(self) -> int:
        shift = value = 0
        while True:
            byte = self.data[self.at]
            self.at += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    def string(self) -> str | None:
        size = self.varint() - 1
        if size < 0:
            return None
        text = self.data[self.at : self.at + size].decode()
        self.at += size
        return text

    def tags(self) -> None:
        for _ in range(self.varint()):
            self.varint()
            self.at += self.varint()


def describe_producers(target: Target, topic: str, partition: int = 0) -> Any:
    from kio.schema.describe_producers.v0 import request as r

    body = r.DescribeProducersRequest(
        topics=(r.TopicRequest(name=topic, partition_indexes=(partition,)),)
    )
    return target.raw(61, 0, body).topics[0].partitions[0]


class RawTransaction:
    """A transactional producer spoken in raw requests: its id, producer id and epoch,
    and the next sequence of each partition it wrote to."""

    def __init__(self, target: Target, stem: str = "raw-txn", timeout_ms: int = 60_000) -> None:
        self.target = target
        self.transactional_id = target.name_for(stem)
        find_coordinator_ready(target, self.transactional_id)
        self.init = init_producer_id(target, self.transactional_id, timeout_ms)
        self.producer_id = self.init.producer_id
        self.epoch = self.init.producer_epoch
        self.sequences: dict[tuple[str, int], int] = {}

    def add(self, topic: str, partition: int = 0) -> Any:
        """AddPartitionsToTxn of one partition; its error code (retried while the
        coordinator is still completing the last transaction)."""
        return retried(
            lambda: add_partitions(self.target, self.transactional_id, self.producer_id,
                                   self.epoch, topic, (partition,))[0],
            lambda code: code,
        )  # fmt: skip

    def produce(
        self, topic: str, values: list[str], partition: int = 0, epoch: int | None = None,
        timestamp: int | None = None,
    ) -> Any:  # fmt: skip
        """A transactional batch of ``values`` with the next sequence; the answer."""
        sequence = self.sequences.get((topic, partition), 0)
        answer = produce(
            self.target, topic,
            batch(values, self.producer_id, self.epoch if epoch is None else epoch, sequence,
                  transactional=True, timestamp=timestamp),
            partition, transactional_id=self.transactional_id,
        )  # fmt: skip
        if answer.error_code.value == 0:
            self.sequences[(topic, partition)] = sequence + len(values)
        return answer

    def end(self, commit: bool, epoch: int | None = None) -> Any:
        """EndTxn; its error code."""
        return end_txn(self.target, self.transactional_id, self.producer_id,
                       self.epoch if epoch is None else epoch, commit)  # fmt: skip

    def open(self, topic: str, values: list[str], partition: int = 0) -> None:
        """Begin a transaction holding ``values`` on the partition."""
        assert self.add(topic, partition).value == 0
        assert self.produce(topic, values, partition).error_code.value == 0


def find_coordinator_ready(target: Target, transactional_id: str) -> None:
    """FindCoordinator of a transactional id until it answers (as a client asks first)."""
    found = retried(lambda: find_coordinator(target, transactional_id, 1), lambda a: a.error_code)
    assert found.error_code.value == 0, found


def subscription(topics: list[str]) -> bytes:
    """A consumer protocol subscription (version 0): the topics, no user data."""
    import struct

    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


def join_group(
    target: Target, group: str, topic: str, group_instance_id: str | None = None
) -> tuple[str, int]:
    """A classic consumer group of one member, joined (v5, asking for a member id first
    as Kafka wants) and synced; (member id, generation)."""
    from kio.schema.join_group.v5 import request as j
    from kio.schema.sync_group.v3 import request as s

    find = retried(lambda: find_coordinator(target, group, 0), lambda a: a.error_code)
    assert find.error_code.value == 0, find

    def join(member_id: str) -> Any:
        return target.raw(11, 5, j.JoinGroupRequest(
            group_id=group, session_timeout=datetime.timedelta(seconds=30),
            rebalance_timeout=datetime.timedelta(seconds=30), member_id=member_id,
            group_instance_id=group_instance_id, protocol_type="consumer",
            protocols=(j.JoinGroupRequestProtocol(name="range", metadata=subscription([topic])),),
        ))  # fmt: skip

    joined = join("")
    if joined.error_code.value == 79:  # MEMBER_ID_REQUIRED
        joined = join(joined.member_id)
    assert joined.error_code.value == 0, joined
    synced = target.raw(14, 3, s.SyncGroupRequest(
        group_id=group, generation_id=joined.generation_id, member_id=joined.member_id,
        group_instance_id=group_instance_id,
        assignments=(s.SyncGroupRequestAssignment(member_id=joined.member_id, assignment=b""),),
    ))  # fmt: skip
    assert synced.error_code.value == 0, synced
    return joined.member_id, joined.generation_id
