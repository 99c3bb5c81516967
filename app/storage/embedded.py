"""The embedded PostgreSQL: a private server (one data directory) under ``KIP98_HOME``,
started on demand.

Why it looks the way it does:

- PostgreSQL refuses to run as root, so when we are root the server (initdb, pg_ctl, the
  postmaster) runs as an unprivileged system user; everything else stays root's.
- Spark's JDBC driver needs TCP, so the server listens on 127.0.0.1 on a free port; a
  private socket directory keeps it off the system's ``/var/run/postgresql``.
- Several processes may call ``start()`` at once (tests, CLI, clients); an exclusive
  ``flock`` on ``KIP98_HOME/lock`` makes exactly one of them start the server.
- A crash leaves ``postmaster.pid`` behind; its pid may since belong to another process.
  We treat the file as stale unless that pid is a live postmaster for *our* data directory.
- A replicated embedded database (``storage.replica_set``) is several such servers, one per
  node directory under ``KIP98_HOME``; this class is one node, and knows the operations
  on one node that replication needs (a base backup, a rewind, a promotion, a reload).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import pwd
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SUPERUSER = "kip98"
DATABASE = "kip98"
_SERVER_USER_CANDIDATES = ("postgres", "kip98")
_START_TIMEOUT_S = 60
# How long a start keeps trying the port clients hold before taking a fresh one.
_SAME_PORT_RETRY_S = 5.0


class EmbeddedError(RuntimeError):
    """The embedded server could not be set up, started or stopped (message says why)."""


@dataclass(frozen=True)
class ServerStatus:
    running: bool
    pid: int | None
    port: int | None
    data_dir: Path
    url: str | None


def kip98_home() -> Path:
    return Path(os.environ.get("KIP98_HOME", "./.kip98")).resolve()


def _pg_bindir() -> Path:
    """Find initdb/pg_ctl: PATH first, then Debian's versioned directories (newest first)."""
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    root = Path("/usr/lib/postgresql")
    if root.is_dir():
        versions = sorted(
            (p for p in root.iterdir() if (p / "bin" / "pg_ctl").exists()),
            key=lambda p: int(p.name) if p.name.isdigit() else 0,
            reverse=True,
        )
        if versions:
            return versions[0] / "bin"
    raise EmbeddedError(
        "PostgreSQL server binaries (pg_ctl, initdb) not found; run scripts/setup "
        "or set KIP98_DATABASE_URL to an existing server"
    )


class EmbeddedPostgres:
    """One server (data directory) per ``home``; all methods are safe to call from concurrent processes.

    ``node``: a further node of a replicated embedded database, in ``home/node`` (the
    first node is ``home`` itself, as a database without standbys has always been).
    ``settings``: server settings written after the defaults (replication's), each start.
    """

    def __init__(
        self,
        home: Path | None = None,
        node: str | None = None,
        settings: dict[str, str] | None = None,
        port: int | None = None,
    ) -> None:
        self.home = (home or kip98_home()).resolve()
        self.node_dir = self.home if node is None else self.home / node
        self.data_dir = self.node_dir / "pgdata"
        self.lock_path = self.node_dir / "lock"
        self.settings = dict(settings or {})
        self.port_hint = port  # the port to start on, while free (the replica set remembers it)

    # ----------------------------------------------------------------- identity
    def _server_user(self) -> pwd.struct_passwd | None:
        """None when we are not root (the server then runs as ourselves)."""
        if os.geteuid() != 0:
            return None
        for name in _SERVER_USER_CANDIDATES:
            with contextlib.suppress(KeyError):
                return pwd.getpwnam(name)
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "kip98"],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam("kip98")

    def _run(self, args: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        user = self._server_user()
        kwargs: dict[str, object] = {}
        if user is not None:
            kwargs = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
        if user is not None:
            env["HOME"] = user.pw_dir
        proc = subprocess.run(
            args,
            capture_output=True,
            text=True,
            env=env,
            cwd="/",
            **kwargs,  # type: ignore[call-overload]
        )
        if check and proc.returncode != 0:
            raise EmbeddedError(
                f"{Path(args[0]).name} failed: {(proc.stderr or proc.stdout).strip()}"
            )
        return proc

    def _chown(self, path: Path) -> None:
        user = self._server_user()
        if user is not None:
            os.chown(path, user.pw_uid, user.pw_gid)

    def _server_can_use(self, path: Path) -> bool:
        if self._server_user() is None:
            return True
        return (
            self._run(["test", "-w", str(path), "-a", "-x", str(path)], check=False).returncode == 0
        )

    # ----------------------------------------------------------------- layout
    def _locked(self) -> contextlib.AbstractContextManager[None]:
        self.node_dir.mkdir(parents=True, exist_ok=True)
        return file_lock(self.lock_path)

    def _prepare_dirs(self) -> None:
        """Create the data and socket directories where the server user can reach them.

        A checkout under a private home (``/root``) is not reachable by the server user;
        the data directory then lives in ``/var/tmp`` and ``KIP98_HOME/pgdata`` links to it.
        """
        if self.data_dir.is_symlink() and not self.data_dir.exists():
            self.data_dir.unlink()  # its directory was deleted (a node's machine lost)
        if self.data_dir.exists() or self.data_dir.is_symlink():
            return
        self.node_dir.mkdir(parents=True, exist_ok=True)
        base = self.node_dir / "server"
        base.mkdir(exist_ok=True)
        self._chown(base)
        if not self._server_can_use(base):
            base.rmdir()
            digest = hashlib.sha1(str(self.node_dir).encode()).hexdigest()[:12]
            base = Path("/var/tmp") / f"kip98-{digest}"
            base.mkdir(mode=0o700, exist_ok=True)
            self._chown(base)
        (base / "pgdata").mkdir(mode=0o700, exist_ok=True)
        self._chown(base / "pgdata")
        (base / "run").mkdir(mode=0o700, exist_ok=True)
        self._chown(base / "run")
        if base != self.node_dir / "server":
            self.data_dir.symlink_to(base / "pgdata")
        else:
            self.data_dir.symlink_to(Path("server") / "pgdata")

    @property
    def _socket_dir(self) -> Path:
        return self.data_dir.resolve().parent / "run"

    @property
    def _log_file(self) -> Path:
        return self.data_dir.resolve().parent / "postgres.log"

    def _initdb(self) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            return
        bindir = _pg_bindir()
        self._run(
            [
                str(bindir / "initdb"),
                "-D",
                str(self.data_dir.resolve()),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                "--no-locale",
                "--no-sync",
            ]
        )
        conf = self.data_dir / "postgresql.conf"
        user = self._server_user()
        with open(conf, "a") as fh:
            fh.write("\ninclude_if_exists = 'kip98.conf'\n")
        if user is not None:
            os.chown(conf, user.pw_uid, user.pw_gid)

    def _write_settings(self, port: int) -> None:
        settings = {
            "port": str(port),
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self._socket_dir}'",
            "max_connections": "300",
            "shared_buffers": "'256MB'",
            "max_wal_size": "'2GB'",
            "logging_collector": "off",
            "log_min_messages": "warning",
            "lc_messages": "'C'",
        }
        if os.environ.get("KIP98_EMBEDDED_DURABILITY", "on") == "off":
            # For throwaway test servers only: crash safety of the OS is not needed there.
            settings.update(fsync="off", synchronous_commit="off", full_page_writes="off")
        settings.update(self.settings)
        path = self.data_dir / "kip98.conf"
        path.write_text("".join(f"{k} = {v}\n" for k, v in settings.items()))
        self._chown(path)

    def _previous_port(self) -> int | None:
        """The port of the last start, if still free: URLs handed out before a restart
        (a crash, ``restart_immediate``) keep working."""
        if self.port_hint is not None:
            return self.port_hint if _port_is_free(self.port_hint) else None
        try:
            text = (self.data_dir / "kip98.conf").read_text()
        except OSError:
            return None
        for line in text.splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "port" and value.strip().isdigit():
                port = int(value.strip())
                return port if _port_is_free(port) else None
        return None

    # ----------------------------------------------------------------- state
    def _postmaster_pid(self) -> tuple[int, int] | None:
        """(pid, port) from postmaster.pid if a live postmaster for this data directory owns it."""
        pidfile = self.data_dir / "postmaster.pid"
        try:
            lines = pidfile.read_text().splitlines()
        except (FileNotFoundError, PermissionError, NotADirectoryError):
            return None
        if len(lines) < 4 or not lines[0].strip().isdigit():
            return None
        pid, port = int(lines[0]), int(lines[3])
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        exe = Path(cmdline[0].decode(errors="replace")).name if cmdline else ""
        if exe not in ("postgres", "postmaster"):
            return None
        return pid, port

    def _clear_stale_pidfile(self) -> None:
        pidfile = self.data_dir / "postmaster.pid"
        if pidfile.exists() and self._postmaster_pid() is None:
            pidfile.unlink()

    def url_for(self, port: int, database: str = DATABASE) -> str:
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{port}/{database}"

    def status(self) -> ServerStatus:
        found = self._postmaster_pid()
        if found is None:
            return ServerStatus(False, None, None, self.data_dir, None)
        pid, port = found
        return ServerStatus(True, pid, port, self.data_dir, self.url_for(port))

    # ----------------------------------------------------------------- control
    def start(self) -> ServerStatus:
        """Start the server unless it runs; returns its status. Idempotent, concurrent-safe."""
        current = self.status()
        if current.running and self._ready(current.port):
            return current
        with self._locked():
            current = self.status()
            if current.running:
                self._wait_ready(current.port)
                self._ensure_database(current.port)
                return current
            self._prepare_dirs()
            self._initdb()
            self._clear_stale_pidfile()
            log = self._log_file
            if not log.exists():
                log.touch()
                self._chown(log)
            previous = self._previous_port()
            if previous is None:
                port = self._pg_ctl_start(_free_port(), log)
            else:
                port = self._start_on(previous, log)
            self._wait_ready(port)
            self._ensure_database(port)
            return self.status()

    def _start_on(self, previous: int, log: Path) -> int:
        """Start on the port clients already hold, trying again for a few seconds: just
        after a crash stop the port may be briefly taken (the old server's last processes
        exiting, a client's connection given that port as its own). Orphans of a killed
        postmaster can hold the shared memory keyed by the old port until they notice;
        past the retries a fresh port starts at once instead."""
        deadline = time.monotonic() + _SAME_PORT_RETRY_S
        while True:
            try:
                return self._pg_ctl_start(previous, log)
            except EmbeddedError:
                self._clear_stale_pidfile()
                if time.monotonic() >= deadline:
                    return self._pg_ctl_start(_free_port(), log)
                time.sleep(0.25)

    def _pg_ctl_start(self, port: int, log: Path) -> int:
        self._write_settings(port)
        self._run(
            [str(_pg_bindir() / "pg_ctl"), "start", "-w", "-t", str(_START_TIMEOUT_S),
             "-D", str(self.data_dir.resolve()), "-l", str(log)]
        )  # fmt: skip
        return port

    def stop(self) -> bool:
        """Stop the server (fast shutdown); False when it was not running."""
        with self._locked():
            if not self.status().running:
                self._clear_stale_pidfile()
                return False
            return self._pg_ctl_stop("fast")

    def restart_immediate(self) -> None:
        """Crash-stop then start again: the 'PostgreSQL restart' fault of the torture tests."""
        with self._locked():
            self._pg_ctl_stop("immediate")
        self.start()

    def _pg_ctl_stop(self, mode: str) -> bool:
        """``pg_ctl stop -m mode`` if the server runs (the caller holds the lock); whether
        it ran."""
        if not self.status().running:
            return False
        self._run(
            [str(_pg_bindir() / "pg_ctl"), "stop", "-w", "-m", mode,
             "-D", str(self.data_dir.resolve())]
        )  # fmt: skip
        return True

    # ----------------------------------------------------------------- replication
    def has_data(self) -> bool:
        return (self.data_dir / "PG_VERSION").exists()

    def base_backup(self, source_port: int, slot: str) -> None:
        """This node's data as a fresh copy of the server on ``source_port`` (which must
        have the physical replication slot ``slot``), WAL streamed with it, ready to start
        as its standby (``standby.signal``). Whatever data the node had is gone."""
        with self._locked():
            self.wipe()
            self._prepare_dirs()
            args = [str(_pg_bindir() / "pg_basebackup"), "-h", "127.0.0.1", "-p",
                    str(source_port), "-U", SUPERUSER, "-D", str(self.data_dir.resolve()),
                    "-X", "stream", "-S", slot, "--checkpoint=fast"]  # fmt: skip
            if os.environ.get("KIP98_EMBEDDED_DURABILITY", "on") == "off":
                args.append("--no-sync")
            self._run(args)
            # The source's own port and settings came along: this node writes its own.
            (self.data_dir / "kip98.conf").unlink(missing_ok=True)
            self.mark_standby()

    def rewind(self, source_port: int) -> str | None:
        """Make this stopped node's data follow the server on ``source_port`` again after
        it was promoted away from it (pg_rewind: only the blocks that differ are copied;
        a node stopped by a crash is first recovered by pg_rewind itself). None when done;
        else why it cannot be (no ``wal_log_hints`` or checksums, WAL gone), and the
        caller takes a base backup instead."""
        with self._locked():
            if not self.has_data():
                return "no data"
            if self.status().running:
                return "still running"
            self._clear_stale_pidfile()
            source = f"host=127.0.0.1 port={source_port} user={SUPERUSER} dbname=postgres"
            done = self._run(
                [str(_pg_bindir() / "pg_rewind"), "--target-pgdata",
                 str(self.data_dir.resolve()), "--source-server", source],
                check=False,
            )  # fmt: skip
            if done.returncode != 0:
                lines = (done.stderr or done.stdout).strip().splitlines()
                return lines[-1] if lines else f"pg_rewind exited with {done.returncode}"
            (self.data_dir / "kip98.conf").unlink(missing_ok=True)
            self.mark_standby()
            return None

    def mark_standby(self) -> None:
        """Start as a standby from now on (PostgreSQL's ``standby.signal``)."""
        signal_file = self.data_dir / "standby.signal"
        signal_file.touch()
        self._chown(signal_file)

    def is_standby(self) -> bool:
        return (self.data_dir / "standby.signal").exists()

    def promote(self) -> None:
        """End this standby's recovery: it becomes a primary (waits until it accepts
        writes)."""
        self._run(
            [str(_pg_bindir() / "pg_ctl"), "promote", "-w", "-t", str(_START_TIMEOUT_S),
             "-D", str(self.data_dir.resolve())]
        )  # fmt: skip

    def reconfigure(self) -> None:
        """Write this running node's settings again and have it read them (the port stays;
        ``primary_conninfo`` and ``synchronous_standby_names`` are read on a reload)."""
        status = self.status()
        if not status.running or status.port is None:
            return
        self._write_settings(status.port)
        self._run([str(_pg_bindir() / "pg_ctl"), "reload", "-D", str(self.data_dir.resolve())])

    def stop_immediately(self) -> bool:
        """Stop at once, without a checkpoint (a crash, as far as the data knows); whether
        it ran."""
        with self._locked():
            return self._pg_ctl_stop("immediate")

    def wipe(self) -> None:
        """Delete the node's data (stopped first), keeping its directories; by whoever
        holds the node (its own lock, or the replica set's)."""
        self._pg_ctl_stop("immediate")
        target = self.data_dir.resolve()
        if target.exists():
            shutil.rmtree(target, ignore_errors=True)
        if self.data_dir.is_symlink():
            self.data_dir.unlink()

    def _ready(self, port: int | None) -> bool:
        if port is None:
            return False
        import psycopg

        try:
            with psycopg.connect(
                host="127.0.0.1", port=port, user=SUPERUSER, dbname="postgres", connect_timeout=3
            ):
                return True
        except psycopg.OperationalError:
            return False

    def _wait_ready(self, port: int | None) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not self._ready(port):
            if time.monotonic() > deadline:
                raise EmbeddedError(f"PostgreSQL did not accept connections; see {self._log_file}")
            time.sleep(0.1)

    def _ensure_database(self, port: int | None) -> None:
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=port, user=SUPERUSER, dbname="postgres", autocommit=True
        ) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)
            ).fetchone()
            if not exists:
                with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                    conn.execute(f'CREATE DATABASE "{DATABASE}"')


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` for the block: one process at a time, across
    processes (a second lock from the same process on another descriptor waits too)."""
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _port_is_free(port: int) -> bool:
    """Whether the server could listen on ``port``: bound as the postmaster binds it
    (SO_REUSEADDR), so the connections a crash stop left in TIME_WAIT do not count."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
