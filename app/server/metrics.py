"""What one ``kip98 serve`` process counts, for Prometheus (``--metrics-listen``).

The log's own figures are read from the database by ``kip98 metrics``, the same for
every process; these are this process's alone: the requests it answered, by API, the
connections it closed on bad input, by reason, the requests a handler failed on (answered
with an error code), by API, the SASL logins refused, by mechanism, the connections
open now, and the way each produce, registration and commit was written
(``broker.strategy``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from app.broker import strategy
from app.metrics import labelled

if TYPE_CHECKING:
    from app.server.listener import Server


class ServerCollector:
    """Read at each scrape, so the figures are the server's counters at that moment."""

    def __init__(self, server: Server) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        server = self.server
        yield counted("kip98_server_requests", "Requests answered, by API.", "api", server.requests)
        yield counted(
            "kip98_server_refused",
            "Connections closed on bad input (size, malformed, truncated, failed) or "
            "refused authentication (authentication, unauthenticated), by reason.",
            "reason",
            server.refused,
        )
        yield counted(
            "kip98_server_failed",
            "Requests a handler failed on, answered with an error code, by API.",
            "api",
            server.failed,
        )
        yield counted(
            "kip98_server_authentication_failures",
            "SASL logins refused (a wrong password, an unknown user), by mechanism.",
            "mechanism",
            server.authentication_failures,
        )
        yield GaugeMetricFamily(
            "kip98_server_connections", "Connections open.", value=self.server.connections
        )
        yield write_strategies()


def counted(name: str, documentation: str, label: str, counts: Mapping[str, int]) -> Metric:
    """A counter of one label, a sample per value of ``counts`` in the values' order (the
    same order at every scrape, whatever order the server met them in)."""
    family = CounterMetricFamily(name, documentation, labels=[label])
    return labelled(family, dict(sorted(counts.items())))


def write_strategies() -> CounterMetricFamily:
    """The process's produce, registration and commit requests by the way they were
    written: one query string on remembered rows or under the locks, and whether a
    one-query write was sent, refused by a moved row or declined (docs/design.md §3.9)."""
    family = CounterMetricFamily(
        strategy.METRIC,
        "Produce, registration and commit requests by write strategy and outcome.",
        labels=["request", "strategy", "outcome"],
    )
    for (request, way, outcome), n in sorted(strategy.counts().items()):
        family.add_metric([request, way, outcome], n)
    return family


def expose(server: Server, address: tuple[str, int]) -> None:
    """Serve /metrics over HTTP on ``address``, from a daemon thread."""
    registry = CollectorRegistry()
    registry.register(ServerCollector(server))
    start_http_server(address[1], address[0], registry)
