"""The one watchdog thread of a process: whatever must be looked at on time, whatever the
requests do, registers here (the commits past their bound, ``replication``; the sessions
that stall ours, ``stalls``; docs/design.md rules 34, 42).

A watched thing says when it next wants the thread (``due``) and does what is due
(``tend``); the thread sleeps until the earliest due time and is woken when something
new is due sooner (``remind``). ``due`` runs under the watchdog's lock, so it must only
look; ``tend`` runs outside it, one at a time, the most overdue first. The work a
``tend`` does is bounded (a commit's cancel, a check's connection and statement, 5 s
each), so one slow look delays the others by at most that. A watched thing whose owner is
gone (an engine garbage-collected) answers None and is dropped.

A forked child has none of its parent's threads, and the lock may have been held by one
of them at the fork: it gets a fresh watchdog, empty, whose thread starts when something
registers (``current``).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

log = logging.getLogger(__name__)

THREAD_NAME = "kip98-watchdog"


class Watched(Protocol):
    def due(self, now: float) -> float | None:
        """When it next wants the thread (``time.monotonic``; ``math.inf``: not until
        reminded), or None once it is gone. Called with the watchdog's lock held."""
        ...

    def tend(self, now: float) -> None:
        """Do what is due at ``now``. Called on the watchdog's thread, its lock free."""
        ...


W = TypeVar("W", bound=Watched)


class Watchdog:
    """One thread tending every registered ``Watched``; ``cond`` is the lock they share."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.watched: list[Watched] = []
        self.kinds: dict[Callable[[Watchdog], Watched], Watched] = {}
        self.thread: threading.Thread | None = None
        self.wake_at = math.inf

    def add(self, watched: Watched) -> None:
        """Tend ``watched`` from now on, first when it is due."""
        with self.cond:
            self.watched.append(watched)
            self._running()
            self.cond.notify_all()

    def kind(self, cls: Callable[[Watchdog], W]) -> W:
        """The one ``cls(self)`` of this watchdog, registered at its first use: a kind
        that keeps many watched things in one, as the commits do."""
        found = self.kinds.get(cls)
        if found is None:
            with self.cond:
                found = self.kinds.get(cls)
                if found is None:
                    found = self.kinds[cls] = cls(self)
                    self.watched.append(found)
                    self._running()
        return found  # type: ignore[return-value]

    def remind(self, at: float) -> None:
        """Something is due at ``at``: wake the thread if it sleeps past it. Call with
        ``cond`` held."""
        if self.thread is None:
            self._running()
        if at < self.wake_at:
            self.cond.notify_all()

    def _running(self) -> None:
        if self.thread is None or not self.thread.is_alive():
            self.thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
            self.thread.start()

    def _due(self, now: float) -> list[Watched]:
        """The watched things due at ``now``, the most overdue first; drops those gone and
        sets ``wake_at`` to the next due time of the others."""
        kept: list[Watched] = []
        due: list[tuple[float, int, Watched]] = []
        wake = math.inf
        for i, w in enumerate(self.watched):
            at = w.due(now)
            if at is None:
                continue
            kept.append(w)
            if at <= now:
                due.append((at, i, w))
            else:
                wake = min(wake, at)
        self.watched = kept
        self.wake_at = wake
        return [w for _, _, w in sorted(due, key=lambda d: (d[0], d[1]))]

    def _run(self) -> None:
        while True:
            with self.cond:
                now = time.monotonic()
                due = self._due(now)
                if not due:
                    wake = self.wake_at
                    self.cond.wait(None if wake == math.inf else wake - now)
                    self.wake_at = -math.inf  # awake: every new due time is seen next round
                    continue
            for w in due:
                try:
                    w.tend(time.monotonic())  # fresh: the ones before may have taken time
                except Exception:  # one kind's failure must not stop the others
                    log.exception("the watchdog's look at %r failed", w)


_current = Watchdog()


def current() -> Watchdog:
    """This process's watchdog."""
    return _current


def _after_fork() -> None:
    global _current
    _current = Watchdog()


os.register_at_fork(after_in_child=_after_fork)
