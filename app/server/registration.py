"""This node's place in the cluster (docs/design.md rule 46): registered when it starts,
renewed by a heartbeat thread at most a second apart, removed when it stops.

The heartbeat runs on a thread of its own, so no request, however slow, holds it up; its
statements take a connection of the server's engine, whose pool is larger than the
request workers, so one is always free, and are bounded like every session's. A renewal
that finds the registration gone or lapsed (the node was cut off from the database, or
stopped, past the session timeout, and another node removed it) registers again: under
the same node id if no live node has taken it, else, when the id was the database's
choice, under a new one. A node id given on the command line that another live node has
taken is lost for good: the node stops (``ServeError``).

A registered node also runs the coordinator's timers, as Kafka's brokers do
(docs/design.md rule 54): the coordinator loop (``app.broker.loop``) from a thread of its
own, from the join until the node stops, when its leases are released at once so another
node takes them over on its next pass. The leases of a node killed outright lapse after
``KIP98_COORDINATOR_LEASE_MS``; each transaction-log partition's work is done by one node
at a time, whichever holds its lease. ``KIP98_SERVE_COORDINATOR_LOOP=0`` leaves the work
to the clients' loops or ``kip98 coordinator run``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable

from app.broker import Broker
from app.broker.loop import CoordinatorLoop
from app.errors import KafkaError
from app.protocol import (
    ANY_NODE_ID,
    BrokerHeartbeatRequest,
    BrokerRegistrationRequest,
    NodeEndpoint,
    UnregisterBrokerRequest,
)
from app.server.node import Member
from app.settings import BrokerSettings

log = logging.getLogger(__name__)

# The longest pause between heartbeats, and the most of the session timeout one may take.
MAX_HEARTBEAT_INTERVAL_S = 1.0
HEARTBEATS_PER_SESSION = 3
# The shortest session timeout taken: below it a pause of the process or the database
# (a collection, a checkpoint) would be taken for its death.
MIN_SESSION_TIMEOUT_MS = 1_000


class ServeError(Exception):
    """Why ``kip98 serve`` cannot go on, in one line for its user: a listener that cannot
    bind, a node id a live node holds."""

    @classmethod
    def cannot_listen(cls, where: object, exc: OSError) -> ServeError:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        return cls(f"cannot listen on {where}: {reason}")


def check_session_timeout(settings: BrokerSettings) -> int:
    """``KIP98_NODE_SESSION_TIMEOUT_MS``; ServeError below ``MIN_SESSION_TIMEOUT_MS``."""
    timeout_ms = settings.node_session_timeout_ms
    if timeout_ms < MIN_SESSION_TIMEOUT_MS:
        raise ServeError(
            f"KIP98_NODE_SESSION_TIMEOUT_MS must be at least {MIN_SESSION_TIMEOUT_MS}, "
            f"not {timeout_ms}"
        )
    return timeout_ms


class Registration:
    """``node_id``: the id asked for (``ANY_NODE_ID``: the database's choice);
    ``answered``: how many requests the node has answered so far, reported with each
    heartbeat; ``member``: updated with the id the node holds. ``endpoints``, the
    advertised listeners, are set once the server listens (the port of one on port 0 is
    known then)."""

    def __init__(
        self,
        broker: Broker,
        member: Member,
        node_id: int = ANY_NODE_ID,
        answered: Callable[[], int] = lambda: 0,
    ) -> None:
        self.broker, self.member = broker, member
        self.endpoints: tuple[NodeEndpoint, ...] = ()
        self.requested_id = node_id
        self.answered = answered
        self.incarnation = str(uuid.uuid4())
        self.registered = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._on_lost: Callable[[str], None] = lambda why: None
        self.coordinator: CoordinatorLoop | None = None
        timeout_ms = check_session_timeout(broker.settings)
        self.interval_s = min(MAX_HEARTBEAT_INTERVAL_S, timeout_ms / 1000 / HEARTBEATS_PER_SESSION)

    def join(self) -> None:
        """The first registration: ServeError, in one line, if a live node holds the id
        or the database cannot be reached."""
        try:
            self.register()
        except ServeError:
            raise
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ServeError(f"cannot register this node: {first}") from exc

    def register(self, node_id: int | None = None) -> None:
        """Join the cluster as ``node_id`` (default: the id asked for); ServeError if a live
        node holds it."""
        wanted = self.requested_id if node_id is None else node_id
        answer = self.broker.handle(
            BrokerRegistrationRequest(
                wanted, self.incarnation, self.endpoints, self.member.rack,
                socket.gethostname(), os.getpid(),
            )
        )  # fmt: skip
        if answer.error_code != KafkaError.NO_ERROR:
            raise ServeError(answer.error_message or KafkaError(answer.error_code).str())
        self.member.node_id = answer.node_id
        self.registered = True

    def start(self, on_lost: Callable[[str], None]) -> None:
        """Heartbeat from a thread until ``stop``; ``on_lost(why)`` if the node id is lost."""
        self._on_lost = on_lost
        self._thread = threading.Thread(target=self._run, name="kip98-heartbeat", daemon=True)
        self._thread.start()
        if self.broker.settings.serve_coordinator_loop:
            self.coordinator = CoordinatorLoop(self.broker)
            self.coordinator.start()
            log.info("node %d runs the coordinator loop as %s", self.member.node_id,
                     self.coordinator.owner)  # fmt: skip

    def stop(self) -> None:
        """Stop the coordinator loop and release its leases, stop heartbeating, then leave
        the cluster at once (if the database is reachable; otherwise the leases and the
        registration lapse)."""
        if self.coordinator is not None:
            self.coordinator.stop(release=True)
            self.coordinator = None
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if not self.registered:
            return
        try:
            self.broker.handle(UnregisterBrokerRequest(self.member.node_id, self.incarnation))
            self.registered = False
        except Exception as exc:
            log.warning("node %d could not unregister (its registration will lapse): %s",
                        self.member.node_id, exc)  # fmt: skip

    def heartbeat(self) -> None:
        """One renewal; a registration found gone or lapsed is made again."""
        answer = self.broker.handle(
            BrokerHeartbeatRequest(self.member.node_id, self.incarnation, self.answered())
        )
        if answer.error_code == KafkaError.NO_ERROR:
            return
        log.warning("node %d: %s; registering again", self.member.node_id, answer.error_message)
        try:
            self.register(self.member.node_id)
        except ServeError:
            if self.requested_id != ANY_NODE_ID:
                raise
            self.register(ANY_NODE_ID)
            log.warning("registered again as node %d", self.member.node_id)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.heartbeat()
            except ServeError as exc:
                log.error("kip98 serve: stopping: %s", exc)
                self.registered = False
                self._on_lost(str(exc))
                return
            except Exception as exc:  # the database unreachable: try again next time
                log.warning("node %d: heartbeat failed: %s", self.member.node_id, exc)
