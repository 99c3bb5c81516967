"""A consume-transform-produce copier written as any librdkafka user writes one, run as
its own process so a test can SIGKILL it:
``python -m tests.wire_copier BOOTSTRAP SRC DST [TOTAL]``.

A static member of group "copier" (a restarted copier takes its predecessor's place at
once), reading read_committed, writing each record upper-cased to the same partition of
DST with its source offsets in the same transaction. It prints "committed" after its
first commit and exits once it has copied up to the end of SRC, or, given TOTAL, once
the offsets it has committed reach TOTAL records (while SRC is still being written).
"""

from __future__ import annotations

import sys

import confluent_kafka as ck

BATCH = 200


def main(bootstrap: str, src: str, dst: str, total: int | None = None) -> None:
    consumer = ck.Consumer({
        "bootstrap.servers": bootstrap, "group.id": "copier", "group.instance.id": "copier-0",
        "isolation.level": "read_committed", "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500, "enable.partition.eof": True,
    })  # fmt: skip
    producer = ck.Producer({"bootstrap.servers": bootstrap, "transactional.id": "copier",
                            "linger.ms": 5})  # fmt: skip
    producer.init_transactions(60)
    consumer.subscribe([src])
    at_end: set[int] = set()
    announced = False
    while True:
        msgs = consumer.consume(BATCH, 1.0)
        records = []
        for m in msgs:
            if m.error() is None:
                records.append(m)
                at_end.discard(m.partition())
            elif m.error().code() == ck.KafkaError._PARTITION_EOF:
                at_end.add(m.partition())
            else:
                raise ck.KafkaException(m.error())
        if records:
            producer.begin_transaction()
            for m in records:
                producer.produce(dst, m.value().upper(), key=m.key(), partition=m.partition())
            next_offsets: dict[int, int] = {}
            for m in records:
                next_offsets[m.partition()] = m.offset() + 1
            producer.send_offsets_to_transaction(
                [ck.TopicPartition(src, p, o) for p, o in sorted(next_offsets.items())],
                consumer.consumer_group_metadata(),
                60,
            )
            producer.commit_transaction(60)
            if not announced:
                print("committed", flush=True)
                announced = True
            if total is not None and _committed(consumer, src) >= total:
                break
        elif (
            total is None
            and consumer.assignment()
            and at_end >= {tp.partition for tp in consumer.assignment()}
        ):
            break
    consumer.close()


def _committed(consumer: ck.Consumer, src: str) -> int:
    """The records of SRC the group's committed offsets cover (every partition's)."""
    partitions = consumer.list_topics(src, timeout=30).topics[src].partitions
    committed = consumer.committed([ck.TopicPartition(src, p) for p in partitions], timeout=30)
    return sum(max(tp.offset, 0) for tp in committed)


if __name__ == "__main__":
    main(*sys.argv[1:4], *(int(a) for a in sys.argv[4:5]))
