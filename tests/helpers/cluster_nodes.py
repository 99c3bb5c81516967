"""Helpers for tests of several ``kip98 serve`` nodes over one database: starting them,
seeing who is live (their registrations, read as any node reads them), and waiting for
a condition rather than for a time."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from app.broker import Broker
from app.protocol import ClusterNode, DescribeClusterRequest
from app.server.process import ServeProcess

T = TypeVar("T")


def wait_until(condition: Callable[[], T], what: str, timeout: float = 120) -> T:
    """``condition()``'s first true value; TimeoutError after ``timeout`` (a hang guard,
    not a bound anything is held to)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def live_nodes(db_url: str) -> list[ClusterNode]:
    return Broker.connect(db_url).handle(DescribeClusterRequest()).nodes


def node_at(db_url: str, serve: ServeProcess) -> ClusterNode | None:
    """The live node registered by ``serve`` (by its port and process id), if any."""
    assert serve.proc is not None
    for node in live_nodes(db_url):
        endpoint = node.endpoint("PLAINTEXT")
        if endpoint is not None and endpoint.port == serve.port and node.pid == serve.proc.pid:
            return node
    return None


def start_registered(db_url: str, serve: ServeProcess) -> int:
    """Start ``serve`` and wait until it is a live node; its node id."""
    serve.start()
    node = wait_until(lambda: node_at(db_url, serve), f"{serve.address} never registered")
    return node.node_id


@contextmanager
def nodes(
    db_url: str, count: int, *args: str, env: dict[str, str] | None = None
) -> Iterator[list[ServeProcess]]:
    """``count`` nodes over ``db_url``, each registered before the next starts (so their ids
    are 0, 1, ...); stopped (and killed if need be) at the end."""
    started = [ServeProcess(db_url, args=args, env=env) for _ in range(count)]
    try:
        for serve in started:
            start_registered(db_url, serve)
        yield started
    finally:
        for serve in started:
            try:
                serve.stop()
            finally:
                serve.kill()


def bootstrap(serves: list[ServeProcess]) -> str:
    return ",".join(s.address for s in serves)
