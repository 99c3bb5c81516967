"""The broker: the one request boundary, as Kafka's KafkaApis.

``Broker.handle(request)`` answers every RPC of ``app.protocol`` (the table is in
``app.broker.apis``). It is a ``BrokerContext`` (the database, clock, settings and
principal every handler runs with), so the libraries beneath take it as they are and never
import this package.
"""

from __future__ import annotations

from app.broker import apis
from app.broker.follower import fetch_from_follower
from app.protocol import FetchRequest, R, Request
from app.storage.context import BrokerContext, principal_from_env

__all__ = ["Broker", "BrokerContext", "principal_from_env"]


class Broker(BrokerContext):
    def handle(self, request: Request[R]) -> R:
        """The response to one request (docs/architecture.md: how a request travels); a
        fetch read on the standby, if the broker has one (``follower``)."""
        if self.replica_engine is not None and isinstance(request, FetchRequest):
            fetched: R = fetch_from_follower(self, request)  # type: ignore[assignment]
            return fetched
        response: R = apis.handle(self, request)
        return response
