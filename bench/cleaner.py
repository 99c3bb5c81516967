"""The cleaner: how fast it works, and what it costs producers while it does.

Cleaning throughput is records examined per second by one pass (compaction reads every
record below the LSO; retention every record it deletes). The producer figure is a ratio
in one run: the same idempotent appends to the partition being compacted, with a cleaner
process cleaning it over and over, against the appends alone. Whether retention locks
producers out shows in the slowest append to a partition while a large prefix of it is
deleted, against the slowest append to it with no cleaner about.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from typing import Any

from app.broker.produce import produce
from app.cleaner.cleaner import clean_partition, partitions_to_clean
from app.coordinator.handlers import add_partitions_to_txn, end_txn
from app.coordinator.producer_id import init_producer_id
from app.log.topics import create_topic
from app.protocol import (
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    ProduceRequest,
    RecordIn,
)
from app.storage.context import BrokerContext
from bench.database import fresh_database, settle
from bench.section import Line, Measured, Run, Section, console

BATCH = 1_000
KEYS = 10_000
COMPACT = {"cleanup.policy": "compact", "delete.retention.ms": 0}


def _records(start: int, n: int, timestamp: int = 0) -> list[RecordIn]:
    return [
        RecordIn(f"{(start + i) % KEYS:016d}".encode(), b"v" * 100, timestamp) for i in range(n)
    ]


def _idempotent(broker: BrokerContext, topic: str, n: int, timestamp: int = 0) -> float:
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


def _with_aborts(broker: BrokerContext, topic: str, n: int, abort_every: int = 10) -> None:
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


def _clean_once(broker: BrokerContext, topic: str) -> tuple[float, Any]:
    [target] = partitions_to_clean(broker, topic)
    started = time.perf_counter()
    stats = clean_partition(broker, topic, 0, target.config)
    return time.perf_counter() - started, stats


def _clean_until(url: str, topic: str, stop: Any, passes: Any, force: bool) -> None:
    broker = BrokerContext.connect(url)
    [target] = partitions_to_clean(broker, topic)
    while not stop.is_set():
        clean_partition(broker, topic, 0, target.config, force=force)
        passes.value += 1


def _produce_latencies(broker: BrokerContext, topic: str, until: Any) -> list[float]:
    """Batches of 100 to ``topic`` until ``until()``; each batch's seconds."""
    ident = init_producer_id(broker, InitProducerIdRequest(None, 60_000))
    out, seq = [], 0
    while not until():
        req = ProduceRequest(
            topic, 0, _records(seq, 100), ident.producer_id, ident.producer_epoch, seq
        )
        started = time.perf_counter()
        assert produce(broker, req).error_code == 0
        out.append(time.perf_counter() - started)
        seq += 100
    return out


def _retention_pass(url: str, topic: str) -> None:
    broker = BrokerContext.connect(url)
    [target] = partitions_to_clean(broker, topic)
    clean_partition(broker, topic, 0, target.config)


def _retention_lockout(
    broker: BrokerContext, url: str, n_records: int, settle: Callable[[], None]
) -> dict[str, float]:
    """The slowest produce to a partition while retention deletes ``n_records`` below its
    new log start, against the slowest produce to it with no cleaner about; both once the
    server has settled (``settle``), so neither meets a checkpoint of the earlier phases'
    writes."""
    create_topic(broker, "expiring", 1, {"retention.ms": 1})
    _idempotent(broker, "expiring", n_records, timestamp=1_000)
    settle()
    deadline = time.perf_counter() + 2.0
    quiet = _produce_latencies(broker, "expiring", lambda: time.perf_counter() > deadline)
    ctx = multiprocessing.get_context("spawn")
    cleaner = ctx.Process(target=_retention_pass, args=(url, "expiring"))
    cleaner.start()
    busy = _produce_latencies(broker, "expiring", lambda: not cleaner.is_alive())
    cleaner.join()
    return {
        "produce_max_ms_quiet": max(quiet) * 1000,
        "produce_max_ms_during_retention": max(busy) * 1000,
        "produce_batches_during_retention": len(busy),
    }


def _produce_while_cleaning(
    broker: BrokerContext, url: str, topic: str, n_records: int, force: bool
) -> tuple[float, int]:
    """Seconds to append ``n_records`` to ``topic`` while a cleaner process cleans it pass
    after pass (forced full passes, or passes that heed min.cleanable.dirty.ratio as the
    background loop does); and how many passes it made meanwhile."""
    create_topic(broker, topic, 1, COMPACT)
    _idempotent(broker, topic, n_records)  # work for the cleaner from the start
    ctx = multiprocessing.get_context("spawn")
    stop, passes = ctx.Event(), ctx.Value("i", 0)
    cleaner = ctx.Process(target=_clean_until, args=(url, topic, stop, passes, force))
    cleaner.start()
    try:
        while passes.value == 0 and cleaner.is_alive():  # let it get going
            time.sleep(0.05)
        seconds = _idempotent(broker, topic, n_records)
    finally:
        stop.set()
        cleaner.join(timeout=600)
    return seconds, int(passes.value)


def bench_cleaner(
    url: str, n_records: int, settle: Callable[[], None] = lambda: None
) -> dict[str, Any]:
    broker = BrokerContext.connect(url)
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
    for label, force in (("forced", True), ("dirty_ratio", False)):
        busy, passes = _produce_while_cleaning(broker, url, f"busy_{label}", n_records, force)
        out[f"producer_with_cleaner_ratio_{label}"] = alone / busy
        out[f"cleaner_passes_during_produce_{label}"] = passes
    out.update(_retention_lockout(broker, url, 2 * n_records, settle))
    return out


# ---------------------------------------------------------------- the case


def cleaner(run: Run) -> Measured:
    """Retention and compaction speed, and producers' speed while the cleaner works."""
    records = run.settings.records
    with console.status("log cleaner"), fresh_database(run.server) as url:
        measured = bench_cleaner(url, records, lambda: settle(url))
    run.results["cleaner"] = measured
    return {**measured, "retained": 2 * records}


# ---------------------------------------------------------------- notes (docs/benchmarks.md)

CLEANER_READING = """\
Cleaner figures: compaction throughput counts the records one forced pass examined (a
partition of 10,000 keys updated over and over, one transaction in ten aborted);
producer ratios append to the partition being compacted while a cleaner process cleans
it pass after pass, with forced full passes or heeding `min.cleanable.dirty.ratio` as
the background loop does. The slowest-produce lines show whether retention deleting a
large prefix locks producers out (it deletes in slices, one transaction each)."""


# ---------------------------------------------------------------- the lines

LINES = (
    Line(
        "compaction_rate",
        "compaction: records examined per second (10% aborted)",
        "cleaner",
        lambda m: m["compaction_examined_per_s"],
        "{:,.0f}",
    ),
    Line(
        "retention_rate",
        "retention: records deleted per second",
        "cleaner",
        lambda m: m["retention_deleted_per_s"],
        "{:,.0f}",
    ),
    Line(
        "produce_compacting",
        "produce while the cleaner compacts the same partition, pass after pass / alone",
        "cleaner",
        lambda m: m["producer_with_cleaner_ratio_forced"],
    ),
    Line(
        "produce_dirty_ratio",
        "the same, passes heeding min.cleanable.dirty.ratio (the loop's way) / alone",
        "cleaner",
        lambda m: m["producer_with_cleaner_ratio_dirty_ratio"],
    ),
    Line(
        "slowest_quiet",
        "slowest produce (100 records), no cleaner (ms)",
        "cleaner",
        lambda m: m["produce_max_ms_quiet"],
        "{:.1f}",
    ),
    Line(
        "slowest_retention",
        "slowest produce while retention deletes {retained:,} records (ms)",
        "cleaner",
        lambda m: m["produce_max_ms_during_retention"],
        "{:.1f}",
    ),
)

SECTION = Section("cleaner", {"cleaner": cleaner}, LINES, reading=(CLEANER_READING,), core=False)
