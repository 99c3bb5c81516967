"""A consume-transform-produce copier written as any librdkafka user writes one, run as
its own process so a test can SIGKILL it:
``python -m tests.children.wire_copier BOOTSTRAP SRC DST RECORDS``.

A static member of group "copier" (a restarted copier takes its predecessor's place at
once), reading read_committed, writing each record upper-cased to the same partition of
DST with its source offsets in the same transaction. It exits once it has copied RECORDS
records of SRC (the group's committed offsets add up to it) and is at the end of every
partition; short of that it waits for more, as the test may still be adding to SRC. Its
session (30 s, Kafka's default is 45 s) outlasts a group coordinator's death, which a
client sees for up to the node's session timeout before the cluster moves the group.

librdkafka's send_offsets_to_transaction can wait past its timeout, for ever, for a group
coordinator that left Metadata (its issues 5456 and 5511). The copier stands in for what
an operator does with a hung process: past twice the call's own timeout it exits with
``HUNG`` (3), for the test to start another, which fences it and goes on.
"""

from __future__ import annotations

import os
import sys
import threading

import confluent_kafka as ck

BATCH = 200
HUNG = 3


def main(bootstrap: str, src: str, dst: str, records_to_copy: int) -> None:
    consumer = ck.Consumer({
        "bootstrap.servers": bootstrap, "group.id": "copier", "group.instance.id": "copier-0",
        "isolation.level": "read_committed", "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "session.timeout.ms": 30000,
        "heartbeat.interval.ms": 500, "enable.partition.eof": True,
    })  # fmt: skip
    producer = ck.Producer({"bootstrap.servers": bootstrap, "transactional.id": "copier",
                            "linger.ms": 5})  # fmt: skip
    producer.init_transactions(60)
    consumer.subscribe([src])
    at_end: set[int] = set()
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
            hung = threading.Timer(120, os._exit, (HUNG,))
            hung.start()
            producer.send_offsets_to_transaction(
                [ck.TopicPartition(src, p, o) for p, o in sorted(next_offsets.items())],
                consumer.consumer_group_metadata(),
                60,
            )
            hung.cancel()
            producer.commit_transaction(60)
        elif consumer.assignment() and at_end >= {tp.partition for tp in consumer.assignment()}:
            committed = consumer.committed(consumer.assignment(), 60)
            if sum(max(tp.offset, 0) for tp in committed) >= records_to_copy:
                break
    consumer.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
