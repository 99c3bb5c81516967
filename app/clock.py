"""Time, injectable: handlers and loops ask a Clock, so tests move time instead of sleeping."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int: ...

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class ManualClock:
    """A clock that only moves when told to; ``sleep`` advances it instead of blocking."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._ms = start_ms
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        with self._lock:
            return self._ms

    def monotonic(self) -> float:
        return self.now_ms() / 1000.0

    def advance(self, ms: int) -> None:
        with self._lock:
            self._ms += ms

    def sleep(self, seconds: float) -> None:
        self.advance(int(seconds * 1000))


SYSTEM_CLOCK = SystemClock()
