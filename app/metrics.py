"""Operational metrics of the transactional log, gathered from PostgreSQL in one place.

Nothing in memory is authoritative here, so metrics are not counters kept by a process
but a snapshot read from the tables every process writes; any process (the CLI, a
scraper) sees the same figures. ``Kip98Collector`` plugs the snapshot into a
prometheus-client registry, read at each scrape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from sqlalchemy import Engine, text

from app.broker.loop import ITEM_WORK
from app.coordinator.machines import DEAD, TXN_STATES

M = TypeVar("M", CounterMetricFamily, GaugeMetricFamily)

OUTCOMES = ("started", "committed", "aborted", "timed_out")

_PRODUCERS = text("SELECT count(DISTINCT producer_id) FROM producer_states")
# cleaner_lag: offsets below the LSO a compacted partition's cleaner has not reached yet
# (Kafka's dirty section); the removed counters come from the cleaner's checkpoints.
_PARTITIONS = text(
    """
    SELECT s.topic, s.partition, s.high_watermark, s.last_stable_offset, s.open_transactions,
           s.log_start_offset,
           coalesce(c.records_removed, 0) AS records_removed,
           coalesce(c.bytes_removed, 0) AS bytes_removed,
           CASE WHEN t.config ->> 'cleanup.policy' LIKE '%compact%'
                THEN greatest(0, s.last_stable_offset
                                 - greatest(s.log_start_offset, coalesce(c.snapshot_offset, 0)))
                ELSE 0 END AS cleaner_lag
    FROM partition_status s
    JOIN topics t ON t.topic = s.topic
    LEFT JOIN log_cleaner_checkpoints c ON c.topic = s.topic AND c.partition = s.partition
    ORDER BY s.topic, s.partition
    """
)
_STATES = text("SELECT state, count(*) FROM transactions GROUP BY state")
# A transaction starts when an id enters BEGIN from any other state (later
# AddPartitionsToTxn calls persist BEGIN again); the loop's timeouts carry their reason.
_OUTCOMES = text(
    """
    SELECT count(*) FILTER (WHERE state = 'BEGIN' AND previous IS DISTINCT FROM 'BEGIN'),
           count(*) FILTER (WHERE state = 'COMPLETE_COMMIT'),
           count(*) FILTER (WHERE state = 'COMPLETE_ABORT'),
           count(*) FILTER (WHERE state = 'PREPARE_ABORT' AND reason = 'transaction timed out')
    FROM (
        SELECT state, reason,
               lag(state) OVER (PARTITION BY transactional_id ORDER BY event_id) AS previous
        FROM transaction_log
    ) events
    """
)
_ITEM_FAILURES = text("SELECT work, failures FROM coordinator_item_failures")
_LATE = text("SELECT count(*) FROM (SELECT DISTINCT topic, partition FROM hanging_transactions) p")


@dataclass(frozen=True)
class PartitionMetrics:
    topic: str
    partition: int
    high_watermark: int
    last_stable_offset: int
    open_transactions: int
    log_start_offset: int = 0
    records_removed: int = 0
    bytes_removed: int = 0
    cleaner_lag: int = 0

    @property
    def lso_lag(self) -> int:
        """Records a read_committed reader cannot see yet: what open transactions hold back."""
        return self.high_watermark - self.last_stable_offset


@dataclass(frozen=True)
class Snapshot:
    producer_ids_live: int
    partitions: tuple[PartitionMetrics, ...]
    transactional_ids: dict[str, int]
    transactions: dict[str, int]
    partitions_with_late_transactions: int
    # Coordinator loop items that failed (and were backed off and skipped), by kind of work.
    coordinator_item_failures: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(ITEM_WORK, 0)
    )


def gather(engine: Engine) -> Snapshot:
    """Read every figure in one repeatable-read transaction, so they agree with each other."""
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="REPEATABLE READ")
        with conn.begin():
            live = int(conn.execute(_PRODUCERS).scalar_one())
            partitions = tuple(
                PartitionMetrics(
                    r.topic,
                    r.partition,
                    r.high_watermark,
                    r.last_stable_offset,
                    int(r.open_transactions),
                    r.log_start_offset,
                    int(r.records_removed),
                    int(r.bytes_removed),
                    int(r.cleaner_lag),
                )
                for r in conn.execute(_PARTITIONS)
            )
            by_state = {s: 0 for s in TXN_STATES if s != DEAD}
            by_state.update({state: int(n) for state, n in conn.execute(_STATES)})
            outcomes = conn.execute(_OUTCOMES).one()
            late = int(conn.execute(_LATE).scalar_one())
            item_failures = dict.fromkeys(ITEM_WORK, 0)
            item_failures.update({w: int(n) for w, n in conn.execute(_ITEM_FAILURES)})
    return Snapshot(
        producer_ids_live=live,
        partitions=partitions,
        transactional_ids=by_state,
        transactions=dict(zip(OUTCOMES, (int(n) for n in outcomes), strict=True)),
        partitions_with_late_transactions=late,
        coordinator_item_failures=item_failures,
    )


class Kip98Collector:
    """A prometheus-client collector over ``source`` (called once per scrape)."""

    def __init__(self, source: Callable[[], Snapshot]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        yield from families(self._source())


def families(snap: Snapshot) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "kip98_producer_ids_live",
        "Producer ids with state kept on at least one partition.",
        value=snap.producer_ids_live,
    )
    labels = ["topic", "partition"]
    hw = GaugeMetricFamily(
        "kip98_partition_high_watermark", "Next offset to be written.", labels=labels
    )
    lso = GaugeMetricFamily(
        "kip98_partition_last_stable_offset",
        "Offset read_committed consumers read up to (exclusive).",
        labels=labels,
    )
    lag = GaugeMetricFamily(
        "kip98_partition_lso_lag",
        "High watermark minus last stable offset: records held back by open transactions.",
        labels=labels,
    )
    open_txns = GaugeMetricFamily(
        "kip98_partition_open_transactions",
        "Producers with a transaction open on the partition.",
        labels=labels,
    )
    log_start = GaugeMetricFamily(
        "kip98_partition_log_start_offset",
        "First offset still in the log (retention moves it).",
        labels=labels,
    )
    removed = CounterMetricFamily(
        "kip98_cleaner_records_removed",
        "Records removed by retention and compaction.",
        labels=labels,
    )
    removed_bytes = CounterMetricFamily(
        "kip98_cleaner_bytes_removed",
        "Bytes (keys, values, headers, 24 per record) removed by retention and compaction.",
        labels=labels,
    )
    cleaner_lag = GaugeMetricFamily(
        "kip98_cleaner_lag",
        "Offsets below the LSO of a compacted partition the cleaner has not reached yet.",
        labels=labels,
    )
    for p in snap.partitions:
        values = [p.topic, str(p.partition)]
        hw.add_metric(values, p.high_watermark)
        lso.add_metric(values, p.last_stable_offset)
        lag.add_metric(values, p.lso_lag)
        open_txns.add_metric(values, p.open_transactions)
        log_start.add_metric(values, p.log_start_offset)
        removed.add_metric(values, p.records_removed)
        removed_bytes.add_metric(values, p.bytes_removed)
        cleaner_lag.add_metric(values, p.cleaner_lag)
    yield from (hw, lso, lag, open_txns, log_start, removed, removed_bytes, cleaner_lag)
    yield labelled(
        GaugeMetricFamily("kip98_transactional_ids", "Transactional ids by coordinator state.",
                          labels=["state"]),
        snap.transactional_ids,
    )  # fmt: skip
    yield labelled(
        CounterMetricFamily("kip98_transactions",
                            "Transactions by outcome since the transaction log began.",
                            labels=["outcome"]),
        snap.transactions,
    )  # fmt: skip
    yield GaugeMetricFamily(
        "kip98_partitions_with_late_transactions",
        "Partitions with a hanging transaction: open past its timeout or with no live "
        "coordinator transaction (they pin the LSO).",
        value=snap.partitions_with_late_transactions,
    )
    failures = CounterMetricFamily(
        "kip98_coordinator_item_failures",
        "Coordinator loop items (a transaction to roll forward, time out or expire; producer "
        "expiry; cleaning) that failed and were skipped, by kind of work.",
        labels=["work"],
    )
    yield labelled(failures, snap.coordinator_item_failures)


def labelled(family: M, counts: Mapping[str, float]) -> M:
    """``family`` (with one label) holding a sample per label value of ``counts``, in
    their order."""
    for value, count in counts.items():
        family.add_metric([value], count)
    return family


def prometheus_text(snap: Snapshot) -> bytes:
    """The snapshot in Prometheus' text exposition format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Kip98Collector(lambda: snap))
    return generate_latest(registry)
