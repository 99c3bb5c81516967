"""How fast the cleaner works, and what it costs producers while it does.

Cleaning throughput is records examined per second by one pass (compaction reads every
record below the LSO; retention every record it deletes). The producer figure is a ratio
in one run: the same idempotent appends to the partition being compacted, with a cleaner
process cleaning it over and over, against the appends alone.
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

from app.broker import Broker
from app.cleaner.cleaner import clean_partition, partitions_to_clean
from app.coordinator.handlers import add_partitions_to_txn, end_txn
from app.coordinator.producer_id import init_producer_id
from app.log.append import produce
from app.log.topics import create_topic
from app.protocol import (
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    ProduceRequest,
    RecordIn,
)

BATCH = 1_000
KEYS = 10_000
COMPACT = {"cleanup.policy": "compact", "delete.retention.ms": 0}


def _records(start: int, n: int, timestamp: int = 0) -> list[RecordIn]:
    return [
        RecordIn(f"{(start + i) % KEYS:016d}".encode(), b"v" * 100, timestamp) for i in range(n)
    ]


def _idempotent(broker: Broker, topic: str, n: int, timestamp: int = 0) -> float:
    """Append ``n`` keyed records in batches of 1000; returns the seconds it took."""
    ident = init_producer_id(broker, InitProducerIdRequest(None, 60_000))
    started = time.perf_counter()
    for seq in range(0, n, BATCH):
        req = ProduceRequest(
            topic,
            0,
            _records(seq, min(BATCH, n - seq), timestamp),
            ident.producer_id,
            ident.producer_epoch,
            seq,
        )
        assert produce(broker, req).error_code == 0
    return time.perf_counter() - started


def _with_aborts(broker: Broker, topic: str, n: int, abort_every: int = 10) -> None:
    """``n`` keyed records in transactions of 1000, one in ``abort_every`` aborted."""
    tid = f"{topic}-bench"
    ident = init_producer_id(broker, InitProducerIdRequest(tid, 60_000))
    pid, epoch = ident.producer_id, ident.producer_epoch
    for i, start in enumerate(range(0, n, BATCH)):
        add = AddPartitionsToTxnRequest(tid, pid, epoch, [(topic, 0)])
        assert add_partitions_to_txn(broker, add).error_code == 0
        req = ProduceRequest(
            topic, 0, _records(start, min(BATCH, n - start)), pid, epoch, 0, tid, True
        )
        assert produce(broker, req).error_code == 0
        end = end_txn(broker, EndTxnRequest(tid, pid, epoch, i % abort_every != abort_every - 1))
        assert end.error_code == 0
        pid, epoch = end.producer_id, end.producer_epoch


def _clean_once(broker: Broker, topic: str) -> tuple[float, Any]:
    [target] = partitions_to_clean(broker, topic)
    started = time.perf_counter()
    stats = clean_partition(broker, topic, 0, target.config)
    return time.perf_counter() - started, stats


def _clean_until(url: str, topic: str, stop: Any, passes: Any) -> None:
    broker = Broker.connect(url)
    [target] = partitions_to_clean(broker, topic)
    while not stop.is_set():
        clean_partition(broker, topic, 0, target.config)
        passes.value += 1


def bench_cleaner(url: str, n_records: int) -> dict[str, Any]:
    broker = Broker.connect(url)
    out: dict[str, Any] = {"records": n_records, "distinct_keys": KEYS}

    create_topic(broker, "compacted", 1, COMPACT)
    _with_aborts(broker, "compacted", n_records)
    seconds, stats = _clean_once(broker, "compacted")
    out["compaction_examined_per_s"] = stats.examined / seconds
    out["compaction_removed"] = stats.records_removed

    create_topic(broker, "retained", 1, {"retention.ms": 1})
    _idempotent(broker, "retained", n_records, timestamp=1_000)
    seconds, stats = _clean_once(broker, "retained")
    out["retention_deleted_per_s"] = stats.records_removed / seconds

    create_topic(broker, "alone", 1, COMPACT)
    alone = _idempotent(broker, "alone", n_records)
    create_topic(broker, "busy", 1, COMPACT)
    _idempotent(broker, "busy", n_records)  # work for the cleaner from the start
    ctx = multiprocessing.get_context("spawn")
    stop, passes = ctx.Event(), ctx.Value("i", 0)
    cleaner = ctx.Process(target=_clean_until, args=(url, "busy", stop, passes))
    cleaner.start()
    try:
        while passes.value == 0 and cleaner.is_alive():  # let it get going
            time.sleep(0.05)
        busy = _idempotent(broker, "busy", n_records)
    finally:
        stop.set()
        cleaner.join(timeout=600)
    out["producer_with_cleaner_ratio"] = alone / busy
    out["cleaner_passes_during_produce"] = passes.value
    return out
