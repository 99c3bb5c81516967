"""The log lines of failed SASL logins (``app.server.auth_failures``), on a clock moved by
hand: one line per client host per window, the others counted and reported."""

from __future__ import annotations

from app.clock import ManualClock
from app.server.auth_failures import Failure, FailureLog


def _failure(host: str = "/10.0.0.1", port: int = 5000, user: str | None = "User:alice") -> Failure:
    return Failure(host, f"{host}:{port}", "SCRAM-SHA-256", user)


def test_the_first_failure_of_a_host_is_logged_whole() -> None:
    log = FailureLog(ManualClock(), window_s=30)
    [line] = log.failed(_failure())
    assert line == "SASL authentication failed: User:alice by SCRAM-SHA-256 from /10.0.0.1:5000"
    # Another host has its own window.
    assert log.failed(_failure("/10.0.0.2")) == [
        "SASL authentication failed: User:alice by SCRAM-SHA-256 from /10.0.0.2:5000"
    ]
    assert "an unreadable user name" in log.failed(_failure("/10.0.0.3", user=None))[0]
    # A name a client chose cannot forge a line of its own, nor fill one.
    [forged] = log.failed(_failure("/10.0.0.4", user="User:x\nINFO all is well"))
    assert "\n" not in forged and "User:x\\nINFO all is well" in forged
    [long] = log.failed(_failure("/10.0.0.5", user="User:" + "a" * 10_000))
    assert len(long) < 400


def test_failures_within_a_window_are_counted_and_reported_after_it() -> None:
    clock = ManualClock()
    log = FailureLog(clock, window_s=30)
    lines = [line for port in range(1000) for line in log.failed(_failure(port=port))]
    assert len(lines) == 1  # a thousand failures in one window: one line
    clock.advance(29_999)
    assert log.due() == []
    clock.advance(1)
    assert log.due() == [
        "999 more SASL authentication failures from /10.0.0.1 in the last 30 s "
        "(not logged one by one)"
    ]
    assert log.due() == []  # reported once
    # The window is over: the next failure is logged whole again and opens a new one.
    assert len(log.failed(_failure(port=1))) == 1
    assert log.failed(_failure(port=2)) == []
    clock.advance(45_000)
    # A failure after the window carries the count of the window before it.
    summary, whole = log.failed(_failure(port=3))
    assert summary.startswith("1 more SASL authentication failures from /10.0.0.1 in the last 45 s")
    assert whole.endswith("from /10.0.0.1:3")


def test_what_is_left_out_is_logged_when_the_server_stops() -> None:
    clock = ManualClock()
    log = FailureLog(clock, window_s=30)
    for port in range(3):
        log.failed(_failure(port=port))
    log.failed(_failure("/10.0.0.9"))
    clock.advance(5_000)
    assert log.flush() == [
        "2 more SASL authentication failures from /10.0.0.1 in the last 5 s (not logged one by one)"
    ]
    assert log.flush() == []
