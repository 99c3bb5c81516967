"""``kip98 serve`` as a child process on a port of this host, for whoever drives Kafka
clients against it from Python: started and waited for until it accepts connections,
stopped by SIGTERM, killed outright, and started again on the same port.

The child runs the ``app`` this process imported (its directory first on PYTHONPATH),
so a checkout's server is the one measured or tested, not whatever is installed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import IO

import app

HOST = "127.0.0.1"


def free_port(host: str = HOST) -> int:
    """A port nothing listens on now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class ServeProcess:
    """``args``: more of ``kip98 serve``'s options (``--listen`` is given); ``env``: more
    of its environment; ``stderr``: where its log goes (this process's stderr if None)."""

    def __init__(
        self,
        database_url: str,
        port: int | None = None,
        host: str = HOST,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        scheme: str | None = None,
        stderr: IO[bytes] | None = None,
    ) -> None:
        self.database_url = database_url
        self.scheme = scheme
        self.env = env or {}
        self.host = host
        self.port = port or free_port(host)
        self.args = args
        self.stderr = stderr
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        """The clients' ``bootstrap.servers``."""
        return f"{self.host}:{self.port}"

    @property
    def listener(self) -> str:
        """What ``--listen`` is given: the address, with its scheme if one was asked for."""
        return f"{self.scheme}://{self.address}" if self.scheme else self.address

    def start(self, timeout: float = 30) -> None:
        """Start the server and return once it accepts connections."""
        root = str(Path(app.__file__).resolve().parents[1])
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.server", "--listen", self.listener, *self.args],
            env={
                **os.environ,
                **self.env,
                "KIP98_DATABASE_URL": self.database_url,
                "PYTHONPATH": path,
            },
            stderr=self.stderr,
        )
        self._wait_listening(timeout)

    def _wait_listening(self, timeout: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kip98 serve exited with {self.proc.returncode}")
            try:
                socket.create_connection((self.host, self.port), 0.2).close()
                return
            except OSError:
                time.sleep(0.02)
        self.kill()
        raise TimeoutError(f"kip98 serve did not listen on {self.address} within {timeout} s")

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM, then the exit status (0 when it stopped cleanly); killed if it has not
        stopped within ``timeout``."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL: the server dies mid-request, its connections reset."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self, timeout: float = 30) -> None:
        """SIGKILL, then a new server on the same port."""
        self.kill()
        self.start(timeout)

    def __enter__(self) -> ServeProcess:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.stop()
        finally:
            self.kill()
