"""One cleaning pass over a partition: retention first, then compaction.

Order of writes, so that a process killed anywhere leaves a consistent log:

1. A producer snapshot at the new cleaning point is committed before anything below that
   point is removed (the rebuild folds from the snapshot, never over removed records).
2. Retention moves ``log_start_offset`` under the partition lock, evicting producer state
   and aborted-index entries wholly below it; the records below the log start are then
   deleted in slices, each its own transaction, so producers are never locked out for
   long and readers (which start at the log start) never see a half-deleted prefix.
3. Compaction removes, in one transaction: markers that have had no record of their
   transaction left for delete.retention.ms (with an ABORT marker's aborted-index entry),
   then aborted data, superseded values and tombstones first passed delete.retention.ms
   ago; last it notes which markers have just become empty and how far this pass
   reached (the tombstones up to there start their delete.retention.ms now). So an
   aborted-index entry outlives its transaction's records by delete.retention.ms at
   least: a reader (a consumer, a Spark job) that saw those records while they existed
   also sees the entry that hides them; and a consumer within delete.retention.ms of the
   head sees every tombstone, however old its timestamp.

Compaction never touches producer state: each producer's last batch (epoch, sequences,
offsets) stays in ``producer_states`` and in the snapshot until the producer expires, as
Kafka keeps the last batch of each producer as an empty batch header, so an idle producer
resumes with its next sequence and a retry of its last batch is still recognised.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from psycopg.errors import InsufficientPrivilege
from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from app.cleaner import plan, sql
from app.errors import KafkaError, fail
from app.faults import crash_point
from app.log.naming import could_exist
from app.log.projection import entry_row, fold_range, insert_entries
from app.log.topic_config import CleanupConfig
from app.security import needs
from app.security.authorizer import authorize_all
from app.storage.context import BrokerContext
from app.storage.engine import retry_conflicts
from app.storage.limits import lift_statement_bound

log = logging.getLogger(__name__)


@dataclass
class CleanStats:
    topic: str
    partition: int
    examined: int = 0
    records_removed: int = 0
    bytes_removed: int = 0
    log_start_offset: int = 0
    cleaned_up_to: int = 0
    skipped: bool = False

    def add(self, removed: tuple[int, int]) -> None:
        self.records_removed += int(removed[0])
        self.bytes_removed += int(removed[1])

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@contextmanager
def _partition_lock(conn: Connection, topic: str, partition: int) -> Iterator[bool]:
    """A session advisory lock: one cleaner per partition, across processes."""
    key = {"key": f"{topic}/{partition}"}
    with conn.begin():
        got = bool(conn.execute(sql.TRY_LOCK, key).scalar())
    try:
        yield got
    finally:
        if got:
            with conn.begin():
                conn.execute(sql.UNLOCK, key)


def _boundary(conn: Connection, topic: str, partition: int, offset: int) -> int:
    base = conn.execute(
        sql.BATCH_BASE_AT, {"topic": topic, "partition": partition, "offset": offset}
    ).scalar()
    return plan.batch_boundary(offset, base)


def _take_snapshot(
    conn: Connection, broker: BrokerContext, topic: str, partition: int, from_offset: int, at: int
) -> None:
    """Commit the producer state as of ``at`` (a batch boundary above the last snapshot)."""
    exp = broker.settings.producer_id_expiration_ms
    key = {"topic": topic, "partition": partition}
    with conn.begin():
        entries = fold_range(conn, topic, partition, from_offset, at, exp)
        conn.execute(sql.DROP_SNAPSHOT, key)
        insert_entries(
            conn, "producer_snapshots", (entry_row(topic, partition, e) for e in entries.values())
        )
        conn.execute(sql.SET_SNAPSHOT_OFFSET, {**key, "snapshot_offset": at})
    crash_point("cleaner.after_snapshot")


def _retain(
    conn: Connection, broker: BrokerContext, stats: CleanStats, cfg: CleanupConfig, now: int
) -> None:
    key = {"topic": stats.topic, "partition": stats.partition}
    with conn.begin():
        part = conn.execute(sql.PARTITION, key).one()
        first_young = last_over = None
        if cfg.retention_ms >= 0:
            first_young = conn.execute(
                sql.FIRST_YOUNG,
                {
                    **key,
                    "from_offset": part.log_start_offset,
                    "to_offset": part.last_stable_offset,
                    "cutoff": now - cfg.retention_ms,
                },
            ).scalar()
        if cfg.retention_bytes >= 0:
            last_over = conn.execute(
                sql.LAST_OVER_SIZE,
                {
                    **key,
                    "from_offset": part.log_start_offset,
                    "to_offset": part.next_offset,
                    "limit": cfg.retention_bytes,
                },
            ).scalar()
        target = plan.retention_target(
            cfg, part.log_start_offset, part.last_stable_offset, first_young, last_over
        )
        target = _boundary(conn, stats.topic, stats.partition, target)
    if target > part.log_start_offset:
        if target > part.snapshot_offset:
            _take_snapshot(conn, broker, stats.topic, stats.partition, part.snapshot_offset, target)
        _advance_log_start(conn, key, target)
    _delete_below_log_start(conn, stats, broker.settings.log_cleaner_delete_slice)


@retry_conflicts
def _advance_log_start(conn: Connection, key: dict[str, Any], target: int) -> None:
    with conn.begin():
        conn.execute(sql.LOCK_PARTITION, key)
        evicted = [r[0] for r in conn.execute(sql.EVICT_PRODUCERS, {**key, "log_start": target})]
        if evicted:
            conn.execute(sql.EVICT_SNAPSHOT_PRODUCERS, {**key, "producer_ids": evicted})
        conn.execute(sql.DROP_ABORTED_BELOW, {**key, "log_start": target})
        conn.execute(sql.DROP_HORIZONS_BELOW, {**key, "log_start": target})
        conn.execute(sql.DROP_PASSES_BELOW, {**key, "log_start": target})
        conn.execute(sql.ADVANCE_LOG_START, {**key, "log_start": target})
        crash_point("cleaner.in_log_start")  # the partition's row held, nothing committed
    crash_point("cleaner.after_log_start")


def _delete_below_log_start(conn: Connection, stats: CleanStats, slice_size: int) -> None:
    key = {"topic": stats.topic, "partition": stats.partition}
    with conn.begin():
        log_start = conn.execute(sql.PARTITION, key).one().log_start_offset
        first = conn.execute(sql.FIRST_RECORD, key).scalar()
    stats.log_start_offset = log_start
    while first is not None and first < log_start:
        upto = min(first + slice_size, log_start)
        with conn.begin():
            removed = conn.execute(
                sql.DELETE_BELOW_LOG_START, {**key, "from_offset": first, "to_offset": upto}
            ).one()
        stats.add(removed)
        stats.examined += int(removed[0])
        first = upto
        crash_point("cleaner.between_slices")


def _compact(
    conn: Connection,
    broker: BrokerContext,
    stats: CleanStats,
    cfg: CleanupConfig,
    now: int,
    force: bool,
) -> None:
    key = {"topic": stats.topic, "partition": stats.partition}
    with conn.begin():
        part = conn.execute(sql.PARTITION, key).one()
        too_young = None
        if cfg.min_compaction_lag_ms > 0:
            too_young = conn.execute(
                sql.FIRST_YOUNG,
                {
                    **key,
                    "from_offset": part.log_start_offset,
                    "to_offset": part.last_stable_offset,
                    "cutoff": now - cfg.min_compaction_lag_ms + 1,
                },
            ).scalar()
        limit = plan.compaction_limit(part.last_stable_offset, too_young)
        limit = _boundary(conn, stats.topic, stats.partition, limit)
    stats.cleaned_up_to = limit
    stats.log_start_offset = part.log_start_offset
    if limit <= part.log_start_offset:
        return
    if not force and not plan.worth_compacting(
        part.log_start_offset, part.snapshot_offset, limit, cfg.min_cleanable_dirty_ratio
    ):
        # Markers whose delete horizon has passed still get their pass.
        with conn.begin():
            due = conn.execute(
                sql.EXPIRED_HORIZONS, {**key, "horizon": now - cfg.delete_retention_ms}
            ).scalar()
        if not due:
            stats.cleaned_up_to = part.snapshot_offset
            return
    if limit > part.snapshot_offset:
        _take_snapshot(conn, broker, stats.topic, stats.partition, part.snapshot_offset, limit)
    with conn.begin():
        lift_statement_bound(conn)  # one pass over the partition's dirty range
        params = {
            **key,
            "log_start": part.log_start_offset,
            "limit": limit,
            "horizon": now - cfg.delete_retention_ms,
            "now": now,
        }
        stats.examined += int(conn.execute(sql.COUNT_RANGE, params).scalar_one())
        for statement in (
            sql.DELETE_EXPIRED_MARKERS,
            sql.DELETE_ABORTED_DATA,
            sql.DELETE_SUPERSEDED,
            sql.DELETE_TOMBSTONES,
        ):
            stats.add(conn.execute(statement, params).one())
            crash_point("cleaner.mid_compaction")
        conn.execute(sql.MARK_EMPTY_MARKERS, params)
        conn.execute(sql.DROP_EXPIRED_PASSES, params)
        conn.execute(sql.NOTE_PASS, params)


def clean_partition(
    broker: BrokerContext,
    topic: str,
    partition: int,
    cfg: CleanupConfig,
    now_ms: int | None = None,
    force: bool = True,
) -> CleanStats:
    """Run retention (delete policy) then compaction (compact policy) on one partition.

    Skipped (``stats.skipped``) when another cleaner holds the partition right now. Without
    ``force`` (the background loop), compaction waits until min.cleanable.dirty.ratio of
    the cleanable log is new; ``kip98 topics clean`` forces a full pass.
    """
    now = broker.clock.now_ms() if now_ms is None else now_ms
    stats = CleanStats(topic, partition)
    with broker.engine.connect() as conn, _partition_lock(conn, topic, partition) as got:
        if not got:
            stats.skipped = True
            return stats
        if cfg.delete:
            _retain(conn, broker, stats, cfg, now)
        if cfg.compact:
            _compact(conn, broker, stats, cfg, now, force)
        with conn.begin():
            conn.execute(
                sql.COUNT_REMOVED,
                {
                    "topic": topic,
                    "partition": partition,
                    "now": now,
                    "records": stats.records_removed,
                    "bytes": stats.bytes_removed,
                },
            )
    return stats


@contextmanager
def _waited_partition_lock(conn: Connection, topic: str, partition: int) -> Iterator[None]:
    """The cleaner's advisory lock on a partition, waited for (a DeleteRecords waits for a
    cleaning pass to end, within the session's lock bound)."""
    key = {"key": f"{topic}/{partition}"}
    with conn.begin():
        conn.execute(sql.LOCK, key)
    try:
        yield
    finally:
        with conn.begin():
            conn.execute(sql.UNLOCK, key)


def delete_records(broker: BrokerContext, topic: str, partition: int, offset: int) -> int:
    """Kafka's DeleteRecords for one partition: the log start moves to ``offset`` (the
    high watermark for -1; ``plan.delete_records_target`` says what is refused), as
    retention moves it: a producer snapshot first, at the first batch boundary at or after
    it (rule 21; a snapshot never splits a batch, and the fold never starts inside one
    whose first records are gone), then the log start under the partition lock, producer
    state and aborted-index entries wholly below it evicted, then the records below it
    deleted in slices. Returns the new log start (Kafka's low watermark). Needs Delete on
    the topic."""
    key = {"topic": topic, "partition": partition}
    with broker.engine.connect() as conn:
        with conn.begin():
            authorize_all(conn, broker, needs.delete_records(topic))
            config = None
            if could_exist(topic):
                config = conn.execute(sql.TOPIC_CONFIG, {"topic": topic}).first()
        if config is None:
            raise fail(
                KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} [{partition}] does not exist"
            )
        with _waited_partition_lock(conn, topic, partition):
            with conn.begin():
                part = conn.execute(sql.PARTITION, key).first()
                if part is None:
                    raise fail(
                        KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
                        f"{topic} [{partition}] does not exist",
                    )
                target = plan.delete_records_target(
                    offset, part.log_start_offset, part.next_offset, part.last_stable_offset,
                    CleanupConfig.of(config.config).delete,
                )  # fmt: skip
                if target == part.log_start_offset:
                    return target
                boundary = conn.execute(sql.BOUNDARY_FROM, {**key, "offset": target}).scalar()
            at = part.next_offset if boundary is None else boundary
            if at > part.snapshot_offset:
                _take_snapshot(conn, broker, topic, partition, part.snapshot_offset, at)
            _advance_log_start(conn, key, target)
            stats = CleanStats(topic, partition)
            _delete_below_log_start(conn, stats, broker.settings.log_cleaner_delete_slice)
            with conn.begin():
                conn.execute(
                    sql.COUNT_REMOVED,
                    {**key, "now": broker.clock.now_ms(), "records": stats.records_removed,
                     "bytes": stats.bytes_removed},
                )  # fmt: skip
    return target


@dataclass(frozen=True)
class PartitionToClean:
    topic: str
    partition: int
    config: CleanupConfig


def cleaner_partition(topic: str, partition: int, transaction_log_partitions: int) -> int:
    """The coordinator lease whose holder cleans this topic partition."""
    return zlib.crc32(f"{topic}/{partition}".encode()) % transaction_log_partitions


def partitions_to_clean(broker: BrokerContext, topic: str | None = None) -> list[PartitionToClean]:
    with broker.engine.connect() as conn:
        rows = conn.execute(sql.PARTITIONS, {"topic": topic}).all()
    return [PartitionToClean(r.topic, r.partition, CleanupConfig.of(r.config)) for r in rows]


def clean(
    broker: BrokerContext,
    targets: list[PartitionToClean],
    now_ms: int | None = None,
    on_partition: Callable[[CleanStats], None] | None = None,
) -> list[CleanStats]:
    """Clean the given partitions one after the other; a failure on one is logged and the
    pass goes on (the next pass retries it). Lacking the privilege to remove records (a
    ``kip98_client`` login) is not a failure of one partition: it is raised."""
    out = []
    for t in targets:
        try:
            stats = clean_partition(broker, t.topic, t.partition, t.config, now_ms, force=False)
        except DBAPIError as exc:
            if isinstance(exc.orig, InsufficientPrivilege):
                raise
            log.exception("cleaning %s [%d] failed", t.topic, t.partition)
            continue
        except Exception:
            log.exception("cleaning %s [%d] failed", t.topic, t.partition)
            continue
        out.append(stats)
        if on_partition is not None:
            on_partition(stats)
    return out
