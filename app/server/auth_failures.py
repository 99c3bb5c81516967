"""Failed SASL logins, logged so an operator can act on them without being flooded.

A client with a wrong password retries, librdkafka every few hundred milliseconds: a line
per failure buried the log (three clients, a thousand lines in thirty seconds). Each
failure names its mechanism, the principal it tried (never the password) and the client's
address; per client address (its host: a retry comes from a new port) the first failure
of a window is logged, the others of that window only counted, and the first failure
after the window logs with the count of those left out. What is still counted when the
server stops is logged then (``flush``). The clock is given, so tests move it by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.clock import Clock, SystemClock

# One line per client address at most this often (Kafka logs every failure; a retrying
# client then fills the log).
WINDOW_S = 30.0


@dataclass
class _Window:
    started: float
    left_out: int = 0


@dataclass(frozen=True)
class Failure:
    """One failed login: ``address`` is the client's host and port as Kafka shows it."""

    host: str
    address: str
    mechanism: str | None
    principal: str | None

    def describe(self) -> str:
        who = _printable(self.principal) if self.principal else "an unreadable user name"
        return (
            f"SASL authentication failed: {who} by {self.mechanism or 'no mechanism'} "
            f"from {self.address}"
        )


def _printable(name: str, most: int = 200) -> str:
    """A name a client chose, fit for one log line: control characters escaped (a newline
    would forge a line), cut at ``most`` characters."""
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in name[:most])
    return shown + ("…" if len(name) > most else "")


class FailureLog:
    """The lines to log for each failure, at most one per host per ``window_s``."""

    def __init__(self, clock: Clock | None = None, window_s: float = WINDOW_S) -> None:
        self.clock = clock or SystemClock()
        self.window_s = window_s
        self._windows: dict[str, _Window] = {}

    def failed(self, failure: Failure) -> list[str]:
        now = self.clock.monotonic()
        lines = self._expired(now)
        window = self._windows.get(failure.host)
        if window is not None:
            window.left_out += 1
            return lines
        self._windows[failure.host] = _Window(now)
        return [*lines, failure.describe()]

    def flush(self) -> list[str]:
        """The counts not logged yet (the server is stopping)."""
        now = self.clock.monotonic()
        lines = [self._summary(h, w, now) for h, w in self._windows.items() if w.left_out]
        self._windows.clear()
        return lines

    def due(self) -> list[str]:
        """The windows over now, forgotten, with a line for each that left failures out."""
        return self._expired(self.clock.monotonic())

    def _expired(self, now: float) -> list[str]:
        over = [h for h, w in self._windows.items() if now - w.started >= self.window_s]
        lines = []
        for host in over:
            window = self._windows.pop(host)
            if window.left_out:
                lines.append(self._summary(host, window, now))
        return lines

    def _summary(self, host: str, window: _Window, now: float) -> str:
        return (
            f"{window.left_out} more SASL authentication failures from {host} "
            f"in the last {now - window.started:.0f} s (not logged one by one)"
        )
