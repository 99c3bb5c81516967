"""The error a client raises when used after ``close()``.

confluent-kafka raises ``RuntimeError`` there while our contract says every client failure
is a ``KafkaException``; deriving from both keeps either kind of ``except`` working.
"""

from __future__ import annotations

from app.errors import KafkaError, KafkaException


class ClientClosedError(KafkaException, RuntimeError):
    def __init__(self, what: str) -> None:
        super().__init__(KafkaError(KafkaError._STATE, f"{what} has been closed"))
