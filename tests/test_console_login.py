"""The console's session key kept across restarts (app/console/secret.py) and its failed
log-ins locked out and logged (app/console/lockout.py), with the clock moved by hand."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from app.clock import ManualClock
from app.console.lockout import LoginThrottle
from app.console.secret import ENV, SecretError, session_key


def test_the_session_key_is_made_once_and_kept_private(tmp_path: Path) -> None:
    home = tmp_path / "home"
    key = session_key(home, {})
    assert len(key) >= 32
    path = home / "console-secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert session_key(home, {}) == key  # a restart, or a second console of this home
    os.chmod(path, 0o644)
    with pytest.raises(SecretError, match="readable by others"):
        session_key(home, {})


def test_the_session_key_from_the_setting(tmp_path: Path) -> None:
    assert session_key(tmp_path, {ENV: "k" * 40}) == "k" * 40
    assert not (tmp_path / "console-secret").exists()
    with pytest.raises(SecretError, match="at least 32"):
        session_key(tmp_path, {ENV: "short"})


def test_repeated_failures_lock_the_host_and_the_user_out_for_a_while() -> None:
    clock = ManualClock(0)
    t = LoginThrottle(clock, max_failures=3, window_s=60, lockout_s=120, log_window_s=30)
    lines: list[str] = []
    for _ in range(2):
        lines += t.failed("10.0.0.1", "10.0.0.1:5000", "alice")
        clock.advance(1000)
    assert t.locked_for("10.0.0.1", "alice") == 0
    lines += t.failed("10.0.0.1", "10.0.0.1:5001", "alice")
    assert t.locked_for("10.0.0.1", "alice") == 120
    assert t.locked_for("10.0.0.2", "alice") == 120  # the user, from anywhere
    assert t.locked_for("10.0.0.1", "bob") == 120  # the host, for any user
    assert t.locked_for("10.0.0.2", "bob") == 0
    # One line for the first failure of the window, then the lockouts (host and user).
    assert lines[0] == "console log-in failed: user 'alice' from 10.0.0.1:5000"
    assert sum("locked for 120 s" in line for line in lines) == 2
    assert len(lines) == 3
    clock.advance(119_000)
    assert 0 < t.locked_for("10.0.0.1", "alice") <= 1
    more = t.failed("10.0.0.1", "10.0.0.1:5002", "alice", locked=True)  # refused, not counted
    # The window's count, over its true length, as kip98 serve counts its SASL failures.
    assert (
        "2 more console log-in failures from 10.0.0.1 in the last 121 s (not logged one by one)"
        in more
    )
    clock.advance(1000)
    assert t.locked_for("10.0.0.1", "alice") == 0
    # Failures further apart than the window do not add up.
    for _ in range(5):
        t.failed("10.0.0.3", "10.0.0.3:1", "carol")
        clock.advance(61_000)
    assert t.locked_for("10.0.0.3", "carol") == 0


def test_a_right_password_forgets_the_failures_and_names_are_printable() -> None:
    clock = ManualClock(0)
    t = LoginThrottle(clock, max_failures=2, window_s=60, lockout_s=60)
    t.failed("h", "h:1", "dave")
    t.succeeded("h", "dave")
    t.failed("h", "h:2", "dave")
    assert t.locked_for("h", "dave") == 0
    clock.advance(31_000)
    (line,) = [x for x in t.failed("h2", "h2:1", "eve\nforged line") if "eve" in x]
    assert "\n" not in line and "eve\\nforged line" in line
    assert t.flush() == []
