"""acks=all on a replicated PostgreSQL: what a commit's wait for the standbys means to a
request (docs/design.md rules 41 and 42).

PostgreSQL makes a commit wait for its synchronous standbys (``synchronous_standby_names``,
``ANY K (...)``, with ``synchronous_commit`` on) after the commit is already durable on the
primary: its WAL is flushed and the transaction is committed there, only not yet shown to
others. Three facts shape what follows, each checked on PostgreSQL 15:

- No timeout of the server ends that wait. ``statement_timeout`` is switched off before
  the commit runs, so a commit whose standbys are gone waits for as long as they are. A
  query cancel does end it: the server then warns ("canceling wait for synchronous
  replication", SQLSTATE 01000, "the transaction has already committed locally, but might
  not have been replicated") and answers the commit as done. So each commit of a kip98
  session is watched (``ReplicatedConnection``): past its bound (the session's statement
  bound, narrowed by the request's own deadline) the process cancels it, and a commit
  answered with that warning raises ``ReplicationUnconfirmed``: the request's writes are
  on the primary, not confirmed by the standbys. Kafka's NOT_ENOUGH_REPLICAS_AFTER_APPEND,
  retriable: the client sends the request again.
- A transaction that writes nothing to the WAL does not wait at all; one that only locks
  a row does (a row lock is a WAL record). The retry of a request whose first attempt
  committed on the primary is recognised (a duplicate batch, a commit already made) and
  adds nothing, and its answer acknowledges the first attempt; every such retry is
  decided under the row lock that protects what it reads (docs/design.md rules 4, 13,
  32), so its commit waits for the standbys to confirm the WAL up to its lock, which
  covers the first attempt's commit, the WAL being one sequence.
- Writing into a replication that cannot confirm only to find out at the bound wastes
  the request's time and leaves its writes unconfirmed. Before an acks=all write the
  broker asks whether enough synchronous standbys are streaming (``replicas_short``,
  ``pg_stat_replication``): if not, NOT_ENOUGH_REPLICAS, nothing written. The answer is
  kept per engine for a second (a tenth of one while short), and dropped when a commit's
  wait was cancelled, so the check is not a round trip per request.
"""

from __future__ import annotations

import logging
import math
import re
import time
import weakref
from dataclasses import dataclass, replace
from typing import Any
from weakref import WeakKeyDictionary

import psycopg
from psycopg.errors import Diagnostic
from sqlalchemy import Connection, Engine, event

from app.settings import BrokerSettings
from app.storage import watchdog
from app.storage.limits import commit_deadline, session_options
from app.storage.watchdog import Watchdog

log = logging.getLogger(__name__)

# What the server says when a commit's wait for its standbys is cancelled (a query
# cancel; or the backend being terminated, whose connection then ends too).
_WAIT_CANCELLED = re.compile(r"cancel\w* (the )?wait for synchronous replication")
_WARNING_STATE = "01000"
# How long a watched commit's cancel may take to reach the server.
_CANCEL_TIMEOUT_S = 5.0
# How long a look at the standbys stands, when enough of them were streaming / too few.
_ENOUGH_FOR_S = 1.0
_SHORT_FOR_S = 0.1

# The server's replication, as one row: what it asks of commits, and who streams.
REPLICATION_STATE = """
SELECT current_setting('synchronous_standby_names'),
       current_setting('synchronous_commit'),
       count(*) FILTER (WHERE state = 'streaming' AND sync_state IN ('sync', 'quorum')),
       count(*),
       count(sync_state)
  FROM pg_stat_replication
"""


class ReplicationUnconfirmed(psycopg.OperationalError):
    """The commit is durable on the primary, but its wait for the synchronous standbys was
    cancelled at the request's bound: not acknowledged, to be retried."""


class NotEnoughReplicas(psycopg.OperationalError):
    """Too few synchronous standbys are streaming for an acks=all write: nothing written."""


# ------------------------------------------------------------------ what the server asks


def required_standbys(synchronous_standby_names: str, synchronous_commit: str) -> int:
    """How many synchronous standbys must confirm a commit: K of ``FIRST K (...)``,
    ``ANY K (...)`` or ``K (...)``, 1 for a bare list, 0 without one or when commits do
    not wait for standbys (``synchronous_commit`` off or local)."""
    names = synchronous_standby_names.strip()
    if not names or synchronous_commit in ("off", "local"):
        return 0
    found = re.match(r"^(?:(?:first|any)\s+)?(\d+)\s*\(", names, re.IGNORECASE)
    return int(found.group(1)) if found else 1


@dataclass(frozen=True)
class Replicas:
    """The standbys as one look at ``pg_stat_replication`` found them."""

    required: int
    streaming: int  # synchronous standbys (sync or quorum) streaming
    connected: int  # every walsender, whatever its state
    visible: int  # rows whose state this role may see (pg_read_all_stats)
    copies: int = 1  # the in-sync copies asked for, the primary's own counted

    @property
    def enough(self) -> bool:
        """Whether an acks=all commit can be confirmed, with ``copies`` in sync. A role
        that may not see the standbys' states counts every connected one (it cannot tell
        them apart)."""
        seen = self.streaming if self.visible == self.connected else self.connected
        return seen >= self.required and 1 + seen >= self.copies

    def describe(self) -> str:
        if self.copies > 1 + self.streaming:
            return (
                f"{1 + self.streaming} in-sync copies (the primary and {self.streaming} "
                f"synchronous standbys streaming), fewer than min.insync.replicas {self.copies}"
            )
        return f"{self.streaming} of {self.required} synchronous standbys streaming"


@dataclass
class _Health:
    """One engine's last look at its standbys."""

    looked: Replicas | None = None
    at: float = -math.inf

    def fresh(self, now: float) -> Replicas | None:
        if self.looked is None:
            return None
        stands = _ENOUGH_FOR_S if self.looked.enough else _SHORT_FOR_S
        return self.looked if now - self.at < stands else None

    def forget(self) -> None:
        self.looked = None


_health: WeakKeyDictionary[Engine, _Health] = WeakKeyDictionary()


def look(conn: Connection) -> Replicas:
    """The standbys as the server sees them now."""
    names, sync_commit, streaming, connected, visible = conn.exec_driver_sql(
        REPLICATION_STATE
    ).one()
    return Replicas(required_standbys(names, sync_commit), streaming, connected, visible)


def replicas_short(engine: Engine, copies: int = 1) -> Replicas | None:
    """What is short, if too few synchronous standbys stream for an acks=all write to be
    confirmed, or for ``copies`` in-sync copies (a topic's min.insync.replicas, the
    primary's own counted); None when it may go ahead (also for an engine not watched,
    ``watch_commits``). Looks at the server at most once a second while enough stream."""
    health = _health.get(engine)
    if health is None:
        return None
    now = time.monotonic()
    replicas = health.fresh(now)
    if replicas is None:
        with engine.connect() as conn:
            replicas = look(conn)
            conn.rollback()
        health.looked, health.at = replicas, now
    if copies > 1:
        replicas = replace(replicas, copies=copies)
    return None if replicas.enough else replicas


def not_enough(replicas: Replicas) -> NotEnoughReplicas:
    return NotEnoughReplicas(f"not enough replicas: {replicas.describe()}")


def unconfirmed(exc: BaseException) -> bool:
    """Whether ``exc`` (the driver's, or SQLAlchemy's around it) is a commit the standbys
    did not confirm."""
    return isinstance(exc, ReplicationUnconfirmed) or isinstance(
        getattr(exc, "orig", None), ReplicationUnconfirmed
    )


# ------------------------------------------------------------------ the commit's bound


@dataclass(eq=False)
class _Watch:
    """One commit being watched: the token its thread releases."""

    commits: _Commits
    conn: psycopg.Connection[Any]
    deadline: float
    cancelling: bool = False
    cancelled: bool = False


class _Commits:
    """The commits still running, for the process's watchdog (``storage.watchdog``) to
    cancel at their deadline.

    A commit is watched from just before it is sent until its answer is read. The
    watchdog sleeps until the earliest deadline; a commit released before it is never
    touched. A cancel is sent outside the lock, and the commit's thread, done meanwhile,
    waits for it to be delivered before it goes on: a cancel reaching the session after
    its next statement started would cancel that one instead."""

    def __init__(self, watchdog: Watchdog) -> None:
        self.watchdog = watchdog
        self.cond = watchdog.cond
        self.watched: set[_Watch] = set()

    def watch(self, conn: psycopg.Connection[Any], deadline: float) -> _Watch:
        with self.cond:
            watch = _Watch(self, conn, deadline)
            self.watched.add(watch)
            self.watchdog.remind(deadline)
            return watch

    def release(self, watch: _Watch) -> bool:
        """Stop watching; whether the commit was cancelled (once the cancel is sent)."""
        with self.cond:
            self.watched.discard(watch)
            while watch.cancelling:
                self.cond.wait()
            return watch.cancelled

    def due(self, now: float) -> float:
        return min((w.deadline for w in self.watched if not w.cancelled), default=math.inf)

    def tend(self, now: float) -> None:
        with self.cond:
            due = [w for w in self.watched if w.deadline <= now and not w.cancelled]
            for w in due:
                w.cancelling = w.cancelled = True
        for w in due:
            try:
                w.conn.cancel_safe(timeout=_CANCEL_TIMEOUT_S)
            except Exception as exc:  # the server gone: the commit fails by itself
                log.info("cancelling a commit past its bound failed: %s", exc)
        with self.cond:
            for w in due:
                w.cancelling = False
            self.cond.notify_all()


class ReplicatedConnection(psycopg.Connection[Any]):
    """A kip98 session's psycopg connection: each commit bounded and its standbys' word
    checked (``watch_commit``, ``confirm_commit``)."""

    commit_bound_ms: int = 0  # 0: no bound (the session's statement bound, rule 24)
    health: _Health | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.wait_cancelled = False  # the server said so since the last commit
        self.warned = False  # a WARNING (01000) arrived since the last commit
        ref = weakref.ref(self)

        def heard(diag: Diagnostic) -> None:
            me = ref()
            if me is not None and diag.severity_nonlocalized == "WARNING":
                me.warned = me.warned or diag.sqlstate == _WARNING_STATE
                if _WAIT_CANCELLED.search(diag.message_primary or ""):
                    me.wait_cancelled = True

        self.add_notice_handler(heard)

    def commit(self) -> None:
        token = watch_commit(self)
        try:
            super().commit()
        finally:
            cancelled = release_commit(token)
        confirm_commit(self, cancelled)


# A commit is watched on every request's path: two plain calls around it, not a context
# manager's generator (a third of the cost, ~1 µs of ~3).


def watch_commit(conn: psycopg.Connection[Any]) -> _Watch | None:
    """Just before whatever makes ``conn`` commit (``commit()``, or the end of a query
    string that commits itself): watch it, to be cancelled past its bound; the token to
    release after it (None: not watched). A connection not made by a watched engine is
    left alone."""
    if not isinstance(conn, ReplicatedConnection):
        return None
    conn.wait_cancelled = conn.warned = False
    deadline = commit_deadline(conn.commit_bound_ms)
    if deadline is None:
        return None
    return watchdog.current().kind(_Commits).watch(conn, deadline)


def release_commit(token: _Watch | None) -> bool:
    """Stop watching a commit (its answer is in); whether it was cancelled."""
    return token is not None and token.commits.release(token)


def confirm_commit(conn: psycopg.Connection[Any], cancelled: bool) -> None:
    """After the commit: ``ReplicationUnconfirmed`` if the server said its wait for the
    standbys was cancelled (in English; in another language a warning after our own
    cancel can only be that one)."""
    if not isinstance(conn, ReplicatedConnection):
        return
    if conn.wait_cancelled or (cancelled and conn.warned):
        conn.wait_cancelled = conn.warned = False
        if conn.health is not None:
            conn.health.forget()
        raise ReplicationUnconfirmed(
            "the synchronous standbys did not confirm the commit within its bound: "
            "written on the primary, not acknowledged"
        )


def watch_commits(engine: Engine, settings: BrokerSettings) -> Engine:
    """Make ``engine``'s connections ``ReplicatedConnection``s, their commits bounded by
    the session's statement bound (narrowed by a request's deadline), and keep what the
    engine last saw of its standbys (``replicas_short``), forgotten with its connections."""
    bound_ms = session_options(settings)["statement_timeout"]
    health = _health.setdefault(engine, _Health())

    @event.listens_for(engine, "do_connect")
    def _connect(
        _dialect: Any, _record: Any, cargs: tuple[Any, ...], cparams: dict[str, Any]
    ) -> ReplicatedConnection:
        conn = ReplicatedConnection.connect(*cargs, **cparams)
        conn.commit_bound_ms = bound_ms
        conn.health = health
        return conn

    @event.listens_for(engine, "invalidate")
    def _lost(*_: object) -> None:
        health.forget()

    return engine
