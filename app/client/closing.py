"""A client's end: the error it raises when used after ``close()``, and ``with`` closing it.

confluent-kafka raises ``RuntimeError`` there while our contract says every client failure
is a ``KafkaException``; deriving from both keeps either kind of ``except`` working.
"""

from __future__ import annotations

from typing import Any, Self

from app.errors import KafkaError, KafkaException


class ClientClosedError(KafkaException, RuntimeError):
    def __init__(self, what: str) -> None:
        super().__init__(KafkaError(KafkaError._STATE, f"{what} has been closed"))


class Closing:
    """``with Client(...) as c:`` closes ``c`` on the way out, as confluent-kafka's clients
    do; the exception, if any, goes on."""

    def close(self) -> Any:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
