"""A producer process for the one-query write's crash tests (docs/design.md §3.9).
argv: database URL, then the mode:

- ``producer``: an idempotent Producer writes "a", then "b"; its second batch goes on the
  partition row it remembers, in one query string, where the test kills it
  (``KIP98_CRASH_AT=append.in_one_query``).
- ``partitions``: through the Produce handler, one request with a batch for each of
  topic "two"'s partitions, "a0" and "a1" (the lock's way), then "b0" and "b1", on the
  rows it remembers, in one query string, where the process kills itself
  (``append.in_one_query``, set once the first request is in).
- ``twice``: "a" through the Produce handler, then one request with two plain batches for
  the same partition, "b" and "c", appended under the lock in one COPY; the process kills
  itself after that COPY, before the advance (``append.after_copy``, set once "a" is in).
"""

from __future__ import annotations

import os
import sys

from app.broker import Broker
from app.client import Producer
from app.faults import ENV
from app.protocol import InitProducerIdRequest, ProduceBatchesRequest, ProduceRequest, RecordIn


def producer(url: str) -> None:
    with Producer({"database.url": url, "linger.ms": 0}) as p:
        for value in ("a", "b"):
            p.produce("t", value=value.encode(), partition=0)
            assert p.flush(60) == 0


def partitions(url: str) -> None:
    broker = Broker.connect(url)
    ident = broker.handle(InitProducerIdRequest(None, 60_000))

    def batch(partition: int, seq: int, tag: str) -> ProduceRequest:
        record = RecordIn(None, f"{tag}{partition}".encode(), 0)
        pid, epoch = ident.producer_id, ident.producer_epoch
        return ProduceRequest("two", partition, [record], pid, epoch, seq)

    def request(seq: int, tag: str) -> ProduceBatchesRequest:
        return ProduceBatchesRequest([batch(p, seq, tag) for p in (0, 1)])

    assert all(r.error_code == 0 for r in broker.handle(request(0, "a")).batches)
    os.environ[ENV] = "append.in_one_query"
    broker.handle(request(1, "b"))


def twice(url: str) -> None:
    broker = Broker.connect(url)

    def batch(value: bytes) -> ProduceRequest:
        return ProduceRequest("t", 0, [RecordIn(None, value, 0)])

    assert broker.handle(ProduceBatchesRequest([batch(b"a")])).batches[0].error_code == 0
    os.environ[ENV] = "append.after_copy"
    broker.handle(ProduceBatchesRequest([batch(b"b"), batch(b"c")]))


if __name__ == "__main__":
    {"producer": producer, "partitions": partitions, "twice": twice}[sys.argv[2]](sys.argv[1])
