"""The embedded database's replica set: a primary and N hot standbys streaming from it
under ``KIP98_HOME``, as Kafka keeps a partition's in-sync replicas (``kip98 db``; the
``kip98 serve`` nodes sharing a database are another thing, ``app.cluster``).

Each node is an embedded server of its own (``EmbeddedPostgres``: the first in
``KIP98_HOME`` itself, as a database without standbys always was; the others in
``KIP98_HOME/node1`` …), on its own port. What the nodes are, which one is the primary,
their ports and which old primaries must rejoin as standbys is remembered in
``KIP98_HOME/replica_set.json`` (read from ``cluster.json``, its name before, in a home
that has only that one, and moved at the next save), so a later ``kip98 db start`` brings
the same nodes back.

- A standby starts from a base backup of the primary and streams from it through a
  physical replication slot named after it, so the primary keeps the WAL it has not yet
  received (up to ``max_slot_wal_keep_size``).
- Every node's ``synchronous_standby_names`` is ``ANY K (node0, node1, …)``, all the
  nodes: a node never streams from itself, so the same setting is right whichever is the
  primary, and a failover does not touch it. K is ``--min-insync-standbys``.
- Clients get one URL naming every node with ``target_session_attrs=read-write``
  (``url``): libpq connects to whichever node is the primary, so the URL stays right
  after a failover.
- ``failover`` fences the primary (an immediate stop, in case it still runs), promotes
  the live standby that has received the most WAL (received, not replayed: a commit
  acknowledged with acks=all is flushed on K standbys, and promotion replays all it
  received), repoints the other standbys and marks the old primary to rejoin as a
  standby at the next start: rewound (pg_rewind, which needs ``wal_log_hints``, set on
  every node of a replicated database), or copied afresh when its data is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from app.storage.embedded import (
    DATABASE,
    SUPERUSER,
    EmbeddedError,
    EmbeddedPostgres,
    ServerStatus,
    file_lock,
    kip98_home,
)
from app.storage.urls import DatabaseUrl

FIRST = "node0"
LAYOUT = "replica_set.json"
FORMER_LAYOUT = "cluster.json"  # the layout's name before: read, then moved, in old homes
# What one more node needs of the host beside the others: its shared buffers and
# backends (kip98.conf: 256MB, 300 connections), with room to spare.
_NODE_MEMORY_BYTES = 768 * 2**20
# Walsenders every node allows (max_wal_senders); a base backup takes one, each standby one.
_WAL_SENDERS = 10
MAX_STANDBYS = _WAL_SENDERS - 2
_STREAMING_TIMEOUT_S = 60.0

Progress = Callable[[str], None]


class ReplicaSetError(EmbeddedError):
    """A request the primary and its standbys cannot carry out (the message says why)."""


@dataclass
class Layout:
    """What ``replica_set.json`` remembers."""

    standbys: int = 0
    min_insync: int = 0
    primary: str = FIRST
    nodes: list[str] = field(default_factory=lambda: [FIRST])
    ports: dict[str, int] = field(default_factory=dict)
    rejoin: list[str] = field(default_factory=list)  # old primaries to start as standbys

    @property
    def standby_names(self) -> list[str]:
        return [n for n in self.nodes if n != self.primary]


@dataclass(frozen=True)
class NodeStatus:
    """One node as ``kip98 db status`` shows it."""

    name: str
    role: str  # primary | standby
    running: bool
    port: int | None
    pid: int | None
    data_dir: str
    url: str | None
    lsn: str | None
    replay_lag_bytes: int | None
    sync_state: str | None

    def record(self) -> dict[str, Any]:
        return asdict(self)


def max_standbys() -> int:
    """How many standbys this host can run beside the primary: bounded by the walsenders
    each node allows and by the memory available."""
    available = available_memory()
    if available is None:
        return MAX_STANDBYS
    return max(0, min(MAX_STANDBYS, available // _NODE_MEMORY_BYTES - 1))


def available_memory(meminfo_path: str = "/proc/meminfo") -> int | None:
    """The bytes the kernel can give new processes without swapping: Linux's
    MemAvailable, which counts the page cache it would drop (the free pages alone leave
    it out, and a host that has just read or written much looks full); elsewhere the free
    pages; None if neither is known."""
    try:
        with open(meminfo_path, encoding="ascii") as meminfo:
            found = mem_available(meminfo.read())
        if found is not None:
            return found
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def mem_available(meminfo: str) -> int | None:
    """MemAvailable from the text of /proc/meminfo, in bytes (None if it has none)."""
    for line in meminfo.splitlines():
        name, _, value = line.partition(":")
        if name == "MemAvailable":
            number, *unit = value.split()
            return int(number) * (1024 if unit == ["kB"] else 1)
    return None


def check_request(standbys: int, min_insync: int | None) -> int:
    """The K for ``standbys`` standbys (default 1 with any), or why they cannot be."""
    if standbys < 0:
        raise ReplicaSetError(f"--standbys {standbys}: must be 0 or more")
    limit = max_standbys()
    if standbys > limit:
        raise ReplicaSetError(
            f"--standbys {standbys}: this host can run at most {limit} "
            f"(each node needs ~{_NODE_MEMORY_BYTES // 2**20} MB; a primary serves at most "
            f"{MAX_STANDBYS} standbys)"
        )
    k = min(1, standbys) if min_insync is None else min_insync
    if k < 0:
        raise ReplicaSetError(f"--min-insync-standbys {k}: must be 0 or more")
    if k > standbys:
        raise ReplicaSetError(
            f"--min-insync-standbys {k} is more than the {standbys} standbys to start"
        )
    return k


class EmbeddedReplicaSet:
    """The primary and its standbys under ``home``; every method is safe across processes
    (one lock)."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = (home or kip98_home()).resolve()
        self.layout_path = self.home / LAYOUT
        self.former_layout_path = self.home / FORMER_LAYOUT
        self.lock_path = self.home / "replica_set.lock"

    # ------------------------------------------------------------------ layout
    def layout(self) -> Layout:
        for path in (self.layout_path, self.former_layout_path):
            try:
                data = json.loads(path.read_text())
            except FileNotFoundError:
                continue
            return Layout(**data)
        return Layout()

    def _save(self, layout: Layout) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        tmp = self.layout_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(layout), indent=2))
        tmp.replace(self.layout_path)
        self.former_layout_path.unlink(missing_ok=True)  # the new name from now on

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        """The whole set of nodes, one process at a time (each node has its own lock too,
        taken inside this one)."""
        self.home.mkdir(parents=True, exist_ok=True)
        return file_lock(self.lock_path)

    def node(self, name: str, layout: Layout | None = None) -> EmbeddedPostgres:
        """The node ``name`` with the settings its role in ``layout`` asks for."""
        layout = layout or self.layout()
        return EmbeddedPostgres(
            self.home,
            None if name == FIRST else name,
            settings=self._settings(name, layout),
            port=layout.ports.get(name),
        )

    def _settings(self, name: str, layout: Layout) -> dict[str, str]:
        if layout.standbys == 0:
            return {}
        listed = ", ".join(f'"{n}"' for n in layout.nodes)
        settings = {
            "cluster_name": f"'{name}'",
            "wal_level": "replica",
            "hot_standby": "on",
            "hot_standby_feedback": "on",  # a standby's readers hold back the cleanup
            "wal_log_hints": "on",  # pg_rewind, when an old primary rejoins
            "max_wal_senders": str(_WAL_SENDERS),
            "max_replication_slots": str(_WAL_SENDERS),
            "max_slot_wal_keep_size": "'4GB'",
            "wal_sender_timeout": "'10s'",
            "wal_receiver_status_interval": "'1s'",
            "synchronous_commit": "on",  # acks=all waits for K standbys (rule 41)
            "synchronous_standby_names": (
                f"'ANY {layout.min_insync} ({listed})'" if layout.min_insync else "''"
            ),
        }
        if name != layout.primary:
            primary_port = layout.ports.get(layout.primary)
            settings["primary_conninfo"] = (
                f"'host=127.0.0.1 port={primary_port} user={SUPERUSER} application_name={name}'"
            )
            settings["primary_slot_name"] = f"'{name}'"
        return settings

    # ------------------------------------------------------------------ addresses
    def url(self, layout: Layout | None = None, standby: bool = False) -> str:
        """A URL naming every node: it reaches the primary (``target_session_attrs``
        read-write), or with ``standby`` a standby; the primary's own URL when there are
        no standbys."""
        layout = layout or self.layout()
        if layout.standbys == 0 and not standby:
            status = self.node(FIRST, layout).status()
            if status.url is None:
                raise ReplicaSetError("the embedded PostgreSQL is not running (kip98 db start)")
            return status.url
        if layout.standbys == 0:
            raise ReplicaSetError(
                "the embedded PostgreSQL has no standbys (kip98 db start --standbys N)"
            )
        hosts = tuple(("127.0.0.1", layout.ports[n]) for n in layout.nodes if n in layout.ports)
        target = "standby" if standby else "read-write"
        return DatabaseUrl(
            "postgresql+psycopg", hosts, SUPERUSER, None, DATABASE,
            (("target_session_attrs", target),),
        ).render()  # fmt: skip

    # ------------------------------------------------------------------ life cycle
    def start(
        self,
        standbys: int | None = None,
        min_insync: int | None = None,
        progress: Progress | None = None,
    ) -> Layout:
        """Start every node (``standbys``: how many standbys from now on, None for those
        remembered; more are added, fewer removed). A failure while adding standbys stops
        and removes them and leaves the primary as it was."""
        say = progress or (lambda _: None)
        with self._locked():
            layout = self.layout()
            wanted = layout.standbys if standbys is None else standbys
            if min_insync is None and wanted == layout.standbys:
                min_insync = layout.min_insync
            k = check_request(wanted, min_insync)
            say(f"starting the primary ({layout.primary})")
            if wanted and not layout.standbys and not self.primary().status().running:
                # Replicating from its first start: wal_log_hints, which a later rewind
                # needs, is read only then. Its standbys confirm nothing yet.
                first = Layout(**asdict(layout))
                first.standbys = wanted  # min_insync still 0: nothing to wait for
                self._start_node(layout.primary, first)
                layout.ports.update(first.ports)
            else:
                self._start_node(layout.primary, layout)
            self._rejoin(layout, say)
            for name in layout.standby_names:
                self._start_standby(name, layout, say)
            if wanted > layout.standbys:
                layout = self._add_standbys(layout, wanted, k, say)
            elif wanted < layout.standbys:
                layout = self._remove_standbys(layout, wanted, k, say)
            elif k != layout.min_insync:
                layout.min_insync = k
                self._save(layout)
                for name in layout.nodes:  # every node: any may be the primary later
                    self.node(name, layout).reconfigure()
            return layout

    def _start_node(self, name: str, layout: Layout) -> ServerStatus:
        node = self.node(name, layout)
        status = node.start()
        if status.port is not None and layout.ports.get(name) != status.port:
            layout.ports[name] = status.port
            self._save(layout)
        return status

    def _start_standby(self, name: str, layout: Layout, say: Progress) -> None:
        node = self.node(name, layout)
        if node.status().running:
            return
        if not node.has_data():  # its data is gone: a fresh copy of the primary
            say(f"copying the primary to {name}")
            self._base_backup(name, layout)
        say(f"starting standby {name}")
        self._start_node(name, layout)

    def _base_backup(self, name: str, layout: Layout) -> None:
        primary_port = layout.ports[layout.primary]
        self._ensure_slot(primary_port, name)
        node = self.node(name, layout)
        node.base_backup(primary_port, name)

    @staticmethod
    def _ensure_slot(port: int, name: str) -> None:
        with _admin(port) as conn:
            conn.execute(
                "SELECT pg_create_physical_replication_slot(%(n)s, true)"
                " WHERE NOT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = %(n)s)",
                {"n": name},
            )

    @staticmethod
    def _drop_slot(port: int, name: str) -> None:
        with contextlib.suppress(psycopg.Error), _admin(port) as conn:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                " WHERE slot_name = %(n)s AND NOT active",
                {"n": name},
            )

    def _add_standbys(self, layout: Layout, wanted: int, k: int, say: Progress) -> Layout:
        grown = Layout(**asdict(layout))
        added = [
            f"node{i}"
            for i in range(len(layout.nodes), len(layout.nodes) + wanted - layout.standbys)
        ]
        grown.nodes = [*layout.nodes, *added]
        grown.standbys, grown.min_insync = wanted, k
        primary_port = layout.ports[layout.primary]
        making = added[0]
        try:
            for making in added:
                say(f"copying the primary to {making}")
                self._base_backup(making, grown)
                say(f"starting standby {making}")
                self._start_node(making, grown)
            say("waiting for the standbys to stream")
            self._wait_streaming(primary_port, grown.standby_names)
        except Exception as exc:
            for name in added:
                node = self.node(name, grown)
                with contextlib.suppress(Exception):
                    node.wipe()
                self._drop_slot(primary_port, name)
                grown.ports.pop(name, None)
            layout.ports = {n: p for n, p in layout.ports.items() if n in layout.nodes}
            self._save(layout)
            if isinstance(exc, ReplicaSetError):
                raise
            raise ReplicaSetError(
                f"standby {making} could not be started ({exc}); the primary is as it was"
            ) from exc
        self._save(grown)
        # Only now does the primary ask its standbys to confirm commits.
        for name in grown.nodes:
            self.node(name, grown).reconfigure()
        return grown

    def _remove_standbys(self, layout: Layout, wanted: int, k: int, say: Progress) -> Layout:
        shrunk = Layout(**asdict(layout))
        kept = [layout.primary, *layout.standby_names[:wanted]]
        removed = [n for n in layout.nodes if n not in kept]
        shrunk.nodes = [n for n in layout.nodes if n in kept]
        shrunk.standbys, shrunk.min_insync = wanted, k
        shrunk.rejoin = [n for n in layout.rejoin if n in kept]
        for name in removed:
            shrunk.ports.pop(name, None)
        self._save(shrunk)
        for name in shrunk.nodes:  # no longer waiting for the removed ones
            self.node(name, shrunk).reconfigure()
        primary_port = layout.ports[layout.primary]
        for name in removed:
            say(f"removing standby {name}")
            self.node(name, layout).wipe()
            self._drop_slot(primary_port, name)
        return shrunk

    def _wait_streaming(self, primary_port: int, names: list[str]) -> None:
        deadline = time.monotonic() + _STREAMING_TIMEOUT_S
        while True:
            with _admin(primary_port) as conn:
                streaming = {
                    row[0]
                    for row in conn.execute(
                        "SELECT application_name FROM pg_stat_replication WHERE state = 'streaming'"
                    )
                }
            if set(names) <= streaming:
                return
            if time.monotonic() > deadline:
                missing = ", ".join(sorted(set(names) - streaming))
                raise ReplicaSetError(
                    f"standbys not streaming after {_STREAMING_TIMEOUT_S:.0f} s: {missing}"
                )
            time.sleep(0.1)

    def _rejoin(self, layout: Layout, say: Progress) -> None:
        """Turn the old primaries marked to rejoin into standbys of the current primary."""
        if not layout.rejoin:
            return
        primary_port = layout.ports[layout.primary]
        # pg_rewind reads the source's timeline from its control file, which a promoted
        # node updates at its first checkpoint: without one, the old primary looks to be
        # on the same timeline and "needs no rewind", and then cannot follow.
        with _admin(primary_port) as conn:
            conn.execute("CHECKPOINT")
        for name in list(layout.rejoin):
            node = self.node(name, layout)
            node.stop_immediately()
            self._ensure_slot(primary_port, name)
            say(f"{name} rejoins as a standby of {layout.primary}")
            why = node.rewind(primary_port)
            if why is None:
                say(f"{name} rewound to {layout.primary}'s history")
            else:
                say(f"{name} cannot be rewound ({why}): copying the primary to it")
                node.base_backup(primary_port, name)
            layout.rejoin.remove(name)
            self._save(layout)

    def stop(self) -> list[str]:
        """Stop every node, the primary first; the names of those that were running."""
        with self._locked():
            layout = self.layout()
            stopped = []
            for name in [layout.primary, *layout.standby_names]:
                if self.node(name, layout).stop():
                    stopped.append(name)
            return stopped

    # ------------------------------------------------------------------ failover
    def failover(self, progress: Progress | None = None) -> str:
        """Promote the live standby that has received the most WAL; the others follow
        it, and the old primary rejoins as a standby when started again. Returns the new
        primary's name."""
        say = progress or (lambda _: None)
        with self._locked():
            layout = self.layout()
            if layout.standbys == 0:
                raise ReplicaSetError("no standbys to fail over to (kip98 db start --standbys N)")
            old = layout.primary
            if not self._received(layout):
                raise ReplicaSetError("no live standby to promote")
            say(f"fencing the primary ({old})")
            self.node(old, layout).stop_immediately()
            say("finding the most advanced standby")
            received = self._received(layout)  # again: they went on receiving until now
            if not received:
                raise ReplicaSetError("no live standby to promote")
            chosen = max(received, key=lambda n: received[n])
            say(f"promoting {chosen}")
            self.node(chosen, layout).promote()
            layout.primary = chosen
            layout.rejoin = sorted({*layout.rejoin, old} - {chosen})
            self._save(layout)
            new_port = layout.ports[chosen]
            for name in layout.standby_names:
                self._ensure_slot(new_port, name)
            self.node(chosen, layout).reconfigure()
            for name in layout.standby_names:
                node = self.node(name, layout)
                if name not in layout.rejoin and node.status().running:
                    say(f"pointing {name} at {chosen}")
                    node.reconfigure()
            return chosen

    def _received(self, layout: Layout) -> dict[str, tuple[int, int]]:
        """Each live standby's WAL position: (received and flushed, replayed)."""
        found = {}
        for name in layout.standby_names:
            status = self.node(name, layout).status()
            if not status.running or status.port is None:
                continue
            try:
                with _admin(status.port) as conn:
                    row = conn.execute(
                        "SELECT pg_is_in_recovery(),"
                        " coalesce(pg_last_wal_receive_lsn(), '0/0') - '0/0'::pg_lsn,"
                        " coalesce(pg_last_wal_replay_lsn(), '0/0') - '0/0'::pg_lsn"
                    ).fetchone()
            except psycopg.Error:
                continue
            if row is not None and row[0]:
                found[name] = (max(int(row[1]), int(row[2])), int(row[2]))
        return found

    # ------------------------------------------------------------------ status
    def nodes(self) -> list[NodeStatus]:
        """Every node, the primary first."""
        layout = self.layout()
        names = [layout.primary, *layout.standby_names]
        replication: dict[str, tuple[int | None, str | None]] = {}
        primary = self.node(layout.primary, layout).status()
        shown = []
        if primary.running and primary.port is not None:
            with contextlib.suppress(psycopg.Error), _admin(primary.port) as conn:
                for name, lag, state in conn.execute(
                    "SELECT application_name,"
                    " (pg_current_wal_lsn() - replay_lsn)::bigint, sync_state"
                    " FROM pg_stat_replication"
                ):
                    replication[name] = (lag, state)
        for name in names:
            node = self.node(name, layout)
            status = node.status()
            lsn = None
            if status.running and status.port is not None:
                with contextlib.suppress(psycopg.Error), _admin(status.port) as conn:
                    row = conn.execute(
                        "SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()"
                        " ELSE pg_current_wal_lsn() END::text"
                    ).fetchone()
                    lsn = None if row is None else row[0]
            is_primary = name == layout.primary
            lag, state = (0, None) if is_primary else replication.get(name, (None, None))
            shown.append(
                NodeStatus(
                    name=name,
                    role="primary" if is_primary else "standby",
                    running=status.running,
                    port=status.port or layout.ports.get(name),
                    pid=status.pid,
                    data_dir=str(node.data_dir),
                    url=status.url,
                    lsn=lsn,
                    replay_lag_bytes=lag if status.running else None,
                    sync_state=state,
                )
            )
        return shown

    def primary(self) -> EmbeddedPostgres:
        layout = self.layout()
        return self.node(layout.primary, layout)


@contextlib.contextmanager
def _admin(port: int) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(
        host="127.0.0.1", port=port, user=SUPERUSER, dbname="postgres",
        autocommit=True, connect_timeout=5,
    ) as conn:  # fmt: skip
        yield conn


def database_url(start: bool = True) -> str:
    """The URL clients use: ``KIP98_DATABASE_URL`` if set, else the embedded database's
    (started on demand with the nodes it remembers): one naming every node, reaching the
    primary, when it has standbys."""
    explicit = os.environ.get("KIP98_DATABASE_URL")
    if explicit:
        return explicit
    replica_set = EmbeddedReplicaSet()
    if start:
        replica_set.start()
    return replica_set.url()
