"""A busy producer process that stops itself (``KIP98_STOP_AT``) at a point where it holds
a lock, for the tests of sessions stalled by their client (docs/design.md rule 34).

argv: database URL, the workload, the number of rounds. Workloads, on topic ``t``:
``idempotent`` (five records to partition 0, flushed, per round), ``spread`` (one record
to each of partitions 0-3 per round), ``transactional`` (a transaction of five records to
partition 0 per round, id ``stopper``, its records sent with the commit: one request),
``bare`` (the same, the records sent first and the commit a bare EndTxn), ``flushed``
(the same, each record flushed on its own: the transaction's requests after its first go
on the id's remembered row), ``early`` (the same, the first record flushed on its own: a
transaction's first request registering its partition, on the rows the last commit
left, the rest sent with the commit), ``offsets``
(as ``transactional``, with the consumer offsets of group ``g`` sent in each
transaction), ``fencer`` (only ``init_transactions`` of the id ``victim``, whose
transaction another process left open). Prints ``acked <value>`` for every record the
producer was told is written, and ``done`` at the end; a failure prints
``failed <error name>`` and the process goes on with the next round, as an application
retrying would. Rounds 0: round after round until SIGUSR1. An optional fourth argument
names the producer (its client id, transactional id and values' prefix; ``stopper``), a
fifth how many records go to each of its partitions a round (5; ``spread``: 1).
"""

from __future__ import annotations

import signal
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
    name = sys.argv[4] if len(sys.argv) > 4 else "stopper"
    per_partition = int(sys.argv[5]) if len(sys.argv) > 5 else (1 if workload == "spread" else 5)
    config: dict[str, object] = {"database.url": url, "client.id": name, "linger.ms": 0}
    if workload == "fencer":
        config["transactional.id"] = "victim"
        fencer = Producer(config)
        fencer.init_transactions(120)
        fencer.close()
        print("done", flush=True)
        return
    transactional = workload in ("transactional", "bare", "flushed", "early", "offsets")
    if transactional:
        config["transactional.id"] = name
    if workload in ("transactional", "early", "offsets"):
        config["linger.ms"] = 30_000  # the records wait for the commit, which takes them
    producer = Producer(config)
    group = None
    if workload == "offsets":
        consumer = Consumer({"database.url": url, "group.id": "g"})
        group = consumer.consumer_group_metadata()
    if transactional:
        producer.init_transactions(120)
    stop = []
    signal.signal(signal.SIGUSR1, lambda *_: stop.append(True))
    n = -1
    while not stop and (rounds == 0 or n + 1 < rounds):
        n += 1
        prefix = "" if name == "stopper" else f"{name}:"
        partitions = range(4) if workload == "spread" else range(1)
        values = [f"{prefix}s{n}-{i}" for i in range(per_partition * len(partitions))]
        try:
            if transactional:
                producer.begin_transaction()
            for i, value in enumerate(values):
                partition = i % len(partitions)
                report = None if transactional else _acked
                producer.produce("t", value.encode(), partition=partition, on_delivery=report)
                if workload == "flushed" or (workload == "early" and i == 0):
                    assert producer.flush(120) == 0
            if group is not None:
                producer.send_offsets_to_transaction([TopicPartition("in", 0, n + 1)], group, 120)
            if workload == "bare":
                assert producer.flush(120) == 0
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
