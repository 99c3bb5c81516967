"""Failed SASL logins, logged so an operator can act on them without being flooded.

A client with a wrong password retries, librdkafka every few hundred milliseconds: a line
per failure buried the log (three clients, a thousand lines in thirty seconds). Each
failure names its mechanism, the principal it tried (never the password) and the client's
address; per client address (its host: a retry comes from a new port) the first failure
of a window is logged, the others of that window only counted, and the first failure
after the window logs with the count of those left out. What is still counted when the
server stops is logged then (``flush``). The windows are ``app.failure_windows``', which
the console's log-ins share. The clock is given, so tests move it by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.clock import Clock, SystemClock
from app.failure_windows import FailureWindows, printable

# One line per client address at most this often (Kafka logs every failure; a retrying
# client then fills the log).
WINDOW_S = 30.0


@dataclass(frozen=True)
class Failure:
    """One failed login: ``address`` is the client's host and port as Kafka shows it."""

    host: str
    address: str
    mechanism: str | None
    principal: str | None

    def describe(self) -> str:
        who = printable(self.principal) if self.principal else "an unreadable user name"
        return (
            f"SASL authentication failed: {who} by {self.mechanism or 'no mechanism'} "
            f"from {self.address}"
        )


class FailureLog:
    """The lines to log for each failure, at most one per host per ``window_s``."""

    def __init__(self, clock: Clock | None = None, window_s: float = WINDOW_S) -> None:
        self.clock = clock or SystemClock()
        self.window_s = window_s
        self._windows = FailureWindows("SASL authentication failures", window_s)

    def failed(self, failure: Failure) -> list[str]:
        now = self.clock.monotonic()
        lines = self._windows.expired(now)
        if self._windows.first(failure.host, now):
            lines.append(failure.describe())
        return lines

    def flush(self) -> list[str]:
        """The counts not logged yet (the server is stopping)."""
        return self._windows.flush(self.clock.monotonic())

    def due(self) -> list[str]:
        """The windows over now, forgotten, with a line for each that left failures out."""
        return self._windows.expired(self.clock.monotonic())
