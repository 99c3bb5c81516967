"""read_committed_records' partitions: the registry, leftovers of killed runs, and the wait
that keeps old snapshots from seeing a partition half-written.

``read_committed_records`` is partitioned by range of ``(topic, partition, "offset")``;
each partition holds one topic partition's offsets ``[from_offset, to_offset)`` and is
registered in ``read_committed_partitions`` by the transaction that attaches it. Tables
being written (a run's, a compaction's) are not partitions of it and carry generated
names, so a killed run's are recognised by name and by the advisory lock their session
no longer holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Engine, create_engine, pool, text

from app.settings import BrokerSettings
from app.spark import sql
from app.storage.stalls import watch_stalls
from app.storage.urls import sqlalchemy_url

Progress = Callable[[str, str], None]
SNAPSHOT_POLL_S = 0.05


@dataclass(frozen=True)
class Registered:
    """One partition of read_committed_records, as registered when it was attached."""

    table_name: str
    topic: str
    partition: int
    from_offset: int
    to_offset: int
    row_count: int


def work_engine(database_url: str) -> Engine:
    """An engine whose sessions carry kip98's application_name (``wait_for_older_snapshots``
    does not wait for them), and end a session stalled by its stopped client that holds
    what they wait for (docs/design.md rule 34)."""
    engine = create_engine(
        sqlalchemy_url(database_url),
        poolclass=pool.NullPool,
        connect_args={"application_name": sql.APPLICATION_NAME},
    )
    return watch_stalls(engine, BrokerSettings.from_env())


def registered(engine: Engine) -> list[Registered]:
    with engine.connect() as conn:
        return [Registered(*r) for r in conn.execute(sql.REGISTERED).all()]


def drop_leftovers(engine: Engine) -> list[str]:
    """Drop run and compaction tables whose session is gone (it held their lock): what a
    killed run or compaction wrote and never attached. Nobody reads them, so dropping
    them changes nothing read_committed_records returns."""
    dropped = []
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for (name,) in conn.execute(sql.LEFTOVER_TABLES).all():
            params = {"ns": sql.LOCK_NAMESPACE, "name": sql.check_work_name(name)}
            if not conn.execute(sql.TRY_LOCK_TABLE, params).scalar():
                continue  # a live run owns it
            try:
                conn.execute(text(sql.drop_work(name)))
                dropped.append(name)
            finally:
                conn.execute(sql.UNLOCK_TABLE, params)
    return dropped


def wait_for_older_snapshots(engine: Engine, report: Progress, stage: str) -> int:
    """Wait until every transaction that holds a snapshot now has ended; how many there
    were.

    Called once rows are committed and before they are attached. A READ COMMITTED
    statement takes its snapshot when it starts, so it sees the partitions either before
    the attach or after, with all their rows. A REPEATABLE READ transaction keeps its
    first snapshot: had it taken it while Spark's tasks were committing, it would see the
    attached partition with only the rows committed before then. Every such transaction
    holds a snapshot at this point, so once each has ended none is left.
    Kip98's own sessions (``work_engine``) are not waited for: they read
    read_committed_records only in the statements of the transactions that change it.
    """
    with engine.connect() as conn:
        waiting = {pid: start for pid, start in conn.execute(
            sql.OPEN_SNAPSHOTS, {"ours": sql.APPLICATION_NAME}
        ).all()}  # fmt: skip
        count = len(waiting)
        if waiting:
            report(stage, f"waiting for {len(waiting)} transactions older than the rows to end")
        while waiting:
            time.sleep(SNAPSHOT_POLL_S)
            now = conn.execute(sql.TRANSACTION_STARTS, {"pids": list(waiting)}).all()
            conn.commit()
            waiting = {pid: start for pid, start in now if waiting.get(pid) == start}
    return count
