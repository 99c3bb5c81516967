"""The key that signs the console's session cookies, kept across restarts.

A key drawn at each start logged every user out when the console restarted, and two
console processes behind one address could not read each other's cookies. The key is
``KIP98_CONSOLE_SECRET`` when set (every process given the same value shares sessions),
else the file ``KIP98_HOME/console-secret``, made once with mode 0600 (the processes of
one home share it). Rotating it (a new value, or deleting the file) logs everyone out.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

ENV = "KIP98_CONSOLE_SECRET"
FILE_NAME = "console-secret"
MIN_LENGTH = 32  # characters: a shorter secret can be guessed offline from one cookie


class SecretError(Exception):
    """The configured secret cannot be used (too short, or its file readable by others)."""


def session_key(home: Path, environ: dict[str, str] | None = None) -> str:
    """The session key: the setting, else the file under ``home`` (created if absent)."""
    env = os.environ if environ is None else environ
    configured = env.get(ENV)
    if configured is not None:
        if len(configured) < MIN_LENGTH:
            raise SecretError(f"{ENV} must be at least {MIN_LENGTH} characters")
        return configured
    return _from_file(home / FILE_NAME)


def _from_file(path: Path) -> str:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.exists():
        # Written whole to a private temporary file, then linked into place: a second
        # console starting at the same moment either links first or reads the winner's.
        tmp = path.with_name(f".{FILE_NAME}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
        finally:
            tmp.unlink(missing_ok=True)
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SecretError(
            f"{path} is readable by others (mode {stat.S_IMODE(mode):o}): chmod 600 it"
        )
    key = path.read_text().strip()
    if len(key) < MIN_LENGTH:
        raise SecretError(f"{path} holds fewer than {MIN_LENGTH} characters: delete it")
    return key
