"""Failed console log-ins: slowed to a stop for a while, and logged without flooding.

A password guessed over HTTP costs the guesser nothing, so after ``MAX_FAILURES`` failed
log-ins within ``WINDOW_S`` from one client host, or for one user name, that host or
user is locked out for ``LOCKOUT_S``: the log-in answers 429 with Retry-After and no
password is checked, not even a right one. Keying by user as well stops a guesser who
moves between hosts; the price is that anyone can lock a user out of the console (not
out of Kafka's SASL log-ins, which this does not touch) for ``LOCKOUT_S`` at a time.

Each failure is logged as ``kip98 serve`` logs a failed SASL log-in (the user tried,
never the password, and the client's address): the first of a window per host, the rest
of it counted and logged as a number when the window is over, in the windows
(``app.failure_windows``) that ``kip98 serve``'s ``FailureLog`` keeps too; the console
adds the lockout. The clock is given, so tests move it by hand. Pure bookkeeping: no I/O.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from app.clock import Clock, SystemClock
from app.failure_windows import FailureWindows, printable

MAX_FAILURES = 5
WINDOW_S = 600.0
LOCKOUT_S = 300.0
LOG_WINDOW_S = 30.0  # one line per client host at most this often, as serve's
_MOST_KEYS = 100_000  # a flood of made-up user names is forgotten, not kept


@dataclass
class _Key:
    failures: deque[float] = field(default_factory=deque)
    locked_until: float = 0.0


class LoginThrottle:
    def __init__(
        self,
        clock: Clock | None = None,
        max_failures: int = MAX_FAILURES,
        window_s: float = WINDOW_S,
        lockout_s: float = LOCKOUT_S,
        log_window_s: float = LOG_WINDOW_S,
    ) -> None:
        self.clock = clock or SystemClock()
        self.max_failures = max_failures
        self.window_s = window_s
        self.lockout_s = lockout_s
        self.log_window_s = log_window_s
        self._keys: dict[tuple[str, str], _Key] = {}
        self._logged = FailureWindows("console log-in failures", log_window_s)

    def locked_for(self, host: str, user: str) -> float:
        """Seconds before ``host`` and ``user`` may try again (0: now)."""
        now = self.clock.monotonic()
        left = [
            k.locked_until - now
            for k in (self._keys.get(("host", host)), self._keys.get(("user", user)))
            if k is not None
        ]
        return max([0.0, *left])

    def failed(self, host: str, address: str, user: str, locked: bool = False) -> list[str]:
        """Count a failed log-in (or one refused while ``locked``); the lines to log."""
        now = self.clock.monotonic()
        lines = self._logged.expired(now)
        if not locked:
            for key in (("host", host), ("user", user)):
                lines += self._count(key, now)
        who = f"user '{printable(user)}'" if user else "no user name"
        what = "refused (locked out)" if locked else "failed"
        if self._logged.first(host, now):
            lines.insert(0, f"console log-in {what}: {who} from {address}")
        return lines

    def succeeded(self, host: str, user: str) -> None:
        """A right password: the user's and the host's failures are forgotten."""
        self._keys.pop(("host", host), None)
        self._keys.pop(("user", user), None)

    def due(self) -> list[str]:
        """The log windows over now, with a line for each that left failures out."""
        return self._logged.expired(self.clock.monotonic())

    def flush(self) -> list[str]:
        """The counts not logged yet (the console is stopping)."""
        return self._logged.flush(self.clock.monotonic())

    def _count(self, key: tuple[str, str], now: float) -> list[str]:
        if len(self._keys) >= _MOST_KEYS and key not in self._keys:
            self._forget(now)
        k = self._keys.setdefault(key, _Key())
        k.failures.append(now)
        while k.failures and now - k.failures[0] >= self.window_s:
            k.failures.popleft()
        if len(k.failures) < self.max_failures:
            return []
        k.failures.clear()
        k.locked_until = now + self.lockout_s
        kind, name = key
        shown = f"user '{printable(name)}'" if kind == "user" else f"host {name}"
        return [
            f"console log-in locked for {self.lockout_s:.0f} s: {shown} after "
            f"{self.max_failures} failures in {self.window_s:.0f} s"
        ]

    def _forget(self, now: float) -> None:
        stale = [
            key
            for key, k in self._keys.items()
            if k.locked_until <= now and (not k.failures or now - k.failures[-1] >= self.window_s)
        ]
        for key in stale:
            del self._keys[key]
        if len(self._keys) >= _MOST_KEYS:  # all live: the oldest go
            for key in list(self._keys)[: _MOST_KEYS // 10]:
                del self._keys[key]
