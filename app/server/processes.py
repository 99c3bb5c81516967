"""``kip98 serve --processes N``: N server processes on the same listeners, so one host
serves with every core (one Python process runs on one).

Each process is a node of its own (docs/design.md rule 49): its own registration, node id
and lease, the same advertised addresses. A Kafka client keys its connections by node id
(librdkafka, kafka-python and aiokafka alike), so it opens one per node it needs, each to
the same address, and the kernel hands each new connection to one of the processes
(SO_REUSEPORT spreads them by the connections' addresses). Whichever process gets a
connection answers it, whatever node id the client meant: any node answers any request.
One node shared by the processes was the other way: a client would then open one
connection per host, so a client's requests would never use more than one core, and a
process that died would leave the shared registration alive for the others.

The parent binds every process's sockets before any process starts, so a listener that
cannot bind is reported once and nothing is registered; then it forks the processes
(before it has a thread or a database connection) and waits. SIGTERM or SIGINT is passed
to every process; when one ends, the others are stopped too (they live and die
together: whatever restarts the server restarts all of them), and the parent exits 0
only if every process stopped cleanly. On Linux a process whose parent dies is sent
SIGTERM (PR_SET_PDEATHSIG), so none outlives a killed parent.

The listening sockets take SO_REUSEPORT, so another process of the same user that sets
it too could bind the same address; don't start two servers on one port.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import socket
import sys
import traceback
from collections.abc import Callable
from dataclasses import replace
from types import FrameType

from app.server.listener import Endpoint
from app.server.registration import ServeError

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def cores() -> int:
    """The cores this process may run on (``--processes auto``)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def bind_all(
    endpoints: list[Endpoint], count: int
) -> tuple[list[Endpoint], list[list[socket.socket]]]:
    """``count`` listening sockets per endpoint, all on its address with SO_REUSEPORT: the
    endpoints (a listener on port 0 given the port the first bind got, and so advertising
    it if it advertises itself), and each process's sockets in the endpoints' order.
    ServeError, every socket closed, if one cannot bind."""
    bound: list[list[socket.socket]] = [[] for _ in range(count)]
    fixed: list[Endpoint] = []
    try:
        for endpoint in endpoints:
            listener = endpoint.listener
            for sockets in bound:
                sock = _listen(listener.host, listener.port, str(listener))
                sockets.append(sock)
                if listener.port == 0:
                    port = sock.getsockname()[1]
                    node = endpoint.node
                    if (node.host, node.port) == listener.address:
                        node = replace(node, port=port)
                    listener = replace(listener, port=port)
                    endpoint = Endpoint(listener, node)
            fixed.append(endpoint)
    except ServeError:
        for sockets in bound:
            for sock in sockets:
                sock.close()
        raise
    return fixed, bound


def _listen(host: str, port: int, what: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, reuse_port=True)
    except OSError as exc:
        raise ServeError.cannot_listen(what, exc) from exc


def run(count: int, sockets: list[list[socket.socket]], child: Callable[[int], None]) -> int:
    """Fork ``count`` processes, the i-th running ``child(i)`` on ``sockets[i]`` (the others
    closed in it); wait for them as the module says. The exit status: 0 if each process
    stopped cleanly, else 1."""
    parent = os.getpid()
    pids: dict[int, int] = {}
    for i in range(count):
        pid = os.fork()
        if pid == 0:
            _run_child(i, parent, sockets, child)
        pids[pid] = i
    for own in sockets:
        for sock in own:
            sock.close()
    stopping = False

    def stop_all(signum: int = signal.SIGTERM, frame: FrameType | None = None) -> None:
        nonlocal stopping
        stopping = True
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, stop_all)
    signal.signal(signal.SIGINT, stop_all)
    failed = False
    while pids:
        pid, status = os.wait()
        if pid not in pids:
            continue
        i = pids.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        # A process stopped by the SIGTERM passed on before it could take it stopped cleanly.
        if code != 0 and not (stopping and code == -signal.SIGTERM):
            failed = True
            log.error("kip98 serve: process %d (pid %d) ended with status %d", i, pid, code)
        if not stopping:
            stop_all()
    return 1 if failed else 0


def _run_child(
    i: int, parent: int, sockets: list[list[socket.socket]], child: Callable[[int], None]
) -> None:
    """In the i-th process: never returns."""
    code = 0
    try:
        _die_with(parent)
        for j, own in enumerate(sockets):
            if j != i:
                for sock in own:
                    sock.close()
        child(i)
    except ServeError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _die_with(parent: int) -> None:
    """SIGTERM this process when ``parent`` dies (Linux; elsewhere nothing)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError, TypeError):
        return
    if os.getppid() != parent:  # it died before the call
        os.kill(os.getpid(), signal.SIGTERM)
