"""How a client retries a request whose outcome a lost connection left unknown.

The transport itself (the client's engine and broker, what a failure means) is the
broker's in-process endpoint, ``app.broker.endpoint``; it is passed on here so the client
modules have one place to import it from.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from app.broker import Broker
from app.broker.endpoint import (
    client_broker,
    is_connection_error,
    kafka_error,
    kafka_errors,
    raise_as_kafka,
    request_deadline,
)
from app.config import ClientConfig
from app.errors import KafkaError, fail

__all__ = [
    "client_broker",
    "configured_broker",
    "is_connection_error",
    "kafka_error",
    "kafka_errors",
    "raise_as_kafka",
    "retry_connection_loss",
]

R = TypeVar("R")


def configured_broker(
    cfg: ClientConfig,
    given: Broker | None,
    pool_size: int = 2,
    replica_url: str | None = None,
) -> tuple[Broker, bool]:
    """A client's broker and whether the client owns it (closes it with itself): the one
    ``given`` (a test's, an embedding's), or its own on ``database.url``, its connections
    named by ``client.id`` (PostgreSQL's application_name), as its ``principal``."""
    if given is not None:
        return given, False
    own = client_broker(
        cfg.get_str("database.url"),
        cfg.get_str("client.id"),
        cfg.get_str("principal"),
        pool_size=pool_size,
        replica_url=replica_url,
    )
    return own, True


def retry_connection_loss(
    call: Callable[[], R],
    deadline: float,
    backoff_s: float,
    code: int = KafkaError._TRANSPORT,
    retry_answer: Callable[[R], KafkaError | None] | None = None,
) -> R:
    """Run ``call`` until the monotonic ``deadline``: again after a retriable database
    failure, and again after an answer ``retry_answer`` calls retriable (e.g.
    CONCURRENT_TRANSACTIONS); past the deadline, a KafkaException with ``code`` saying
    what was last met. Only for requests that are safe to repeat (reads, and writes the
    broker recognises as retries). Any other database failure is raised at once, as its
    KafkaException. The client's one retry loop: every transaction the call begins waits
    no longer than the deadline (``request_deadline``)."""
    while True:
        cause: BaseException | None = None
        try:
            with request_deadline(deadline):
                response = call()
            last = retry_answer(response) if retry_answer is not None else None
            if last is None:
                return response
        except Exception as exc:
            if not is_connection_error(exc):
                raise_as_kafka(exc)
            last, cause = kafka_error(exc), exc
            assert last is not None  # a retriable failure is a database failure
        if time.monotonic() + backoff_s >= deadline:
            raise fail(code, f"gave up: {last.str()}") from cause
        time.sleep(backoff_s)
