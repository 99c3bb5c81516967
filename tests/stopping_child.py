"""A busy producer process that stops itself (``KIP98_STOP_AT``) at a point where it holds
a lock, for the tests of sessions stalled by their client (docs/design.md rule 34).

argv: database URL, the workload, the number of rounds. Workloads, on topic ``t``:
``idempotent`` (five records to partition 0, flushed, per round), ``spread`` (one record
to each of partitions 0-3 per round), ``transactional`` (a transaction of five records to
partition 0 per round, id ``stopper``), ``offsets`` (the same with the consumer offsets
of group ``g`` sent in each transaction). Prints ``acked <value>`` for every record the
producer was told is written, and ``done`` at the end; a failure prints
``failed <error name>`` and the process goes on with the next round, as an application
retrying would.
"""

from __future__ import annotations

import sys

from app.client import KafkaException, Producer, TopicPartition
from app.client.consumer import Consumer


def _acked(err: object, msg: object) -> None:
    if err is None:
        print(f"acked {msg.value().decode()}", flush=True)  # type: ignore[attr-defined]


def _commit(producer: Producer) -> None:
    """Commit, calling again while the outcome is unknown (a retriable failure), as an
    application must (docs/design.md rule 16)."""
    while True:
        try:
            producer.commit_transaction(120)
            return
        except KafkaException as exc:
            if not exc.args[0].retriable():
                raise
            print(f"retrying {exc.args[0].name()}", flush=True)


def main() -> None:
    url, workload, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    config: dict[str, object] = {"database.url": url, "client.id": "stopper", "linger.ms": 0}
    transactional = workload in ("transactional", "offsets")
    if transactional:
        config["transactional.id"] = "stopper"
    producer = Producer(config)
    group = None
    if workload == "offsets":
        consumer = Consumer({"database.url": url, "group.id": "g"})
        group = consumer.consumer_group_metadata()
    if transactional:
        producer.init_transactions(120)
    for n in range(rounds):
        values = [f"s{n}-{p}" for p in range(4)] if workload == "spread" else []
        values = values or [f"s{n}-{i}" for i in range(5)]
        try:
            if transactional:
                producer.begin_transaction()
            for i, value in enumerate(values):
                partition = i if workload == "spread" else 0
                report = None if transactional else _acked
                producer.produce("t", value.encode(), partition=partition, on_delivery=report)
            if group is not None:
                producer.send_offsets_to_transaction([TopicPartition("in", 0, n + 1)], group, 120)
            if transactional:
                _commit(producer)
                for value in values:
                    print(f"acked {value}", flush=True)
            else:
                assert producer.flush(120) == 0
        except KafkaException as exc:
            print(f"failed {exc.args[0].name()}", flush=True)
            if transactional and exc.args[0].txn_requires_abort():
                producer.abort_transaction(120)
    producer.flush(120)
    print("done", flush=True)
    producer.close()


if __name__ == "__main__":
    main()
