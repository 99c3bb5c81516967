"""``kip98 serve``: the Kafka wire protocol over ``Broker.handle``.

One asyncio loop accepts connections and reads frames; the database work runs on a bounded
pool of worker threads. A connection's requests are answered one at a time, in order (as
Kafka mutes a channel while its request is handled), and its next frame is not read until
the answer is written: a client that sends faster than the database answers is held back
by TCP, and no connection can take more than one worker.

Bad input is the connection's own problem: a frame over ``socket.request.max.bytes``, one
kio cannot read, or an API key or version not advertised closes that connection (an
ApiVersions request of an unknown version is answered, as Kafka answers it, with version
0 and the versions there are) and is counted in ``refused``; nothing of it is written. A
request that can be read is always answered: a failure of the broker is each item's
error code (``failures.AnsweringBroker``), and a handler that fails all the same answers
its error code where its response has one (counted in ``failed``), logged with the cause;
the connection stays open.
A long poll (a fetch short of ``min_bytes``, a JoinGroup waiting for the other members,
a follower's SyncGroup waiting for its leader) holds no worker while it waits: the
connection's task sleeps between looks, and looks again at once after a request through
this server that may have changed the answer. On SIGTERM the node leaves the cluster
first (``registration``: the other nodes' next Metadata leaves it out), then the server
stops accepting, lets each connection finish the request it is in (a long poll ends at
once: a read has nothing to finish), and closes.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import socket
import ssl
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields, replace

from app.broker import Broker
from app.errors import KafkaError
from app.protocol import NodeEndpoint
from app.server import codec
from app.server.address import Listener
from app.server.answer import Answer, Pending
from app.server.apis import API_VERSIONS_KEY, APIS
from app.server.auth_failures import WINDOW_S, Failure, FailureLog
from app.server.failures import AnsweringBroker
from app.server.node import Node, Session
from app.server.registration import Registration, ServeError
from app.server.sasl import BEFORE_AUTHENTICATION, sasl_token

log = logging.getLogger(__name__)

# Kafka's socket.request.max.bytes default.
MAX_REQUEST_BYTES = 104_857_600
UNSUPPORTED_VERSION = 35
# Requests after which a long poll looks again at once: new records or markers (Produce,
# EndTxn) for a fetch; a member joining, syncing or leaving for the others' JoinGroup and
# SyncGroup.
WAKING_APIS = frozenset({0, 11, 13, 14, 26})


@dataclass(frozen=True)
class Endpoint:
    """Where connections are accepted, and the node their requests are answered as (the
    address Metadata gives them: the advertised listener of the same protocol)."""

    listener: Listener
    node: Node


def check_tls(endpoints: list[Endpoint], tls: ssl.SSLContext | None) -> None:
    """ValueError if an endpoint's protocol asks for TLS and there is no context."""
    if tls is None and any(e.listener.tls for e in endpoints):
        raise ValueError(
            "an SSL or SASL_SSL listener needs a TLS certificate and key (--tls-cert, --tls-key)"
        )


class Server:
    def __init__(
        self,
        broker: Broker,
        endpoints: list[Endpoint],
        workers: int = 16,
        max_request_bytes: int = MAX_REQUEST_BYTES,
        tls: ssl.SSLContext | None = None,
        sockets: list[socket.socket] | None = None,
    ) -> None:
        """``tls``: the context of the endpoints whose protocol is SSL or SASL_SSL;
        ``sockets``: each endpoint's socket, bound and listening already (otherwise
        ``start`` binds them)."""
        check_tls(endpoints, tls)
        self.endpoints, self.tls = endpoints, tls
        self.sockets = sockets
        # Every field of the broker given, the standby's engine (fetch from follower) too.
        self.broker: Broker = AnsweringBroker(
            **{f.name: getattr(broker, f.name) for f in fields(broker)}
        )
        self.max_request_bytes = max_request_bytes
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="kip98-serve")
        # What was answered, by API name; what was refused, by reason; the handlers that
        # failed and answered an error code instead, by API name.
        self.requests: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        # Failed SASL logins, by mechanism; their log lines, at most one per client host
        # per window (auth_failures).
        self.authentication_failures: Counter[str] = Counter()
        self.failure_log = FailureLog()
        self._failure_lines: asyncio.Task[None] | None = None
        self._servers: list[asyncio.Server] = []
        self._idle: dict[asyncio.StreamWriter, bool] = {}
        self._stopping = False
        # The ports listened on, in the endpoints' order (known once started for port 0).
        self.ports = [e.listener.port for e in endpoints]
        # Set (and replaced) when a request of this server may have answered a long poll.
        self._changed = asyncio.Event()

    @property
    def port(self) -> int:
        return self.ports[0]

    @property
    def connections(self) -> int:
        return len(self._idle)

    @property
    def answered(self) -> int:
        """Requests answered so far."""
        return sum(self.requests.values())

    def advertised(self) -> list[NodeEndpoint]:
        """Each endpoint's advertised address, by protocol; once started, a listener on
        port 0 that advertises itself gives the port it was bound to."""
        shown = []
        for endpoint, port in zip(self.endpoints, self.ports, strict=True):
            node = endpoint.node
            own = (node.host, node.port) == endpoint.listener.address
            shown.append(
                NodeEndpoint(endpoint.listener.security_protocol, node.host,
                             port if own and node.port == 0 else node.port)
            )  # fmt: skip
        return shown

    async def start(self, serving: bool = True) -> None:
        """Listen on every endpoint; ServeError (nothing left listening) if one cannot.
        With ``serving`` false the sockets are bound (their ports known) but take no
        connection until each server's ``start_serving()`` (``serve_until_stopped``, once
        the node has registered)."""
        for i, endpoint in enumerate(self.endpoints):
            serve = functools.partial(self._connection, endpoint)
            tls = self.tls if endpoint.listener.tls else None
            try:
                if self.sockets:
                    server = await asyncio.start_server(
                        serve, sock=self.sockets[i], ssl=tls, start_serving=serving
                    )
                else:
                    server = await asyncio.start_server(
                        serve, *endpoint.listener.address, ssl=tls, start_serving=serving
                    )
            except OSError as exc:
                for started in self._servers:
                    started.close()
                raise ServeError.cannot_listen(endpoint.listener, exc) from exc
            self._servers.append(server)
            self.ports[i] = server.sockets[0].getsockname()[1]
        if self._failure_lines is None:
            self._failure_lines = asyncio.get_running_loop().create_task(self._log_failures())

    async def serve_until_stopped(self, registration: Registration | None = None) -> None:
        """Serve until SIGTERM or SIGINT, then stop cleanly. With ``registration``, join
        the cluster once listening and leave it first when stopping; ServeError if the node
        id is refused, or lost later to another node."""
        # A registering node answers nothing until it has joined: the join moves the
        # partitions' leader epochs, and an answer given before it would hand clients
        # epochs the partitions no longer have (docs/design.md rule 40).
        await self.start(serving=registration is None)
        stopped = asyncio.Event()
        lost: list[str] = []
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopped.set)
        try:
            if registration is not None:
                registration.endpoints = tuple(self.advertised())
                await loop.run_in_executor(None, registration.join)

                def on_lost(why: str) -> None:
                    lost.append(why)
                    loop.call_soon_threadsafe(stopped.set)

                registration.start(on_lost)
                for server in self._servers:
                    await server.start_serving()
            for endpoint in self.endpoints:
                log.info("kip98 serve: node %d listening on %s",
                         endpoint.node.member.node_id, endpoint.listener)  # fmt: skip
            await stopped.wait()
        finally:
            if registration is not None:
                await loop.run_in_executor(None, registration.stop)
            await self.stop()
        if lost:
            raise ServeError(lost[0])

    async def stop(self) -> None:
        self._stopping = True
        if self._failure_lines is not None:
            self._failure_lines.cancel()
        self._log_lines(self.failure_log.flush())
        for server in self._servers:
            server.close()
        for writer, idle in list(self._idle.items()):
            if idle:
                writer.close()
        while self._idle:
            await asyncio.sleep(0.01)
        for server in self._servers:
            await server.wait_closed()
        self.pool.shutdown(wait=True)

    async def _connection(
        self, endpoint: Endpoint, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._idle[writer] = True
        loop = asyncio.get_running_loop()
        peer = writer.get_extra_info("peername")
        host = f"/{peer[0]}" if peer else ""  # as Kafka shows a client's address
        address = f"{host}:{peer[1]}" if peer else ""
        session = Session(endpoint.listener.sasl)
        node = replace(endpoint.node, client_host=host, session=session)
        try:
            while not self._stopping:
                size = codec.FRAME_SIZE.unpack(await reader.readexactly(codec.FRAME_SIZE.size))[0]
                if not 0 < size <= self.max_request_bytes:
                    self._refuse("size", f"a frame of {size} bytes")
                    return
                frame = await reader.readexactly(size)
                self._idle[writer] = False
                token = session.bare_tokens and not session.admits  # not a request
                try:
                    response = await loop.run_in_executor(self.pool, self.answer, frame, node)
                    if not token and codec.read_header(frame)[0] in WAKING_APIS:
                        self._changed.set()
                        self._changed = asyncio.Event()
                    while isinstance(response, Waiting) and not self._stopping:
                        await self._pause(response.wait_s)
                        response = await loop.run_in_executor(self.pool, self._again, response)
                finally:
                    self._idle[writer] = True
                if isinstance(response, Waiting):
                    return  # stopping mid long poll: a fetch has nothing to finish
                if response is not None:
                    writer.write(response)
                    await writer.drain()
                if session.failed:
                    self._authentication_failed(Failure(host, address, session.mechanism,
                                                        session.tried))  # fmt: skip
                    return
        except Unauthenticated as exc:
            self._refuse("unauthenticated", str(exc))
        except asyncio.IncompleteReadError as exc:
            if exc.partial:  # a frame cut short, not a close between frames
                self._refuse("truncated", f"a frame cut after {len(exc.partial)} bytes")
        except ConnectionError:
            pass
        except codec.MalformedRequest as exc:
            self._refuse("malformed", str(exc))
        except Exception:
            log.exception("kip98 serve: a request failed; closing its connection")
            self.refused["failed"] += 1
        finally:
            del self._idle[writer]
            writer.close()

    def _again(self, waiting: Waiting) -> bytes | Waiting | None:
        """A long poll's next look; one that fails is answered as a failed handler."""
        try:
            return waiting.again()
        except Exception:
            return self._failed(type(waiting.pending).__name__, waiting.frame)

    async def _pause(self, wait_s: float) -> None:
        """Until the next look of a long poll: ``wait_s``, or less if a request through this
        server changed what it waits for. Writes from other processes are seen at the next
        look, so the pauses stay short."""
        changed = self._changed
        try:
            await asyncio.wait_for(changed.wait(), wait_s)
        except TimeoutError:
            pass

    def _refuse(self, reason: str, what: str) -> None:
        self.refused[reason] += 1
        log.info("kip98 serve: closing a connection: %s", what)

    def _authentication_failed(self, failure: Failure) -> None:
        """A failed login closes its connection: counted by mechanism (and as a refusal),
        logged within the per-host bound."""
        self.refused["authentication"] += 1
        self.authentication_failures[failure.mechanism or "none"] += 1
        self._log_lines(self.failure_log.failed(failure))

    def _log_lines(self, lines: list[str]) -> None:
        for line in lines:
            log.info("kip98 serve: %s", line)

    async def _log_failures(self) -> None:
        """The counts of failures left out, once their window is over, even if no other
        failure comes to carry them."""
        while True:
            await asyncio.sleep(WINDOW_S)
            self._log_lines(self.failure_log.due())

    def _unsupported_api_versions(self, frame: bytes, version: int, correlation_id: int) -> bytes:
        """ApiVersions of a version not served, as Kafka answers it (KIP-511): its header
        read as that version's would be (the flexible one from v3 on, so a v1 header there
        cannot be read and closes the connection), then a v0 answer, UNSUPPORTED_VERSION
        with ApiVersions' own versions only, for the client to ask again within them."""
        schema = codec.request_schema(API_VERSIONS_KEY, 3 if version >= 3 else 0)
        assert schema is not None, "kio knows ApiVersions v0 and v3"
        codec.parse_header(frame, schema)
        low, high, _ = APIS[API_VERSIONS_KEY]
        versions = {"error_code": UNSUPPORTED_VERSION,
                    "api_keys": [{"api_key": API_VERSIONS_KEY, "min_version": low,
                                  "max_version": high}]}  # fmt: skip
        return codec.encode_response(API_VERSIONS_KEY, 0, correlation_id, versions)

    def answer(self, frame: bytes, node: Node) -> bytes | Waiting | None:
        """The response frame to one request frame from a connection answered as ``node``
        (its client's address and SASL session on it), or Waiting for a long poll to look
        again. Raises Unauthenticated for a request a connection may not make before it
        authenticates."""
        session = node.session
        assert session is not None, "a connection's node carries its session"
        if session.bare_tokens and not session.admits:
            return sasl_token(self.broker, session, frame)  # after a v0 SaslHandshake
        api_key, version, correlation_id = codec.read_header(frame)
        if not session.admits and api_key not in BEFORE_AUTHENTICATION:
            raise Unauthenticated(f"API key {api_key} before SASL authentication")
        supported = APIS.get(api_key)
        if supported is None or not supported[0] <= version <= supported[1]:
            if api_key == API_VERSIONS_KEY:
                return self._unsupported_api_versions(frame, version, correlation_id)
            raise codec.MalformedRequest(f"API key {api_key} version {version} is not served")
        schema = codec.request_schema(api_key, version)
        if schema is None:
            raise codec.MalformedRequest(f"no schema for API key {api_key} version {version}")
        header, body = codec.parse_request(frame, schema)
        handler = supported[2]
        self.requests[handler.__name__] += 1
        node = replace(node, client_id=getattr(header, "client_id", None) or "")
        broker = self.broker
        if session.principal is not None:
            broker = replace(broker, principal=session.principal)
        frame_of = (api_key, version, correlation_id)
        try:
            return _encoded(*frame_of, handler(broker, node, body))
        except Exception:
            return self._failed(handler.__name__, frame_of)

    def _failed(self, name: str, frame: tuple[int, int, int]) -> bytes:
        """A handler that failed: its response with the error code where it has one (and
        its lists empty), so the client is answered and its connection stays open."""
        log.exception("kip98 serve: %s failed; answered UNKNOWN_SERVER_ERROR", name)
        self.failed[name] += 1
        return codec.error_response(*frame, KafkaError.UNKNOWN_SERVER_ERROR)


class Unauthenticated(Exception):
    """A request other than ApiVersions and the SASL ones before authentication: Kafka
    closes such a connection."""


@dataclass(frozen=True)
class Waiting:
    """A long poll between its looks: ``again`` looks, and answers or waits on."""

    wait_s: float
    pending: Pending
    frame: tuple[int, int, int]

    def again(self) -> bytes | Waiting | None:
        return _encoded(*self.frame, self.pending.again())


def _encoded(
    api_key: int, version: int, correlation_id: int, answer: Answer
) -> bytes | Waiting | None:
    if answer is None:
        return None
    if isinstance(answer, Pending):
        return Waiting(answer.wait_s, answer, (api_key, version, correlation_id))
    return codec.encode_response(api_key, version, correlation_id, answer)
