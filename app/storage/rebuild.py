"""Rebuild projections from the event tables (``kip98 db rebuild``).

The projections (producer_states, aborted_txns, the partitions' offsets, transactions) are
derived data: this module recomputes them from ``records`` and ``transaction_log`` with the
very same pure fold functions the live handlers use, and can either compare or replace.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, text

from app.coordinator.rebuild import rebuild_transactions
from app.groups.rebuild import rebuild_group_offsets
from app.log.lso import lso_after_marker
from app.log.producer_state import BatchMeta, ProducerEntry, apply_append, apply_marker, is_expired
from app.protocol import CONTROL_ABORT, NO_PRODUCER_ID
from app.settings import BrokerSettings

_BATCHES = text(
    """
    SELECT topic, partition, batch_base_offset, producer_id,
           min(producer_epoch) AS producer_epoch, max("offset") AS last_offset,
           (array_agg(sequence ORDER BY "offset"))[1] AS first_seq,
           (array_agg(sequence ORDER BY "offset" DESC))[1] AS last_seq,
           max("timestamp") AS max_timestamp, bool_or(is_transactional) AS is_transactional,
           bool_or(is_control) AS is_control, min(control_type) AS control_type,
           min(coordinator_epoch) AS coordinator_epoch
    FROM records
    GROUP BY topic, partition, batch_base_offset, producer_id
    ORDER BY topic, partition, batch_base_offset
    """
)


@dataclass
class PartitionProjection:
    topic: str
    partition: int
    next_offset: int = 0
    last_stable_offset: int = 0
    producers: dict[int, ProducerEntry] = field(default_factory=dict)
    aborted: list[tuple[int, int, int, int]] = field(default_factory=list)

    def fold(self, b: Any, expiration_ms: int) -> None:
        self.next_offset = max(self.next_offset, b.last_offset + 1)
        pid = b.producer_id
        if pid == NO_PRODUCER_ID:
            return
        entry = self.producers.get(pid)
        if b.is_control:
            if (
                b.control_type == CONTROL_ABORT
                and entry is not None
                and entry.txn_first_offset is not None
            ):
                others = [
                    e.txn_first_offset
                    for p, e in self.producers.items()
                    if p != pid and e.txn_first_offset is not None
                ]
                lso = lso_after_marker(min(others) if others else None, b.last_offset + 1)
                self.aborted.append((pid, entry.txn_first_offset, b.last_offset, lso))
            self.producers[pid] = apply_marker(
                entry, pid, b.producer_epoch, b.coordinator_epoch, b.last_offset, b.max_timestamp
            )
            return
        if entry is not None and is_expired(entry, b.max_timestamp, expiration_ms):
            entry = None
        meta = BatchMeta(b.first_seq, b.last_seq, b.batch_base_offset, b.last_offset)
        self.producers[pid] = apply_append(
            entry, pid, b.producer_epoch, meta, b.max_timestamp, b.is_transactional
        )

    def finish(self, now_ms: int, expiration_ms: int, log_start_offset: int) -> None:
        self.next_offset = max(self.next_offset, log_start_offset)
        self.producers = {
            p: e for p, e in self.producers.items() if not is_expired(e, now_ms, expiration_ms)
        }
        open_firsts = [
            e.txn_first_offset for e in self.producers.values() if e.txn_first_offset is not None
        ]
        self.last_stable_offset = min(open_firsts) if open_firsts else self.next_offset


def compute_partition_log(
    conn: Connection, now_ms: int, settings: BrokerSettings
) -> dict[tuple[str, int], PartitionProjection]:
    """Fold ``records`` into the partition-log projections, as of ``now_ms``."""
    exp = settings.producer_id_expiration_ms
    starts = {
        (r.topic, r.partition): r.log_start_offset
        for r in conn.execute(text("SELECT topic, partition, log_start_offset FROM partitions"))
    }
    out: dict[tuple[str, int], PartitionProjection] = {
        key: PartitionProjection(*key, next_offset=start) for key, start in starts.items()
    }
    for b in conn.execute(_BATCHES.execution_options(yield_per=10_000)):
        key = (b.topic, b.partition)
        proj = out.setdefault(key, PartitionProjection(*key))
        proj.fold(b, exp)
    for key, proj in out.items():
        proj.finish(now_ms, exp, starts.get(key, 0))
    return out


def projection_rows(projections: Iterable[PartitionProjection]) -> dict[str, list[tuple[Any, ...]]]:
    """The projections as sorted row tuples, in the live tables' column order."""
    producers, aborted, partitions = [], [], []
    for p in projections:
        partitions.append((p.topic, p.partition, p.next_offset, p.last_stable_offset))
        for e in p.producers.values():
            producers.append(
                (
                    p.topic,
                    p.partition,
                    e.producer_id,
                    e.producer_epoch,
                    e.last_sequence,
                    e.last_offset,
                    e.last_timestamp,
                    [b.to_json() for b in e.batches],
                    e.coordinator_epoch,
                    e.txn_first_offset,
                )
            )
        for pid, first, last, lso in p.aborted:
            aborted.append((p.topic, p.partition, pid, first, last, lso))
    return {
        "partitions": sorted(partitions),
        "producer_states": sorted(producers),
        "aborted_txns": sorted(aborted),
    }


LIVE_QUERIES = {
    "partitions": "SELECT topic, partition, next_offset, last_stable_offset FROM partitions",
    "producer_states": (
        "SELECT topic, partition, producer_id, producer_epoch, last_sequence, last_offset, "
        "last_timestamp, batches, coordinator_epoch, txn_first_offset FROM producer_states"
    ),
    "aborted_txns": (
        "SELECT topic, partition, producer_id, first_offset, last_offset, last_stable_offset FROM aborted_txns"
    ),
}


def live_rows(conn: Connection) -> dict[str, list[tuple[Any, ...]]]:
    return {
        name: sorted(tuple(r) for r in conn.execute(text(q))) for name, q in LIVE_QUERIES.items()
    }


def rebuild_partition_log(
    conn: Connection, now_ms: int, settings: BrokerSettings
) -> dict[str, int]:
    """Replace the partition-log projections by the fold of ``records``.

    Every partition row is locked (in order) first, so no append interleaves.
    """
    conn.execute(text("SELECT 1 FROM partitions ORDER BY topic, partition FOR UPDATE"))
    rows = projection_rows(compute_partition_log(conn, now_ms, settings).values())
    conn.execute(text("DELETE FROM producer_states"))
    conn.execute(text("DELETE FROM aborted_txns"))
    if rows["producer_states"]:
        conn.execute(
            text(
                "INSERT INTO producer_states (topic, partition, producer_id, producer_epoch, last_sequence, "
                "last_offset, last_timestamp, batches, coordinator_epoch, txn_first_offset) VALUES "
                "(:t, :p, :pid, :ep, :seq, :lo, :ts, CAST(:b AS jsonb), :ce, :tfo)"
            ),
            [
                dict(
                    zip(
                        ("t", "p", "pid", "ep", "seq", "lo", "ts", "b", "ce", "tfo"),
                        (*r[:7], json.dumps(r[7]), *r[8:]),
                        strict=True,
                    )
                )
                for r in rows["producer_states"]
            ],
        )
    if rows["aborted_txns"]:
        conn.execute(
            text(
                "INSERT INTO aborted_txns (topic, partition, producer_id, first_offset, last_offset, "
                "last_stable_offset) VALUES (:t, :p, :pid, :f, :l, :lso)"
            ),
            [
                dict(zip(("t", "p", "pid", "f", "l", "lso"), r, strict=True))
                for r in rows["aborted_txns"]
            ],
        )
    if rows["partitions"]:
        conn.execute(
            text(
                "UPDATE partitions SET next_offset = :n, last_stable_offset = :lso WHERE topic = :t AND partition = :p"
            ),
            [{"t": t, "p": p, "n": n, "lso": lso} for t, p, n, lso in rows["partitions"]],
        )
    return {name: len(v) for name, v in rows.items()}


# Other families register their rebuilders here (name -> fn(conn, now_ms, settings)).
REBUILDERS: dict[str, Callable[[Connection, int, BrokerSettings], dict[str, int]]] = {
    "partition log": rebuild_partition_log,
    "transaction log": rebuild_transactions,
    "group offsets": rebuild_group_offsets,
}


def rebuild_all(
    engine: Engine, now_ms: int | None = None, settings: BrokerSettings | None = None
) -> dict[str, int]:
    """Rebuild every projection in one DB transaction; returns row counts per table."""
    from app.clock import SYSTEM_CLOCK

    now = SYSTEM_CLOCK.now_ms() if now_ms is None else now_ms
    cfg = settings or BrokerSettings.from_env()
    counts: dict[str, int] = {}
    with engine.begin() as conn:
        for rebuild in REBUILDERS.values():
            counts.update(rebuild(conn, now, cfg))
    return counts
