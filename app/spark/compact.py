"""Merge the small partitions of ``read_committed_records`` that many runs leave behind.

Every materialisation run attaches one partition per topic partition it found new rows
in, so frequent small runs leave many small partitions, and each one costs every query
planning time. A compaction merges consecutive small partitions of one topic partition
into one table whose bound covers theirs, under the same promises as a run:

- the merged table is written and committed first, under the lock that keeps runs from
  attaching or pruning meanwhile, so its rows are exactly the old partitions' rows;
- one transaction then drops the old partitions, attaches the merged one (its CHECK
  constraint spares the validating scan) and updates the registry, so a reader sees
  either the old partitions or the merged one, never both (duplicates) nor neither (gaps);
- a compaction killed before that transaction leaves a merged table nobody reads, named
  and locked like a run's table, which the next run or compaction drops.

Dropping a partition locks read_committed_records exclusively for that one short
transaction: readers wait for it, and it waits for the readers already in.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, text

from app.faults import crash_point
from app.spark import sql
from app.spark.partitions import (
    Progress,
    Registered,
    drop_leftovers,
    registered,
    wait_for_older_snapshots,
    work_engine,
)

# A partition with fewer rows than this is small; consecutive small partitions of a topic
# partition are merged until the merged table reaches it.
SMALL_ROWS = 1_000_000


@dataclass(frozen=True)
class Merge:
    """Consecutive partitions of one topic partition, to become one."""

    topic: str
    partition: int
    parts: tuple[Registered, ...]

    @property
    def from_offset(self) -> int:
        return self.parts[0].from_offset

    @property
    def to_offset(self) -> int:
        return self.parts[-1].to_offset

    @property
    def rows(self) -> int:
        return sum(p.row_count for p in self.parts)


def plan(parts: Iterable[Registered], small_rows: int = SMALL_ROWS) -> list[Merge]:
    """Groups of at least two consecutive small partitions of the same topic partition,
    each group closed once it holds ``small_rows`` rows.

    Consecutive in the registry's order: no other partition lies between them, so the
    merged bound overlaps nothing but theirs (offset gaps between them, left by aborted
    transactions or retention, hold no rows and stay empty).
    """
    merges: list[Merge] = []
    group: list[Registered] = []

    def close() -> None:
        if len(group) > 1:
            merges.append(Merge(group[0].topic, group[0].partition, tuple(group)))
        group.clear()

    for part in sorted(parts, key=lambda r: (r.topic, r.partition, r.from_offset)):
        if group and (group[0].topic, group[0].partition) != (part.topic, part.partition):
            close()
        if part.row_count >= small_rows:
            close()
            continue
        group.append(part)
        if sum(p.row_count for p in group) >= small_rows:
            close()
    close()
    return merges


def compact(
    database_url: str, small_rows: int = SMALL_ROWS, progress: Progress | None = None
) -> list[Merge]:
    """Merge small partitions; the merges done."""
    report = progress or (lambda _stage, _message: None)
    engine = work_engine(database_url)
    move = {"ns": sql.LOCK_NAMESPACE, "key": sql.MOVE_LOCK}
    try:
        drop_leftovers(engine)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as owner:
            # Held throughout: no run attaches, prunes or drops a partition meanwhile.
            owner.execute(sql.LOCK_MOVE_SESSION, move)
            try:
                merges = plan(registered(engine), small_rows)
                report("plan", f"{len(merges)} merges of {sum(len(m.parts) for m in merges)}")
                for merge in merges:
                    _merge(engine, owner, merge, report)
                return merges
            finally:
                owner.execute(sql.UNLOCK_MOVE_SESSION, move)
    finally:
        engine.dispose()


def _merge(engine: Engine, owner: Connection, merge: Merge, report: Progress) -> None:
    name = f"{sql.COMPACT_PREFIX}{uuid.uuid4().hex}"
    lock = {"ns": sql.LOCK_NAMESPACE, "name": name}
    owner.execute(sql.LOCK_TABLE, lock)
    attached = False
    try:
        bound = (merge.topic, merge.partition, merge.from_offset, merge.to_offset)
        with engine.begin() as conn:
            conn.execute(text(sql.create_merged(name, *bound)))
            conn.execute(text(sql.fill_merged(name, *bound)))
            rows = conn.execute(text(sql.count_rows(name))).scalar_one()
        crash_point("spark.compact.copied")
        wait_for_older_snapshots(engine, report, "merge")
        _swap(engine, name, merge, rows)
        attached = True
        report(
            "merge",
            f"{merge.topic}[{merge.partition}] offsets {merge.from_offset}-{merge.to_offset}: "
            f"{len(merge.parts)} partitions, {rows} rows, into one",
        )
    finally:
        if not attached:
            owner.execute(text(sql.drop_work(name)))
        owner.execute(sql.UNLOCK_TABLE, lock)


def _swap(engine: Engine, name: str, merge: Merge, rows: int) -> None:
    """The old partitions out and the merged one in, in one transaction."""
    old: Sequence[str] = [p.table_name for p in merge.parts]
    with engine.begin() as conn:
        for table in old:
            conn.execute(text(sql.drop_child(table)))
        conn.execute(
            text(sql.attach(name, merge.topic, merge.partition, merge.from_offset, merge.to_offset))
        )
        conn.execute(sql.UNREGISTER, {"names": list(old)})
        conn.execute(
            sql.REGISTER,
            {
                "table_name": name,
                "topic": merge.topic,
                "partition": merge.partition,
                "from_offset": merge.from_offset,
                "to_offset": merge.to_offset,
                "row_count": rows,
            },
        )
        crash_point("spark.compact.swap")
