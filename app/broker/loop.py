"""The coordinator loop: what Kafka's transaction coordinator does on its own schedule.

Work is split by transaction-log partition; a process works a partition only while it
holds that partition's lease, and every takeover bumps the partition's coordinator epoch
(which markers carry). Per pass, for the partitions it holds:

- roll forward transactions left PREPARE_* by a process that died mid-EndTxn;
- time out BEGIN transactions past transaction.timeout.ms: fence (bump epoch), then abort,
  so no LSO stays pinned by a stalled producer (docs/design.md rule 10);
- expire transactional ids idle for transactional.id.expiration.ms (EMPTY/COMPLETE only);
- expire idle producer state, and remove consumer group members past their session or
  rebalance timeout (whoever holds partition 0);
- every ``log_cleaner_interval_ms``, clean (retention, compaction) the topic partitions
  that hash to its leases (app.cleaner).

One item that keeps failing (a marker a partition refuses, a database error of its own)
must not stop the rest: it is logged, counted (``coordinator_item_failures``, read by
app.metrics), backed off by the clock, and the pass goes on with every other item and
kind of work. Only the database going away ends a pass (the next one starts afresh).

Runs as a thread of every ``kip98 serve`` node (``app.server.registration``; Kafka's
brokers run their coordinators' timers themselves), as ``kip98 coordinator run``, and as a
daemon thread in client processes (``background``); whoever runs it, each
transaction-log partition's work is done by one loop at a time, the one holding its lease.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from dataclasses import dataclass, field, replace

import psycopg
from psycopg.errors import InsufficientPrivilege
from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from app.cleaner.cleaner import clean, cleaner_partition, partitions_to_clean
from app.cluster.sql import LOCAL_COMMIT
from app.coordinator import sql
from app.coordinator.handlers import coordinator_epoch, fence_and_abort, roll_forward
from app.coordinator.metadata import is_expirable, is_timed_out
from app.coordinator.txn_log import load_for_update, persist
from app.errors import KafkaError, KafkaException, fail
from app.groups.consumer import expire_sessions
from app.log.expiry import expire_producer_states
from app.storage.context import BrokerContext
from app.storage.engine import retry_conflicts
from app.storage.errors import kafka_error

log = logging.getLogger(__name__)

# The kinds of work a failure is counted under (the ``work`` label of the metric), and the
# pass's items by kind.
ITEM_WORK = ("roll_forward", "time_out", "expire", "expire_producers", "clean")
_WORK_OF = {"prepared": "roll_forward", "timed_out": "time_out", "expirable": "expire"}
# A failed item waits one coordinator interval, then twice as long after each further
# failure, never longer than this.
ITEM_BACKOFF_MAX_MS = 60_000


def ends_the_pass(exc: BaseException) -> bool:
    """Whether ``exc`` is the database connection lost (or the server going down), which
    ends the pass, rather than one item's failure, which is backed off and skipped:
    counting a lost connection against every item in turn would only hide the outage."""
    orig: BaseException | None = exc
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated:
            return True
        orig = exc.orig
    if isinstance(orig, psycopg.InterfaceError):
        return True
    if not isinstance(orig, psycopg.OperationalError):
        return False
    sqlstate = orig.sqlstate
    # No SQLSTATE: the connection itself failed; class 08: connection exception; 57P:
    # the server shutting down or restarting.
    return sqlstate is None or sqlstate.startswith(("08", "57P"))


def _lease_lost(exc: BaseException) -> bool:
    return (
        isinstance(exc, KafkaException)
        and exc.error.code() == KafkaError.TRANSACTION_COORDINATOR_FENCED
    )


@dataclass
class _Backoff:
    """A transactional id whose last attempt failed: how many times in a row, and when the
    loop may try it again."""

    failures: int
    retry_at_ms: int


@dataclass
class PassStats:
    leases: dict[int, int] = field(default_factory=dict)
    rolled_forward: int = 0
    timed_out: int = 0
    expired_ids: int = 0
    expired_producers: int = 0
    expired_members: int = 0
    fenced: int = 0
    cleaned_records: int = 0
    failed: int = 0
    backed_off: int = 0

    def add(self, other: PassStats) -> None:
        self.rolled_forward += other.rolled_forward
        self.timed_out += other.timed_out
        self.expired_ids += other.expired_ids
        self.expired_producers += other.expired_producers
        self.expired_members += other.expired_members
        self.fenced += other.fenced
        self.cleaned_records += other.cleaned_records
        self.failed += other.failed
        self.backed_off += other.backed_off


def fair_share(partitions: int, loops: int) -> int:
    """The leases one of ``loops`` live coordinator loops holds at most: enough that
    together they hold every one of ``partitions``."""
    return -(-partitions // max(loops, 1))


class CoordinatorLoop:
    def __init__(self, broker: BrokerContext, owner: str | None = None) -> None:
        self.broker = broker
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.totals = PassStats()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # The first cleaning waits one interval: a process starting up has better things to do.
        self._last_clean_ms = broker.clock.now_ms()
        self.cleaning_allowed = True
        self._backoff: dict[str, _Backoff] = {}

    # ------------------------------------------------------------ leases
    @retry_conflicts
    def acquire_leases(self) -> dict[int, int]:
        """Take or renew a fair share of the leases, those held first, then free ones:
        {txn_partition: coordinator_epoch}. The loops at work share them evenly (rule 59):
        each counts the live loops, gives up what it holds beyond its share, and takes free
        ones up to it, so a loop that joins gets leases from those already running."""
        s = self.broker.settings
        now = self.broker.clock.now_ms()
        expires = now + s.coordinator_lease_ms
        with self.broker.engine.begin() as conn:
            # Leases commit on the primary alone, as the serve nodes' registrations do: a
            # node with its standbys gone still renews, and stops, without waiting for
            # them. One lost to a failover is safe, since everything done under a lease
            # checks its epoch in its own DB transaction, which waits for the standbys.
            conn.execute(LOCAL_COMMIT)
            conn.execute(sql.ENSURE_LEASES, {"n": s.transaction_log_partitions})
            conn.execute(sql.JOIN_LOOPS, {"owner": self.owner, "expires_ms": expires})
            conn.execute(sql.FORGET_LAPSED_LOOPS, {"now": now})
            live = int(conn.execute(sql.LIVE_LOOPS, {"now": now}).scalar_one())
            share = fair_share(s.transaction_log_partitions, live)
            conn.execute(sql.SHED_LEASES, {"owner": self.owner, "share": share})
            rows = conn.execute(
                sql.ACQUIRE_LEASES,
                {"owner": self.owner, "expires_ms": expires, "now": now, "share": share},
            ).all()
        return {int(r.txn_partition): int(r.coordinator_epoch) for r in rows}

    def release_leases(self) -> None:
        with self.broker.engine.begin() as conn:
            conn.execute(LOCAL_COMMIT)  # on the primary alone, as acquire_leases
            conn.execute(sql.RELEASE_LEASES, {"owner": self.owner})
            conn.execute(sql.LEAVE_LOOPS, {"owner": self.owner})

    # ------------------------------------------------------------ one pass
    def run_once(self) -> PassStats:
        stats = PassStats(leases=self.acquire_leases())
        now = self.broker.clock.now_ms()
        work = self._pass_work(list(stats.leases), now)
        # Forget the back-off of ids with nothing left to do (or no longer ours).
        listed = {tid for items in work.values() for _, tid in items}
        self._backoff = {t: b for t, b in self._backoff.items() if t in listed}
        for txn_partition, epoch in sorted(stats.leases.items()):
            try:
                self._work_partition(work.get(txn_partition, []), epoch, now, stats)
            except KafkaException as exc:
                if exc.error.code() != KafkaError.TRANSACTION_COORDINATOR_FENCED:
                    raise
                stats.fenced += 1
                log.warning(
                    "lost the lease of transaction-log partition %d: %s", txn_partition, exc
                )
        if 0 in stats.leases:
            try:
                stats.expired_producers = expire_producer_states(self.broker, now)
            except Exception as exc:
                if ends_the_pass(exc):
                    raise
                self._failed("expire_producers", "producer state expiry failed", exc, now, stats)
            try:  # KIP-848's session and rebalance timeouts, the coordinator's timers
                stats.expired_members = expire_sessions(self.broker, now)
            except Exception as exc:
                if ends_the_pass(exc):
                    raise
                self._failed(
                    "expire_members", "consumer group member expiry failed", exc, now, stats
                )
        interval = self.broker.settings.log_cleaner_interval_ms
        if self.cleaning_allowed and interval > 0 and now - self._last_clean_ms >= interval:
            self._last_clean_ms = now  # a failed cleaning waits one interval too
            try:
                stats.cleaned_records = self._clean(set(stats.leases), now)
            except Exception as exc:
                if ends_the_pass(exc):
                    raise
                self._failed("clean", "log cleaning failed", exc, now, stats)
        self.totals.add(stats)
        return stats

    def _failed(self, work: str, what: str, exc: Exception, now: int, stats: PassStats) -> None:
        """Log and count one failure of ``work``; the pass goes on."""
        stats.failed += 1
        log.warning("%s: %s", what, exc, exc_info=not isinstance(exc, KafkaException))
        try:
            with self.broker.engine.begin() as conn:
                conn.execute(sql.COUNT_ITEM_FAILURE, {"work": work, "now": now})
        except Exception as count_exc:  # the metric must not fail the pass either
            log.warning("could not count a coordinator failure: %s", count_exc)

    def _item_failed(
        self, work: str, transactional_id: str, exc: Exception, now: int, stats: PassStats
    ) -> None:
        """Back off from ``transactional_id``: one interval, doubled per failure in a row,
        up to ITEM_BACKOFF_MAX_MS."""
        previous = self._backoff.get(transactional_id)
        failures = 1 if previous is None else previous.failures + 1
        base = max(1, self.broker.settings.coordinator_interval_ms)
        wait = min(base << min(failures - 1, 32), max(base, ITEM_BACKOFF_MAX_MS))
        self._backoff[transactional_id] = _Backoff(failures, now + wait)
        what = (
            f"{work} of transactional id {transactional_id!r} failed "
            f"({failures} in a row; next try in {wait} ms)"
        )
        self._failed(work, what, exc, now, stats)

    def _clean(self, leases: set[int], now: int) -> int:
        n = self.broker.settings.transaction_log_partitions
        mine = [
            t
            for t in partitions_to_clean(self.broker)
            if cleaner_partition(t.topic, t.partition, n) in leases
        ]
        try:
            return sum(s.records_removed for s in clean(self.broker, mine, now))
        except DBAPIError as exc:
            if not isinstance(exc.orig, InsufficientPrivilege):
                raise
            # A kip98_client login may not remove records: leave cleaning to a process
            # with the admin role (``kip98 coordinator run``) and stop trying here.
            log.warning("log cleaning disabled in this process: %s", exc.orig)
            self.cleaning_allowed = False
            return 0

    def _pass_work(self, txn_partitions: list[int], now: int) -> dict[int, list[tuple[str, str]]]:
        """{txn_partition: [(work, transactional_id)]} in the order to do it."""
        work: dict[int, list[tuple[str, str]]] = {}
        if not txn_partitions:
            return work
        params = {
            "txn_partitions": txn_partitions,
            "now": now,
            "expiration_ms": self.broker.settings.transactional_id_expiration_ms,
        }
        with self.broker.engine.connect() as conn:
            for r in conn.execute(sql.PASS_WORK, params):
                work.setdefault(r.txn_partition, []).append((r.work, r.transactional_id))
        return work

    def _work_partition(
        self, work: list[tuple[str, str]], epoch: int, now: int, stats: PassStats
    ) -> None:
        for kind, tid in work:
            held = self._backoff.get(tid)
            if held is not None and now < held.retry_at_ms:
                stats.backed_off += 1
                continue
            try:
                self._work_item(kind, tid, epoch, stats)
            except Exception as exc:
                if ends_the_pass(exc) or _lease_lost(exc):
                    raise
                self._item_failed(_WORK_OF[kind], tid, exc, now, stats)
            else:
                self._backoff.pop(tid, None)

    def _work_item(self, kind: str, tid: str, epoch: int, stats: PassStats) -> None:
        if kind == "prepared":
            roll_forward(self.broker, tid, expected_epoch=epoch)
            stats.rolled_forward += 1
        elif kind == "timed_out":
            stats.timed_out += self._time_out(tid, epoch)
        else:
            stats.expired_ids += self._expire(tid, epoch)

    def _check_lease(self, conn: Connection, txn_partition: int, epoch: int) -> None:
        current = coordinator_epoch(conn, txn_partition)
        if current != epoch:
            raise fail(
                KafkaError.TRANSACTION_COORDINATOR_FENCED, f"lease epoch is {current}, not {epoch}"
            )

    @retry_conflicts
    def _time_out(self, transactional_id: str, epoch: int) -> int:
        with self.broker.engine.begin() as conn:
            meta = load_for_update(conn, transactional_id)
            now = self.broker.clock.now_ms()
            if meta is None or not is_timed_out(meta, now):
                return 0
            self._check_lease(conn, meta.txn_partition, epoch)
            fence_and_abort(conn, meta, epoch, now, "transaction timed out")
            return 1

    @retry_conflicts
    def _expire(self, transactional_id: str, epoch: int) -> int:
        with self.broker.engine.begin() as conn:
            meta = load_for_update(conn, transactional_id)
            now = self.broker.clock.now_ms()
            if meta is None or not is_expirable(
                meta, now, self.broker.settings.transactional_id_expiration_ms
            ):
                return 0
            self._check_lease(conn, meta.txn_partition, epoch)
            dead = meta.transition("expire", updated_ms=now)
            persist(conn, replace(dead, coordinator_epoch=epoch), "transactional id expired")
            return 1

    # ------------------------------------------------------------ thread
    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self.run_forever, name="kip98-coordinator", daemon=True
        )
        self._thread.start()

    def run_forever(self) -> None:
        interval = self.broker.settings.coordinator_interval_ms / 1000.0
        held = -1
        while not self._stop.is_set():
            try:
                stats = self.run_once()
                if len(stats.leases) != held:
                    held = len(stats.leases)
                    log.info("coordinator %s holds %d of %d transaction-log partitions",
                             self.owner, held, self.broker.settings.transaction_log_partitions)  # fmt: skip
            except Exception as exc:  # a database outage must not kill the loop; it retries
                error = kafka_error(exc)
                if error is not None and error.retriable():  # the database unreachable, a
                    # failover under way: one line, not a stack, every pass it lasts
                    log.warning("coordinator pass failed: %s", error.str())
                else:
                    log.exception("coordinator pass failed")
            self._stop.wait(interval)

    def stop(self, release: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if release:
            try:
                self.release_leases()
            except Exception as exc:
                if ends_the_pass(exc):  # unreachable: they lapse; the caller reports it
                    log.debug("coordinator leases left to lapse: %s", exc)
                else:
                    log.exception("could not release coordinator leases")
