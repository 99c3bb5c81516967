"""The broker: the one request boundary, as Kafka's KafkaApis.

``Broker.handle(request)`` answers every RPC of ``app.protocol`` (the table is in
``app.broker.apis``). It is a ``BrokerContext`` (the database, clock, settings and
principal every handler runs with), so the libraries beneath take it as they are and never
import this package.
"""

from __future__ import annotations

from app.broker import apis
from app.protocol import R, Request
from app.storage.context import BrokerContext, principal_from_env

__all__ = ["Broker", "BrokerContext", "principal_from_env"]


class Broker(BrokerContext):
    def handle(self, request: Request[R]) -> R:
        """The response to one request (docs/architecture.md: how a request travels)."""
        response: R = apis.handle(self, request)
        return response
