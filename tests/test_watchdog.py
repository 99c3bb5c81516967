"""The process's one watchdog thread (storage/watchdog.py): the commits past their bound
(docs/design.md rule 42) and the engines watched for stalled sessions (rule 34) are
tended by the same thread; a forked child starts empty, with its own; an engine
garbage-collected is no longer looked at."""

from __future__ import annotations

import gc
import math
import os
import threading
import time
from collections.abc import Callable

import psycopg
import pytest
from sqlalchemy import create_engine

from app.settings import BrokerSettings
from app.storage import watchdog
from app.storage.driver import libpq_conninfo
from app.storage.replication import _Commits, release_commit
from app.storage.stalls import _Watched, watch_stalls
from app.storage.watchdog import THREAD_NAME, Watchdog

HANG_GUARD_S = 60.0


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not condition():
        assert time.monotonic() < deadline, f"still not {what}"
        time.sleep(0.01)


class _Ticker:
    """A kind looked at every ``period`` seconds, as an engine's stall checks are."""

    def __init__(self, period: float) -> None:
        self.period = period
        self.next_at = 0.0
        self.tended: list[str] = []
        self.gone = False

    def due(self, now: float) -> float | None:
        return None if self.gone else self.next_at

    def tend(self, now: float) -> None:
        self.next_at = now + self.period
        self.tended.append(threading.current_thread().name)


class _Alarms:
    """A kind of many deadlines in one, as the commits are (``Watchdog.kind``)."""

    def __init__(self, dog: Watchdog) -> None:
        self.dog = dog
        self.pending: list[float] = []
        self.rung: list[str] = []

    def set(self, at: float) -> None:
        with self.dog.cond:
            self.pending.append(at)
            self.dog.remind(at)

    def due(self, now: float) -> float:
        return min(self.pending, default=math.inf)

    def tend(self, now: float) -> None:
        with self.dog.cond:
            rung = [at for at in self.pending if at <= now]
            self.pending = [at for at in self.pending if at > now]
        self.rung.extend(threading.current_thread().name for _ in rung)


def test_two_kinds_share_one_thread_and_a_sooner_deadline_wakes_it() -> None:
    dog = Watchdog()
    ticker = _Ticker(period=3600.0)  # looked at once, then not for an hour
    dog.add(ticker)
    _until(lambda: len(ticker.tended) == 1, "tended")
    alarms = dog.kind(_Alarms)
    assert dog.kind(_Alarms) is alarms
    alarms.set(time.monotonic() + 0.05)  # sooner than the thread's sleep
    _until(lambda: len(alarms.rung) == 1, "rung")
    assert ticker.tended == alarms.rung == [THREAD_NAME]
    assert dog.thread is not None and dog.thread.name == THREAD_NAME
    ticker.gone = True  # its owner gone: dropped at the next round
    alarms.set(time.monotonic())
    _until(lambda: ticker not in dog.watched, "dropped")
    assert dog.watched == [alarms]


def test_a_forked_child_starts_with_an_empty_watchdog_of_its_own() -> None:
    parent = watchdog.current()
    parent.add(_Ticker(period=3600.0))
    pid = os.fork()
    if pid == 0:  # the child: only os._exit leaves it, with what it found
        code = 1
        try:
            child = watchdog.current()
            fresh = child is not parent and child.watched == [] and child.thread is None
            ticker = _Ticker(period=0.01)
            child.add(ticker)
            deadline = time.monotonic() + HANG_GUARD_S
            while len(ticker.tended) < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            code = 0 if fresh and len(ticker.tended) >= 3 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_commits_and_engines_are_tended_by_the_same_thread(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both real kinds: a statement watched past its deadline is cancelled, and an engine
    watched for stalls is dropped once garbage-collected."""
    tended_by: dict[str, set[int | None]] = {"commits": set(), "stalls": set()}
    for kind, cls in (("commits", _Commits), ("stalls", _Watched)):

        def tend(self: object, now: float, _kind: str = kind, _tend=cls.tend) -> None:  # type: ignore[no-untyped-def]
            tended_by[_kind].add(threading.get_ident())
            _tend(self, now)

        monkeypatch.setattr(cls, "tend", tend)
    settings = BrokerSettings.from_env()
    assert settings.db_idle_in_transaction_timeout_ms > 0
    engine = create_engine(db_url)
    watch_stalls(engine, settings)
    dog = watchdog.current()

    def watched_engines() -> list[_Watched]:
        with dog.cond:
            return [w for w in dog.watched if isinstance(w, _Watched)]

    assert any(w.engine() is engine for w in watched_engines())
    with psycopg.connect(libpq_conninfo(db_url)) as conn:
        token = dog.kind(_Commits).watch(conn, time.monotonic() + 0.2)
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute("SELECT pg_sleep(60)")
        assert release_commit(token)
    assert dog.thread is not None
    assert tended_by == {"commits": {dog.thread.ident}, "stalls": {dog.thread.ident}}
    engine.dispose()
    del engine
    gc.collect()
    _until(lambda: all(w.engine() is not None for w in watched_engines()), "dropped")
