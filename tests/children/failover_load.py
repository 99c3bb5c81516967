"""Writers that run through a failover, each its own process, each printing what it was
told was written, so a test can check that all of it survived:

- ``python -m tests.children.failover_load feed TOPIC``: the native idempotent Producer (acks=all)
  on ``KIP98_DATABASE_URL``, writing ``f-<n>`` round the partitions; prints ``acked <n>``
  for each record whose delivery report said it was written.
- ``python -m tests.children.failover_load wire BOOTSTRAP TOPIC``: a librdkafka transactional
  producer through ``kip98 serve``, transactions of ``BATCH`` records ``w-<n>``; prints
  ``committed <first> <last>`` once ``commit_transaction()`` returned, ``aborted <first>
  <last>`` after an abort.

Both run until SIGTERM, then finish what they were doing and exit 0.
"""

from __future__ import annotations

import signal
import sys
import time

import confluent_kafka as ck

from app.client import KafkaException, Producer

BATCH = 20
PARTITIONS = 4


class Stop:
    requested = False

    def __init__(self) -> None:
        signal.signal(signal.SIGTERM, self._stop)

    def _stop(self, *_: object) -> None:
        self.requested = True


def feed(topic: str) -> None:
    stop = Stop()
    producer = Producer({"linger.ms": 5, "message.timeout.ms": 120_000})

    def report(err: object, msg: object) -> None:
        if err is None:
            print(f"acked {msg.value().decode()[2:]}", flush=True)  # type: ignore[attr-defined]

    n = 0
    while not stop.requested:
        producer.produce(topic, f"f-{n}".encode(), partition=n % PARTITIONS, on_delivery=report)
        n += 1
        producer.poll(0.002)
    producer.flush(180)
    producer.close()


def wire(bootstrap: str, topic: str) -> None:
    stop = Stop()
    producer = ck.Producer({
        "bootstrap.servers": bootstrap, "transactional.id": "wire-producer",
        "linger.ms": 5, "transaction.timeout.ms": 60_000,
    })  # fmt: skip
    producer.init_transactions(120)
    n = 0
    while not stop.requested:
        first = n
        producer.begin_transaction()
        for _ in range(BATCH):
            producer.produce(topic, f"w-{n}".encode(), partition=n % PARTITIONS)
            n += 1
        try:
            _commit(producer)
        except ck.KafkaException as exc:
            if not exc.args[0].txn_requires_abort():
                raise
            producer.abort_transaction(120)
            print(f"aborted {first} {n - 1}", flush=True)
            continue
        print(f"committed {first} {n - 1}", flush=True)
        time.sleep(0.01)


def _commit(producer: ck.Producer) -> None:
    """commit_transaction(), again while it fails retriably (librdkafka's advice: a
    retriable commit error leaves the commit to be called again)."""
    while True:
        try:
            producer.commit_transaction(60)
            return
        except ck.KafkaException as exc:
            if not exc.args[0].retriable():
                raise


def main(argv: list[str]) -> int:
    try:
        if argv[0] == "feed":
            feed(argv[1])
        else:
            wire(argv[1], argv[2])
    except KafkaException as exc:
        print(f"failed: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
