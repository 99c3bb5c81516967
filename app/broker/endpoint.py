"""The in-process endpoint of the broker: what a client holds to send it requests.

A client of the in-process transport owns a ``Broker`` over its own engine, tagged with
``client.id`` as PostgreSQL's ``application_name``: an admin can then tell clients apart in
``pg_stat_activity`` (and fault-injection tests can terminate exactly one client's
backends), and closing a client releases its connections without touching anyone else's
pool. What a failed request means (retriable or not, which Kafka error) is storage's
knowledge; it is passed on here so clients never import the storage layer.
"""

from __future__ import annotations

from sqlalchemy import Engine, create_engine

from app.broker import Broker, principal_from_env
from app.settings import BrokerSettings
from app.storage.engine import resolve_url
from app.storage.errors import is_retriable, kafka_error, kafka_errors, raise_as_kafka
from app.storage.limits import answer_by, bound_requests, connect_args, request_deadline
from app.storage.liveness import check_on_checkout
from app.storage.replication import watch_commits
from app.storage.stalls import watch_stalls

__all__ = [
    "answer_by",
    "client_broker",
    "client_engine",
    "is_connection_error",
    "kafka_error",
    "kafka_errors",
    "raise_as_kafka",
    "request_deadline",
]

# PostgreSQL truncates application_name to NAMEDATALEN - 1 bytes.
_APPLICATION_NAME_MAX = 63


def client_engine(
    url: str | None, client_id: str | None, settings: BrokerSettings, pool_size: int = 2
) -> Engine:
    """A small pool: a producer needs one connection per sender lane, a consumer one per
    fetch, plus the occasional control request from the caller's thread (``pool_size``
    kept open, more opened when needed and closed after). Its sessions are bounded
    (``app.storage.limits``), and end the sessions of others stopped while they hold a
    lock it waits for (``app.storage.stalls``), so a paused client cannot hold a partition
    for long."""
    args = connect_args(settings)
    if client_id:
        args["application_name"] = client_id.encode()[:_APPLICATION_NAME_MAX].decode(
            errors="ignore"
        )
    engine = create_engine(
        resolve_url(url),
        pool_size=pool_size,
        max_overflow=8,
        pool_recycle=3600,
        connect_args=args,
    )
    # A backend may be gone (terminated, server restarted) while pooled: such a connection
    # costs a reconnect at checkout rather than a failed request.
    # A session stalled by its stopped client, holding a lock this one waits for, is ended.
    # Each commit's wait for the synchronous standbys is bounded and checked.
    return watch_commits(
        watch_stalls(bound_requests(check_on_checkout(engine), settings), settings), settings
    )


def client_broker(
    url: str | None,
    client_id: str | None,
    principal: str | None = None,
    pool_size: int = 2,
    replica_url: str | None = None,
) -> Broker:
    """The broker context of one client; its ``principal`` config wins over KIP98_PRINCIPAL.
    ``replica_url``: a standby its fetches read from (``broker.follower``)."""
    settings = BrokerSettings.from_env()
    replica = None if replica_url is None else client_engine(replica_url, client_id, settings)
    return Broker(
        engine=client_engine(url, client_id, settings, pool_size),
        settings=settings,
        principal=principal or principal_from_env(),
        replica_engine=replica,
    )


def is_connection_error(exc: BaseException) -> bool:
    """Whether a failed request may simply be sent again: the connection lost, the server
    restarting, a bound reached, a conflict that outlasted its retries.

    A lost connection leaves the outcome unknown (the COMMIT may or may not have happened),
    which is safe to retry only because requests are idempotent: an idempotent produce is
    deduplicated by sequence number, and reads change nothing.
    """
    return is_retriable(exc)
