"""Failed log-ins logged per client host without flooding the log.

A client with a wrong password retries, librdkafka every few hundred milliseconds, a
guesser over HTTP as fast as it likes: a line per failure buries the log. Per client host
(a retry comes from a new port) the first failure of a window is logged whole, the others
of that window only counted, and the count logged as one line once the window is over or
the process stops. ``kip98 serve``'s SASL log-ins (``app.server.auth_failures``) and the
console's (``app.console.lockout``) both keep their lines this way; the two sit beside
each other in the layers, so the bookkeeping is here, below both. Pure: the caller gives
the time (its clock's ``monotonic``), so tests move it by hand.
"""

from __future__ import annotations

from dataclasses import dataclass


def printable(name: str, most: int = 200) -> str:
    """A name a client chose, fit for one log line: control characters escaped (a newline
    would forge a line), cut at ``most`` characters."""
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in name[:most])
    return shown + ("…" if len(name) > most else "")


@dataclass
class _Window:
    started: float
    left_out: int = 0


class FailureWindows:
    """At most one whole line per host per ``window_s``; ``what`` names the failures in
    the line that counts those left out ("SASL authentication failures")."""

    def __init__(self, what: str, window_s: float) -> None:
        self.what = what
        self.window_s = window_s
        self._windows: dict[str, _Window] = {}

    def first(self, host: str, now: float) -> bool:
        """Whether a failure from ``host`` opens a window (log it whole); if not, it is
        counted in the window open."""
        window = self._windows.get(host)
        if window is not None:
            window.left_out += 1
            return False
        self._windows[host] = _Window(now)
        return True

    def expired(self, now: float) -> list[str]:
        """The windows over at ``now``, forgotten, with a line for each that left
        failures out."""
        over = [h for h, w in self._windows.items() if now - w.started >= self.window_s]
        return [
            line for host in over if (line := self._summary(host, now, self._windows.pop(host)))
        ]

    def flush(self, now: float) -> list[str]:
        """Every window forgotten, with a line for each that left failures out (the
        process is stopping)."""
        lines = [line for h, w in self._windows.items() if (line := self._summary(h, now, w))]
        self._windows.clear()
        return lines

    def _summary(self, host: str, now: float, window: _Window) -> str | None:
        if not window.left_out:
            return None
        return (
            f"{window.left_out} more {self.what} from {host} "
            f"in the last {now - window.started:.0f} s (not logged one by one)"
        )
